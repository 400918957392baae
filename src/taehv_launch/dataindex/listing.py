"""Listing millions of videos: the parallel folder scan and the annotation files (no torch, no OpenCV).

On a shared filesystem one listing or stat is a network round trip, so the scan lists the folders
of each depth in a thread pool (os.scandir releases the GIL) and an annotation's paths are checked
the same way; a line on stderr every few seconds says how far it got. An annotation file is the
fast path for huge sets: `taehv-launch index DATA_ROOT -o FILE` writes one.

Annotation formats, chosen by the file's extension:
  .json   {"list": [{"path": "a/b.mp4", "frame_count": 120}, ...]}   (the seeds' format)
  .jsonl  one {"path": ..., "frame_count": ...} object per line
  .csv    path[,frame_count] per line; a first line "path[,frame_count]" is a header
  .txt    one path per line
frame_count is optional everywhere (-1 or absent: unknown). Relative paths are joined to data_root.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Sequence

from ..errors import DataError

log = logging.getLogger(__name__)

VIDEO_EXTENSIONS = (".mp4", ".webm", ".mkv", ".avi", ".mov")
ANNOTATION_FORMATS = (".json", ".jsonl", ".csv", ".txt")
THREADS = 32  # listings in flight: a shared filesystem answers many at once
PROGRESS_S = 5.0  # seconds between progress lines


class Progress:
    """A line on stderr every `every` seconds while work runs (none for work shorter than that)."""

    def __init__(self, what: str, every: float = PROGRESS_S, out: Callable[[str], None] | None = None):
        self.what, self.every, self.count, self.folders = what, every, 0, 0
        self.out = out or (lambda line: print(line, file=sys.stderr, flush=True))
        self.start, self._stop = time.monotonic(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        took = time.monotonic() - self.start
        if took >= self.every and exc[0] is None:
            self.out(f"{self.what}: {self.count:,} files in {took:.1f} s ({self.count / max(took, 1e-9):,.0f} files/s)")

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            took = time.monotonic() - self.start
            folders = f" in {self.folders:,} folders" if self.folders else ""
            self.out(f"{self.what}: {self.count:,} files so far{folders} ({self.count / took:,.0f} files/s)")


def _list_folder(folder: str) -> tuple[str, list[str], list[str]]:
    """(real path, video files, subfolders) of one folder; a folder that cannot be listed is empty."""
    files, subdirs = [], []
    try:
        with os.scandir(folder) as it:
            for entry in it:
                if entry.is_dir():
                    subdirs.append(entry.path)
                elif entry.is_file() and entry.name.lower().endswith(VIDEO_EXTENSIONS):
                    files.append(entry.path)
    except OSError as err:
        log.warning("cannot list %s (%s); skipping it", folder, err)
    return os.path.realpath(folder), files, subdirs


def scan(root: str, threads: int = THREADS, progress_s: float = PROGRESS_S, parallel: bool | None = None) -> list[str]:
    """Every file with a video extension under root (recursive, symlinks followed once), sorted.

    Directories are never entries, even when named like a video (x.mp4/). The folders of one depth
    are listed together (in a thread pool when the filesystem is slow: see _list_level); a folder
    reached twice (a symlink) counts once, the first in sorted order of the shallowest depth.
    parallel: True/False forces the pool on or off (None: decided per depth)."""
    found: list[str] = []
    seen: set[str] = set()
    level = [root]
    with Progress(f"index: listing {root}", progress_s) as progress, ThreadPoolExecutor(threads) as pool:
        while level:
            nxt: list[str] = []
            for real, files, subdirs in _list_level(pool, sorted(level), parallel):
                if real in seen:
                    continue
                seen.add(real)
                found.extend(files)
                nxt.extend(subdirs)
                progress.count, progress.folders = len(found), len(seen)
            level = nxt
    return sorted(found)


SAMPLE = 8  # folders of a depth listed one by one first, to see where the time goes


def _list_level(
    pool: ThreadPoolExecutor, folders: list[str], parallel: bool | None
) -> Iterator[tuple[str, list[str], list[str]]]:
    """The listings of `folders`, in order. The first few are listed here; if most of their time was
    spent waiting on the filesystem (CPU time under half the wall time: a network filesystem), the
    rest go to the thread pool, which overlaps the waits; else (a local or cached disk, where threads
    only contend for the GIL: measured 1.5-2x slower) they are listed here too."""
    sample = SAMPLE if parallel is None else 0
    wall, cpu = time.perf_counter(), time.process_time()
    for folder in folders[:sample]:
        yield _list_folder(folder)
    rest = folders[sample:]
    if not rest:
        return
    waiting = parallel if parallel is not None else time.process_time() - cpu < 0.5 * (time.perf_counter() - wall)
    yield from (pool.map(_list_folder, rest) if waiting else map(_list_folder, rest))


def existing(
    paths: Sequence[str], threads: int = THREADS, progress_s: float = PROGRESS_S, parallel: bool | None = None
) -> list[bool]:
    """os.path.isfile of every path: in a thread pool, a chunk per task, when the first checks show the
    filesystem is slow (as in _list_level; on a local disk threads made this 3.5x slower)."""

    def check(chunk: Sequence[str]) -> list[bool]:
        return [os.path.isfile(p) for p in chunk]

    sample = 256 if parallel is None else 0
    with Progress("index: checking the listed files", progress_s) as progress:
        wall, cpu = time.perf_counter(), time.process_time()
        out = check(paths[:sample])
        waiting = parallel if parallel is not None else time.process_time() - cpu < 0.5 * (time.perf_counter() - wall)
        chunks = [paths[k : k + 4096] for k in range(sample, len(paths), 4096)]
        with ThreadPoolExecutor(threads if waiting else 1) as pool:
            for part in pool.map(check, chunks) if waiting else map(check, chunks):
                out.extend(part)
                progress.count = len(out)
    return out


# --- annotation files -----------------------------------------------------------------------


def read_annotation(annotation_file: str) -> tuple[list[str], list[int]]:
    """The paths (as written) and frame counts (-1: unknown) an annotation file lists, or one DataError line."""
    ext = os.path.splitext(annotation_file)[1].lower()
    try:
        with open(annotation_file, encoding="utf-8", errors="surrogateescape", newline="") as f:
            text = f.read()
    except OSError as err:
        raise DataError(f"cannot read annotation_file {annotation_file} ({err}): fix the path or permissions") from None
    if ext == ".json" or ext not in ANNOTATION_FORMATS:
        items = _json_items(annotation_file, text)
    elif ext == ".jsonl":
        items = list(_jsonl_items(annotation_file, text))
    else:
        items = list(_csv_items(annotation_file, text) if ext == ".csv" else _txt_items(text))
    if not items:
        raise DataError(f"annotation_file {annotation_file} lists no videos: add entries to it")
    return [p for p, _ in items], [n for _, n in items]


def _item(annotation_file: str, where: str, item) -> tuple[str, int]:
    if not (isinstance(item, dict) and isinstance(item.get("path"), str) and item["path"]):
        raise DataError(
            f"annotation_file {annotation_file}: {where} is {json.dumps(item)[:80]}, "
            f'expected {{"path": "..."}}: fix the file'
        )
    count = item.get("frame_count", -1)
    if not isinstance(count, int) or isinstance(count, bool):
        raise DataError(
            f"annotation_file {annotation_file}: {where} has frame_count {json.dumps(count)[:40]}, "
            f"expected a whole number: fix the file"
        )
    return item["path"], count


def _json_items(annotation_file: str, text: str) -> list[tuple[str, int]]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(
            f"annotation_file {annotation_file} is not valid JSON ({err.msg}, line {err.lineno}): "
            f"fix the file (or name it .jsonl, .csv or .txt for those formats)"
        ) from None
    items = doc.get("list") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise DataError(
            f"annotation_file {annotation_file} must be "
            f'{{"list": [{{"path": "relative/or/absolute.mp4"}}, ...]}}: no "list" array found'
        )
    return [_item(annotation_file, f"entry {i}", item) for i, item in enumerate(items)]


def _jsonl_items(annotation_file: str, text: str) -> Iterator[tuple[str, int]]:
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(
                f"annotation_file {annotation_file}: line {n} is not valid JSON ({err.msg}): fix the file"
            ) from None
        yield _item(annotation_file, f"line {n}", item)


def _csv_items(annotation_file: str, text: str) -> Iterator[tuple[str, int]]:
    for n, row in enumerate(csv.reader(io.StringIO(text)), 1):
        if not row or not row[0].strip() or (n == 1 and row[0].strip().lower() == "path"):
            continue
        count = row[1].strip() if len(row) > 1 else ""
        try:
            yield row[0], int(count) if count else -1
        except ValueError:
            raise DataError(
                f"annotation_file {annotation_file}: line {n} has frame count {count[:40]!r}, expected "
                f"a whole number: write path[,frame_count] per line"
            ) from None


def _txt_items(text: str) -> Iterator[tuple[str, int]]:
    for line in text.splitlines():
        if line.strip():
            yield line.rstrip("\r"), -1


def annotation_text(fmt: str, paths: Sequence[str], counts: Sequence[int] | None = None) -> str:
    """An annotation file of these paths in format fmt (.json, .jsonl, .csv or .txt)."""
    counts = counts if counts is not None else [-1] * len(paths)
    if fmt == ".json":
        return (
            json.dumps(
                {"list": [{"path": p, **({"frame_count": n} if n >= 0 else {})} for p, n in zip(paths, counts)]},
                ensure_ascii=False,
            )
            + "\n"
        )
    if fmt == ".jsonl":
        return "".join(
            json.dumps({"path": p, **({"frame_count": n} if n >= 0 else {})}, ensure_ascii=False) + "\n"
            for p, n in zip(paths, counts)
        )
    if fmt == ".txt":
        return "".join(p + "\n" for p in paths)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    if any(n >= 0 for n in counts):
        writer.writerow(["path", "frame_count"])
        writer.writerows([p, n if n >= 0 else ""] for p, n in zip(paths, counts))
    else:
        writer.writerow(["path"])
        writer.writerows([p] for p in paths)
    return out.getvalue()
