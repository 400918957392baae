"""The latent cache's view list as flat arrays, so forked DataLoader workers do not copy it.

A cache of 3 million videos x 4 views is 12 million views; as (shard, dict) pairs that is ~1 KB
of Python objects per view, and every read in a worker writes reference counts (the pages get
copied, as with the video index: flat.py). Here each field is one numpy array, the video
paths a FlatIndex of the distinct videos, and `table[j]` builds the (shard name, record) pair the
dataset reads, the same dict the shard's .json index holds.
"""

from __future__ import annotations

from array import array
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from .flat import FlatIndex


class ViewTable(Sequence):
    """j -> (shard name, {"video", "view", "bytes", "frames", "crop", "seek", "row", "crc32"})."""

    def __init__(self) -> None:
        self.shards: list[str] = []
        self._shard_ids: dict[str, int] = {}
        self._video_ids: dict[str, int] = {}
        self._cols = {
            k: array(t)
            for k, t in (
                ("shard", "i"),
                ("video", "i"),
                ("view", "i"),
                ("bytes", "q"),
                ("row", "i"),
                ("crc32", "q"),
                ("seek", "b"),
                ("crop", "i"),
                ("frames", "i"),
            )
        }
        self._frame_ends = array("q")
        self.videos: FlatIndex | None = None
        self.a: dict[str, np.ndarray] = {}

    @classmethod
    def of(cls, views: Iterable[tuple[str, dict[str, Any]]]) -> ViewTable:
        table = cls()
        for shard, rec in views:
            table.add(shard, rec)
        return table.freeze()

    def add(self, shard: str, rec: dict[str, Any]) -> None:
        """One stored view (a record with a "row") of shard `shard`."""
        assert self.videos is None, "add after freeze"
        c = self._cols
        c["shard"].append(self._shard_ids.setdefault(shard, len(self._shard_ids)))
        if len(self._shard_ids) > len(self.shards):
            self.shards.append(shard)
        c["video"].append(self._video_ids.setdefault(rec["video"], len(self._video_ids)))
        for key in ("view", "bytes", "row", "crc32"):
            c[key].append(int(rec[key]))
        c["seek"].append(bool(rec["seek"]))
        y, x, h, w, flip = rec["crop"]
        c["crop"].extend((int(y), int(x), int(h), int(w), int(bool(flip))))
        c["frames"].extend(int(f) for f in rec["frames"])
        self._frame_ends.append(len(c["frames"]))

    def freeze(self) -> ViewTable:
        """The arrays become numpy arrays and the distinct videos a FlatIndex (in first-seen order)."""
        names = list(self._video_ids)
        self.videos = FlatIndex.from_paths(names)
        self.a = {
            k: np.frombuffer(v, dtype=np.dtype(v.typecode)).copy() if len(v) else np.zeros(0, np.dtype(v.typecode))
            for k, v in self._cols.items()
        }
        ends = np.frombuffer(self._frame_ends, np.int64) if len(self._frame_ends) else np.zeros(0, np.int64)
        self.a["frame_offsets"] = np.concatenate([[0], ends]).astype(np.int64)
        self._cols, self._video_ids, self._frame_ends = {}, {}, array("q")
        return self

    def __len__(self) -> int:
        return len(self.a["shard"]) if self.videos is not None else len(self._cols["shard"])

    def __getitem__(self, j):
        if isinstance(j, slice):
            return ViewTable.of(self[k] for k in range(*j.indices(len(self))))
        n = len(self)
        j = int(j) + (n if int(j) < 0 else 0)
        if not 0 <= j < n:
            raise IndexError(f"view {j} out of range for {n} views")
        a = self.a
        lo, hi = int(a["frame_offsets"][j]), int(a["frame_offsets"][j + 1])
        y, x, h, w, flip = (int(v) for v in a["crop"][5 * j : 5 * j + 5])
        rec = {
            "video": self.videos.path(int(a["video"][j])),
            "view": int(a["view"][j]),
            "bytes": int(a["bytes"][j]),
            "frames": a["frames"][lo:hi].tolist(),
            "crop": [y, x, h, w, bool(flip)],
            "seek": bool(a["seek"][j]),
            "row": int(a["row"][j]),
            "crc32": int(a["crc32"][j]),
        }
        return self.shards[int(a["shard"][j])], rec

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for j in range(len(self)):
            yield self[j]

    def video_names(self) -> set[str]:
        """The distinct videos (paths under data_root) the table has views of."""
        return {self.videos.path(i) for i in range(len(self.videos))}

    def nbytes(self) -> int:
        return sum(v.nbytes for v in self.a.values()) + self.videos.nbytes()


def as_table(views: Sequence[tuple[str, dict[str, Any]]]) -> ViewTable:
    return views if isinstance(views, ViewTable) else ViewTable.of(views)
