"""The dataset index and the train/validation split.

Datasets may hold millions of files and some of them are broken, so `build_index` lists files
once (stat only, never decoding) and caches it as an .npz of flat arrays (flat.py) that every
rank and every later run reuses; `split_train_val` holds out a deterministic share for validation.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import json
import logging
import os
from typing import Callable, Sequence

import numpy as np

from ..errors import DataError
from .flat import FlatIndex, VideoEntry, as_flat
from .listing import VIDEO_EXTENSIONS, existing, is_utf8, name_text, read_annotation, scan
from .sources import SourceSample, read_sources, sample_sources, sources_path, write_sources

log = logging.getLogger(__name__)

INDEX_VERSION = 3  # 3: names that are not UTF-8 left out; 2: flat arrays in an .npz (1: JSON list)

# --- the index --------------------------------------------------------------------------

VideoIndex = FlatIndex  # the index type build_index returns (flat arrays: see flat.py)


def build_index(
    data_root: str,
    annotation_file: str = "",
    cache_dir: str = "",
    *,
    probe_frame_counts: Callable[[str], int] | None = None,
    read_only: bool = False,
) -> VideoIndex:
    """List the videos of data_root (or of annotation_file) once; cache the list in cache_dir.

    The cache key is (data_root, annotation_file, its mtime and size); without an annotation
    file the scan is keyed on data_root's own mtime, which catches files added at the top
    level only: delete the cache file to rescan after changes deeper down. Only stat() is
    used; probe_frame_counts (a function of a path, e.g. train.data.decode.header_frame_count) also opens
    each file to read the container's frame count (a hint; the dataset reads it anyway when it opens a
    file, so it is off by default).
    read_only=True reads the cache file but writes nothing: keep_index(index) writes it later.
    With a cache_dir (and not read_only), a sample of the sources is probed once and kept beside the cache
    file (sources.py): the index's `sources`, read by the GPU decoder's thread choice and the dry run.
    """
    root = check_root(data_root, annotation_file)
    key = index_key(root, annotation_file, probe_frame_counts is not None)
    if not cache_dir:
        return _make_index(root, annotation_file, probe_frame_counts)
    cache_path = os.path.join(cache_dir, f"index-{index_name(key)}.npz")
    cached = _read_index(cache_path, key)
    if cached is not None:
        return with_sources(cached) if not read_only else cached
    if read_only:
        index = _make_index(root, annotation_file, probe_frame_counts)
        index.pending = (cache_path, key)
        return index
    with exclusive_lock(cache_path + ".lock"):
        cached = _read_index(cache_path, key)  # another rank may have built it while we waited
        if cached is not None:
            return cached
        index = _make_index(root, annotation_file, probe_frame_counts)
        _write_index(cache_path, key, index)
    index.cache_path = cache_path
    return with_sources(index)


def with_sources(index: FlatIndex) -> FlatIndex:
    """The index with its `sources`: the record beside its cache file, or a sample probed now and kept there
    (where the folder is writable)."""
    if index.sources is None:
        where = sources_path(index.cache_path) if index.cache_path else ""
        index.sources = read_sources(where) if where else None
        if index.sources is None:  # none yet, or damaged: probed again and (re)written
            index.sources = sample_sources(index.path, len(index))
            if where:
                write_sources(where, index.sources)
    return index


def cached_sources(data_root: str, annotation_file: str, cache_dir: str) -> tuple[SourceSample | None, str]:
    """The sources record of this dataset's index cache, without listing or opening any video: (record,
    its path), or (None, why not) when no index of this dataset was cached with one yet."""
    try:
        root = check_root(data_root, annotation_file)
        name = index_name(index_key(root, annotation_file, False))
    except (DataError, OSError):
        return None, "the data is not there to look up"
    where = sources_path(os.path.join(cache_dir, f"index-{name}.npz"))
    got = read_sources(where)
    return (got, where) if got is not None else (None, "no index cache with a sources record yet")


def keep_index(index: FlatIndex) -> None:
    """Write the cache file of an index that build_index(read_only=True) listed (if no one has since)."""
    pending = getattr(index, "pending", None)
    if not pending:
        return
    cache_path, key = pending
    with exclusive_lock(cache_path + ".lock"):
        if _read_index(cache_path, key) is None:
            _write_index(cache_path, key, index)
    index.pending, index.cache_path = None, cache_path


def check_root(data_root: str, annotation_file: str) -> str:
    """The absolute data root; relative annotation paths are joined to it (or to the file's folder)."""
    if annotation_file and not os.path.isfile(annotation_file):
        raise DataError(
            f"annotation_file {name_text(annotation_file)} not found: fix the path, or set "
            f"annotation_file='' to use every video under data_root"
        )
    if not data_root:
        if annotation_file:
            return os.path.dirname(os.path.abspath(annotation_file))
        raise DataError("data_root is empty: set data_root to a folder of videos")
    if not os.path.exists(data_root):
        raise DataError(f"data_root {name_text(data_root)} does not exist: set data_root to a folder of videos")
    if not os.path.isdir(data_root):
        raise DataError(
            f"data_root {name_text(data_root)} is not a folder: set data_root to the folder that holds the videos"
        )
    return os.path.abspath(data_root)


def index_name(key: dict) -> str:
    """The 16 hex digits that name an index cache file (index-<this>.npz): the key's hash; also the
    data index fingerprint in a run's manifest."""
    return hashlib.sha1(json.dumps(key).encode()).hexdigest()[:16]


def index_key(root: str, annotation_file: str, probe: bool) -> dict:
    """What the cached index depends on; any change means a new cache file."""
    key = {"version": INDEX_VERSION, "data_root": root, "probe": probe}
    if annotation_file:
        st = os.stat(annotation_file)
        key.update(annotation_file=os.path.abspath(annotation_file), mtime_ns=st.st_mtime_ns, size=st.st_size)
    else:
        key.update(root_mtime_ns=os.stat(root).st_mtime_ns)
    return key


def _make_index(root: str, annotation_file: str, probe: Callable[[str], int] | None) -> FlatIndex:
    if annotation_file:
        paths, counts, missing = _annotated_paths(root, annotation_file)
    else:
        paths, counts, missing = _openable(scan(root), None, f"under {name_text(root)}"), None, 0
        if not paths:
            raise DataError(
                f"no video files ({' '.join(VIDEO_EXTENSIONS)}) under {name_text(root)}: point data_root at "
                f"your videos or give an annotation_file"
            )
    if probe is not None:
        counts = [probe(p) for p in paths]
    index = FlatIndex.from_paths(paths, counts)
    index.missing = missing
    return index


def _openable(paths: list[str], counts: list[int] | None, where: str) -> list[str]:
    """The paths whose names are UTF-8 text: OpenCV cannot be given any other (cv2.VideoCapture crashes
    the process on one), so the rest are left out with a warning, or one DataError line if that is all.
    counts (if given) is filtered in place alike."""
    bad = [k for k, p in enumerate(paths) if not is_utf8(p)]
    if not bad:
        return paths
    what = f"{len(bad)} of {len(paths)} videos {where} have names that are not UTF-8 text (e.g. {name_text(paths[bad[0]])})"
    if len(bad) == len(paths):
        raise DataError(f"{what}, which OpenCV cannot open: rename them to UTF-8 names")
    log.warning("%s and are left out: OpenCV cannot open such names; rename them to UTF-8 names", what)
    left = set(bad)
    if counts is not None:
        counts[:] = [n for k, n in enumerate(counts) if k not in left]
    return [p for k, p in enumerate(paths) if k not in left]


def _annotated_paths(root: str, annotation_file: str) -> tuple[list[str], list[int], int]:
    """The existing files listed in annotation_file, their listed frame counts, and how many are missing."""
    listed, listed_counts = read_annotation(annotation_file)
    name = name_text(annotation_file)
    listed = _openable(listed, listed_counts, f"listed in {name}")
    paths = [os.path.normpath(os.path.join(root, p)) for p in listed]
    there = existing(paths)
    kept = [k for k, ok in enumerate(there) if ok]
    missing = len(paths) - len(kept)
    if not kept:
        raise DataError(
            f"none of the {len(paths)} videos listed in {name} exist (e.g. {name_text(paths[0])}): "
            f"relative paths are joined to data_root={name_text(root)}; fix data_root or the file"
        )
    if missing:
        first = paths[there.index(False)]
        log.warning(
            "%d of %d videos listed in %s do not exist and are left out (e.g. %s)",
            missing,
            len(paths),
            name,
            name_text(first),
        )
    return [paths[k] for k in kept], [listed_counts[k] for k in kept], missing


def _read_index(cache_path: str, key: dict) -> FlatIndex | None:
    """The cached index if the file exists, parses and was made for this key; else None."""
    try:
        index, meta = FlatIndex.load(cache_path)
        if meta.get("key") != key:
            return None
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        return None
    index.cache_path, index.from_cache = cache_path, True
    return index


def _write_index(cache_path: str, key: dict, index: FlatIndex) -> None:
    """Write the index atomically (tmp file + os.replace); a read-only cache dir only warns."""
    tmp = f"{cache_path}.tmp-{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(cache_path), exist_ok=True)
        with open(tmp, "wb") as f:
            index.save(f, {"key": key})
        os.replace(tmp, cache_path)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        log.warning("cannot cache the video index in %s (%s); every rank will rescan", cache_path, err)


@contextlib.contextmanager
def exclusive_lock(lock_path: str):
    """Exclusive fcntl lock, so one process builds (the index, the demo assets) while the others
    wait; a no-op if it cannot be taken (the atomic renames behind it are still safe)."""
    try:
        import fcntl

        os.makedirs(os.path.dirname(lock_path), exist_ok=True)
        handle = open(lock_path, "a")
    except (ImportError, OSError):
        yield
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:  # e.g. a filesystem without locks: the atomic write is still safe
            pass
        yield


def index_dir(cfg) -> str:
    """Where a run's index is cached: index_cache_dir, else <output_dir>/.index."""
    return str(cfg.index_cache_dir or os.path.join(os.path.expanduser(cfg.output_dir), ".index"))


def index_once(cfg, accelerator) -> VideoIndex:
    """The run's index: the main process builds (or reads) the cache first, then the other ranks read it."""
    if accelerator.is_main_process:
        entries = build_index(cfg.data_root, cfg.annotation_file, index_dir(cfg))
    accelerator.wait_for_everyone()
    if not accelerator.is_main_process:
        entries = build_index(cfg.data_root, cfg.annotation_file, index_dir(cfg))
    return entries


# --- the split --------------------------------------------------------------------------


def held_out_count(n: int, validation_fraction: float, max_validation_videos: int) -> int:
    """How many of n videos split_train_val holds out for validation (a single video is reused, not held out)."""
    if n <= 1 or validation_fraction <= 0 or max_validation_videos <= 0:
        return 0
    return min(max(1, round(validation_fraction * n)), max_validation_videos, n - 1)


def split_train_val(
    entries: Sequence[VideoEntry],
    validation_fraction: float,
    max_validation_videos: int,
    seed: int,
) -> tuple[FlatIndex, FlatIndex]:
    """Hold out round(fraction * n) videos (at least 1, at most max and n - 1) for validation.

    Membership is decided by a hash of (seed, path), so it is the same on every rank and in
    every resumed run, and never depends on file order. A single video cannot be split: it
    is returned as the train set and reused as the validation set. validation_fraction <= 0
    or max_validation_videos <= 0 turn validation off (empty val). Both parts keep the index's
    order and share its arrays.
    """
    entries = as_flat(entries)
    n = len(entries)
    if n == 0:
        raise DataError("no videos to split: the index is empty")
    if validation_fraction <= 0 or max_validation_videos <= 0:
        return entries, entries.take([])
    if n == 1:
        log.warning("only one video: validation reuses the training video %s", name_text(entries[0].path))
        return entries, entries
    k = held_out_count(n, validation_fraction, max_validation_videos)
    head = hashlib.sha1(f"{seed}:".encode() + entries.prefix.encode("utf-8", "surrogateescape"))

    def digest(rel: bytes) -> bytes:  # sha1(f"{seed}:{path}"), the path as its UTF-8 bytes
        h = head.copy()
        h.update(rel)
        return h.digest()

    held = heapq.nsmallest(k, zip(map(digest, entries.relative_bytes()), range(n)))  # = sorted(...)[:k]
    mask = np.zeros(n, dtype=bool)
    mask[[i for _, i in held]] = True
    return entries.take(np.flatnonzero(~mask)), entries.take(np.flatnonzero(mask))
