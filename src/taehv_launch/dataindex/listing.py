"""Listing millions of videos: the parallel folder scan and the annotation files (no torch, no OpenCV).

On a shared filesystem one listing or stat is a network round trip, so the scan lists the folders
of each depth in a thread pool (os.scandir releases the GIL) and an annotation's paths are checked
the same way; a line on stderr every few seconds says how far it got. An annotation file is the
fast path for huge sets: `taehv-launch index DATA_ROOT -o FILE` writes one.

Annotation formats, chosen by the file's extension (the file is UTF-8 text):
  .json   {"list": [{"path": "a/b.mp4", "frame_count": 120}, ...]}   (the seeds' format)
  .jsonl  one {"path": ..., "frame_count": ...} object per line (lines end at \\n only)
  .csv    path[,frame_count] per line (RFC 4180: a path holding a comma, a quote, a line break or
          leading/trailing white space is quoted, "a ""b"", c.mp4"); a first line "path[,frame_count]"
          is a header
  .txt    one path per line (lines end at \\n, or \\r\\n): cannot hold a name with a line break
frame_count is optional everywhere (-1 or absent: unknown). Relative paths are joined to data_root.
JSON, JSON Lines and CSV carry every name a file system allows that is UTF-8 text (tabs, U+2028,
NEL, quotes, commas, leading spaces or dashes), exactly; `taehv-launch index` refuses to write a
name .txt cannot hold, and any name that is not UTF-8 text (OpenCV cannot open such a name: the
index leaves those out, with a warning).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Sequence

from ..errors import DataError, one_line

log = logging.getLogger(__name__)

# camera footage too: .m4v (phones' exports), .mts/.m2ts (AVCHD camcorders), .ts, .mpg/.mpeg, .3gp
VIDEO_EXTENSIONS = (".mp4", ".webm", ".mkv", ".avi", ".mov", ".m4v", ".mts", ".m2ts", ".ts", ".mpg", ".mpeg", ".3gp")
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

MAX_FRAME_COUNT = 2**31 - 1  # the index holds frame counts as int32


def is_utf8(path: str) -> bool:
    """False for a name whose bytes are not UTF-8 (os.fsdecode gives them as surrogate escapes) or a lone
    surrogate from a JSON escape: no file name OpenCV (or NVDEC) can be given; cv2.VideoCapture crashes
    the process on one."""
    if path.isascii():
        return True
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def name_text(path: str) -> str:
    """A path for a one-line message: bytes that are not UTF-8 shown as \\xNN, control characters and
    line breaks escaped (errors.one_line, as `status` shows names)."""
    try:
        path = path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        pass  # a lone surrogate that no file name gave: one_line shows it as \udXXX
    return one_line(path)


def read_annotation(annotation_file: str) -> tuple[list[str], list[int]]:
    """The paths (as written) and frame counts (-1: unknown) an annotation file lists, or one DataError line."""
    ext = os.path.splitext(annotation_file)[1].lower()
    name = name_text(annotation_file)
    try:
        with open(annotation_file, encoding="utf-8", errors="surrogateescape", newline="") as f:
            text = f.read().removeprefix("\ufeff")  # a byte order mark (Windows editors) is no path
    except OSError as err:
        raise DataError(
            f"cannot read annotation_file {name} ({err.strerror or err}): fix the path or permissions"
        ) from None
    if ext == ".json" or ext not in ANNOTATION_FORMATS:
        items = _json_items(name, text)
    elif ext == ".jsonl":
        items = list(_jsonl_items(name, text))
    else:
        items = list(_csv_items(name, text) if ext == ".csv" else _txt_items(text))
    if not items:
        raise DataError(f"annotation_file {name} lists no videos: add entries to it")
    return [p for p, _ in items], [n for _, n in items]


def _shown_json(value) -> str:
    """A JSON value of a file, cut short, for a one-line message."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (ValueError, RecursionError):
        return "a value nested too deeply"
    return one_line(text if len(text) <= 80 else text[:77] + "...")


def _frame_count(value) -> int | None:
    """A listed frame count: -1 (unknown) or 0..MAX_FRAME_COUNT; None for anything else."""
    ok = isinstance(value, int) and not isinstance(value, bool) and -1 <= value <= MAX_FRAME_COUNT
    return value if ok else None


def _item(name: str, where: str, item) -> tuple[str, int]:
    if not (isinstance(item, dict) and isinstance(item.get("path"), str) and item["path"]):
        raise DataError(
            f'annotation_file {name}: {where} is {_shown_json(item)}, expected {{"path": "..."}}: fix the file'
        )
    count = _frame_count(item.get("frame_count", -1))
    if count is None:
        raise DataError(
            f"annotation_file {name}: {where} has frame_count {_shown_json(item['frame_count'])[:40]}, expected a "
            f"whole number from 0 to {MAX_FRAME_COUNT} (or -1: unknown): fix the file"
        )
    return item["path"], count


def _json_items(name: str, text: str) -> list[tuple[str, int]]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(
            f"annotation_file {name} is not valid JSON ({err.msg}, line {err.lineno}): "
            f"fix the file (or name it .jsonl, .csv or .txt for those formats)"
        ) from None
    except RecursionError:
        raise DataError(f'annotation_file {name} nests too deeply: write {{"list": [{{"path": ...}}, ...]}}') from None
    items = doc.get("list") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise DataError(
            f"annotation_file {name} must be "
            f'{{"list": [{{"path": "relative/or/absolute.mp4"}}, ...]}}: no "list" array found'
        )
    return [_item(name, f"entry {i}", item) for i, item in enumerate(items)]


def _jsonl_items(name: str, text: str) -> Iterator[tuple[str, int]]:
    for n, line in enumerate(text.split("\n"), 1):  # not splitlines(): a name may hold U+2028, NEL, \f ...
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"annotation_file {name}: line {n} is not valid JSON ({err.msg}): fix the file") from None
        except RecursionError:
            raise DataError(f'annotation_file {name}: line {n} nests too deeply: write {{"path": ...}}') from None
        yield _item(name, f"line {n}", item)


def _csv_items(name: str, text: str) -> Iterator[tuple[str, int]]:
    rows = csv.reader(io.StringIO(text))
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except csv.Error as err:
            raise DataError(
                f"annotation_file {name}: line {rows.line_num} is not CSV ({one_line(str(err))}): quote a path "
                f'that holds a comma, a quote or a line break ("a, b.mp4"), or write the list as .jsonl'
            ) from None
        n = rows.line_num
        if not row or not row[0].strip() or (n == 1 and row[0].strip().lower() == "path"):
            continue
        cell = row[1].strip() if len(row) > 1 else ""
        try:
            count = int(cell) if cell else -1
        except ValueError:
            count = None
        if _frame_count(count) is None:
            raise DataError(
                f"annotation_file {name}: line {n} has frame count {one_line(repr(cell[:40]))}, expected a whole "
                f"number from 0 to {MAX_FRAME_COUNT} (or empty: unknown): write path[,frame_count] per line"
            )
        yield row[0], count


def _txt_items(text: str) -> Iterator[tuple[str, int]]:
    for line in text.split("\n"):  # not splitlines(): a name may hold U+2028, NEL, \f ...
        line = line.removesuffix("\r")  # a file saved with CRLF line ends
        if line.strip():
            yield line, -1


# what a JSON writer leaves raw but line-splitting readers (str.splitlines, JavaScript) break at, and
# lone surrogates (not UTF-8): written as \uXXXX escapes, which every JSON reader decodes back
_JSON_ESCAPES = {c: f"\\u{c:04x}" for c in (0x85, 0x2028, 0x2029, *range(0xD800, 0xE000))}
_CSV_QUOTED = re.compile(r'[,"\r\n]|^\s|\s$')  # fields quoted (RFC 4180, and white space at an end)


def _json(value) -> str:
    return json.dumps(value, ensure_ascii=False).translate(_JSON_ESCAPES)


def _csv_field(text: str) -> str:
    return '"' + text.replace('"', '""') + '"' if _CSV_QUOTED.search(text) else text


def unfit(fmt: str, path: str) -> str:
    """Why an annotation file of format fmt cannot hold this path exactly ('' when it can)."""
    if fmt == ".txt" and ("\n" in path or "\r" in path):
        return "a line break in the name, and .txt is one path per line"
    return ""


def annotation_text(fmt: str, paths: Sequence[str], counts: Sequence[int] | None = None) -> str:
    """An annotation file of these paths in format fmt (.json, .jsonl, .csv or .txt) that read_annotation
    reads back exactly (DataError for a path the format cannot hold: see unfit)."""
    counts = counts if counts is not None else [-1] * len(paths)
    bad = next((p for p in paths if unfit(fmt, p)), None)
    if bad is not None:
        raise DataError(f"{fmt} cannot hold {name_text(bad)}: {unfit(fmt, bad)}: write .csv, .jsonl or .json")
    if fmt == ".json":
        return (
            _json({"list": [{"path": p, **({"frame_count": n} if n >= 0 else {})} for p, n in zip(paths, counts)]})
            + "\n"
        )
    if fmt == ".jsonl":
        return "".join(
            _json({"path": p, **({"frame_count": n} if n >= 0 else {})}) + "\n" for p, n in zip(paths, counts)
        )
    if fmt == ".txt":
        return "".join(p + "\n" for p in paths)
    if any(n >= 0 for n in counts):
        rows = [f"{_csv_field(p)},{n if n >= 0 else ''}\n" for p, n in zip(paths, counts)]
        return "path,frame_count\n" + "".join(rows)
    return "path\n" + "".join(_csv_field(p) + "\n" for p in paths)
