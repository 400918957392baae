"""The video index as three flat numpy arrays, so forked DataLoader workers do not copy it.

A Python list of N entry objects costs ~290 bytes per video and, worse, every read of an entry
writes its reference count: each forked worker then copies every page it touches (~156 MB per
worker per million videos, measured). Here the paths are one uint8 buffer (UTF-8, relative to a
shared prefix) with int64 offsets, and the frame counts one int32 array: a read touches no
Python object of the index, so the pages stay shared. `FlatIndex[i]` builds a fresh VideoEntry.

On disk (the index cache) the same arrays go in one .npz, read back without pickle.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import numpy as np


@dataclass(frozen=True)
class VideoEntry:
    """One video file: its absolute path and the container's frame count (-1 = unknown)."""

    path: str
    frame_count: int = -1


def _encode(path: str) -> bytes:
    return path.encode("utf-8", "surrogateescape")  # os.scandir gives undecodable names as surrogates


class FlatIndex(Sequence):
    """Entries i -> VideoEntry(prefix + paths[i], counts[i]); `rows` selects a subset (a split)."""

    missing: int = 0  # listed files that do not exist (annotation files)
    cache_path: str = ""
    from_cache: bool = False
    sources = None  # sources.SourceSample of the whole index (build_index), shared by its subsets

    def __init__(
        self, prefix: str, buf: np.ndarray, offsets: np.ndarray, counts: np.ndarray, rows: np.ndarray | None = None
    ):
        assert buf.dtype == np.uint8 and offsets.dtype == np.int64 and counts.dtype == np.int32, (
            buf.dtype,
            offsets.dtype,
            counts.dtype,
        )
        assert len(offsets) == len(counts) + 1, (len(offsets), len(counts))
        self.prefix, self.buf, self.offsets, self.counts, self.rows = prefix, buf, offsets, counts, rows

    # --- making one ---------------------------------------------------------------------------

    @classmethod
    def from_paths(cls, paths: Sequence[str], counts: Iterable[int] | None = None) -> FlatIndex:
        """Absolute paths (and frame counts, -1 = unknown) -> a FlatIndex; the common folder is stored once."""
        n = len(paths)
        prefix = _common_prefix(paths)
        cut = len(prefix)
        encoded = [_encode(p[cut:]) for p in paths]
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(np.fromiter(map(len, encoded), np.int64, count=n), out=offsets[1:])
        buf = np.frombuffer(b"".join(encoded), np.uint8) if n else np.zeros(0, np.uint8)
        frames = np.full(n, -1, np.int32) if counts is None else np.fromiter(counts, np.int32, count=n)
        return cls(prefix, buf, offsets, frames)

    @classmethod
    def from_entries(cls, entries: Iterable[VideoEntry | str]) -> FlatIndex:
        items = [e if isinstance(e, VideoEntry) else VideoEntry(str(e)) for e in entries]
        return cls.from_paths([e.path for e in items], [e.frame_count for e in items])

    def take(self, positions: Sequence[int] | np.ndarray) -> FlatIndex:
        """The entries at these positions (of this index), sharing the arrays."""
        pos = np.asarray(positions, dtype=np.int64)
        rows = pos if self.rows is None else self.rows[pos]
        if len(self.counts) < 2**31:
            rows = rows.astype(np.int32)  # 4 bytes per entry of a split, not 8
        sub = FlatIndex(self.prefix, self.buf, self.offsets, self.counts, rows)
        sub.missing, sub.sources = self.missing, self.sources
        return sub

    # --- the Sequence -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.counts) if self.rows is None else len(self.rows)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.take(np.arange(len(self))[i])
        n = len(self)
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {i} out of range for {n} videos")
        return VideoEntry(self.path(i), int(self.counts[self._row(i)]))

    def _row(self, i: int) -> int:
        return i if self.rows is None else int(self.rows[i])

    def path(self, i: int) -> str:
        """The absolute path of entry i (0 <= i < len)."""
        r = self._row(i)
        return self.prefix + self.buf[self.offsets[r] : self.offsets[r + 1]].tobytes().decode(
            "utf-8", "surrogateescape"
        )

    def relative_bytes(self, chunk: int = 1 << 16) -> Iterator[bytes]:
        """Each entry's path after `prefix`, as UTF-8 bytes, in order: a fast pass for hashing every path
        (slices of plain bytes, a chunk of offsets at a time)."""
        for lo in range(0, len(self), chunk):
            rows = np.arange(lo, min(lo + chunk, len(self))) if self.rows is None else self.rows[lo : lo + chunk]
            starts, ends = self.offsets[rows].tolist(), self.offsets[rows + 1].tolist()
            a, b = (min(starts), max(ends)) if starts else (0, 0)
            data = self.buf[a:b].tobytes()
            yield from (data[s - a : e - a] for s, e in zip(starts, ends))

    def __iter__(self) -> Iterator[VideoEntry]:
        for i in range(len(self)):
            yield self[i]

    def __eq__(self, other) -> bool:
        if not isinstance(other, Sequence) or len(other) != len(self):
            return False
        return all(a == b for a, b in zip(self, other))

    __hash__ = None

    def __repr__(self) -> str:
        return f"FlatIndex({len(self)} videos under {self.prefix or '/'})"

    def nbytes(self) -> int:
        """Bytes held by the arrays (shared by the subsets made by take/slicing)."""
        return (
            self.buf.nbytes + self.offsets.nbytes + self.counts.nbytes + (0 if self.rows is None else self.rows.nbytes)
        )

    # --- on disk ------------------------------------------------------------------------------

    def save(self, file, meta: dict) -> None:
        """Write the arrays and a JSON-able meta dict to an open binary file (.npz, no pickle)."""
        assert self.rows is None, "save the full index, not a subset"
        doc = {**meta, "prefix": self.prefix, "missing": self.missing}
        np.savez(
            file,
            buf=self.buf,
            offsets=self.offsets,
            counts=self.counts,
            meta=np.frombuffer(json.dumps(doc).encode(), np.uint8),
        )

    @classmethod
    def load(cls, path: str) -> tuple[FlatIndex, dict]:
        """(index, meta) from a file written by save; raises OSError/ValueError/KeyError if it is not one."""
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(z["meta"].tobytes().decode())
            index = cls(str(meta["prefix"]), z["buf"], z["offsets"], z["counts"])
        index.missing = int(meta.get("missing", 0))
        return index, meta


def as_flat(entries: Sequence[VideoEntry | str]) -> FlatIndex:
    """A FlatIndex as is; a list of VideoEntry or paths converted."""
    return entries if isinstance(entries, FlatIndex) else FlatIndex.from_entries(entries)


def _common_prefix(paths: Sequence[str]) -> str:
    """The folder (ending in os.sep) every path starts with, '' if none; the first and last sorted
    paths bound it, so this is O(N) in comparisons without sorting."""
    if not paths:
        return ""
    lo, hi = min(paths), max(paths)
    k = 0
    for a, b in zip(lo, hi):
        if a != b:
            break
        k += 1
    cut = lo[:k].rfind(os.sep)
    return lo[: cut + 1] if cut >= 0 else ""
