"""Videos in, fixed-size clips out: the index, the train/val split and the clip dataset.

Datasets may hold millions of files and some of them are broken, so:
- `build_index` lists files once (stat only, never decoding) and caches the list as JSON
  that every rank and every later run reuses;
- `VideoClipDataset` finds broken files lazily: a file that cannot be opened, has no
  frames or is degenerate is skipped (reported in the item's "skipped" list) and another
  video is tried, so a bad file never crashes or stalls training;
- clips are a pure function of (seed, epoch, index): a resumed run that replays the same
  index sequence gets the same clips, whatever the number of workers; indices past
  len(dataset) mean "the same video, a fresh clip" (for endless samplers).

Clips are uint8 TCHW RGB (collated: NTCHW), in [0, 255]; the trainer scales to [0, 1].
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import tempfile
from dataclasses import dataclass
from typing import Iterable, Sequence

import cv2
import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import ConfigError, DataError

log = logging.getLogger(__name__)

VIDEO_EXTENSIONS = (".mp4", ".webm", ".mkv", ".avi", ".mov")
MIN_SIDE = 8                # frames smaller than this (test_video.mp4 is 1x1) hold nothing to learn: broken
MAX_FRAME_HINT = 10_000_000  # a header count above this (or <= 0) is garbage, e.g. no_duration.webm's -1.4e17
MAX_SCAN_FRAMES = 1_000_000  # bound on counting frames by decoding, so a strange file cannot stall a worker
SEEK_MIN = 48               # start offsets below this are reached with grab(): exact, and as fast as a seek
# FFmpeg decoding threads per opened file in a DataLoader worker. None: this process's share of
# the node's cores (cores / (local ranks x workers), at least 1), so that every worker's FFmpeg
# together uses the cores without oversubscribing them; FFmpeg's own default (one thread per
# core in every worker) and one thread each were both slower (docs/benchmarks.md, "Data loader").
WORKER_DECODE_THREADS: int | None = None
INDEX_VERSION = 1


# --- the index --------------------------------------------------------------------------

@dataclass(frozen=True)
class VideoEntry:
    """One video file: its absolute path and the container's frame count (-1 = unknown)."""

    path: str
    frame_count: int = -1


class VideoIndex(list):
    """A list of VideoEntry plus how it was made (missing listed files, cache file used)."""

    missing: int = 0
    cache_path: str = ""
    from_cache: bool = False


def build_index(
    data_root: str,
    annotation_file: str = "",
    cache_dir: str = "",
    *,
    probe_frame_counts: bool = False,
) -> VideoIndex:
    """List the videos of data_root (or of annotation_file) once; cache the list in cache_dir.

    The cache key is (data_root, annotation_file, its mtime and size); without an annotation
    file the scan is keyed on data_root's own mtime, which catches files added at the top
    level only: delete the cache file to rescan after changes deeper down. Only stat() is
    used; probe_frame_counts=True also opens each file to read the container's frame count
    (a hint; the dataset reads it anyway when it opens a file, so it is off by default).
    """
    root = _check_root(data_root, annotation_file)
    key = _index_key(root, annotation_file, probe_frame_counts)
    if not cache_dir:
        return _make_index(root, annotation_file, probe_frame_counts)
    cache_path = os.path.join(cache_dir, f"index-{hashlib.sha1(json.dumps(key).encode()).hexdigest()[:16]}.json")
    cached = _read_index(cache_path, key)
    if cached is not None:
        return cached
    with exclusive_lock(cache_path + ".lock"):
        cached = _read_index(cache_path, key)  # another rank may have built it while we waited
        if cached is not None:
            return cached
        index = _make_index(root, annotation_file, probe_frame_counts)
        _write_index(cache_path, key, index)
    index.cache_path = cache_path
    return index


def _check_root(data_root: str, annotation_file: str) -> str:
    """The absolute data root; relative annotation paths are joined to it (or to the file's folder)."""
    if annotation_file and not os.path.isfile(annotation_file):
        raise DataError(f"annotation_file {annotation_file} not found: fix the path, or set "
                        f"annotation_file='' to use every video under data_root")
    if not data_root:
        if annotation_file:
            return os.path.dirname(os.path.abspath(annotation_file))
        raise DataError("data_root is empty: set data_root to a folder of videos")
    if not os.path.exists(data_root):
        raise DataError(f"data_root {data_root} does not exist: set data_root to a folder of videos")
    if not os.path.isdir(data_root):
        raise DataError(f"data_root {data_root} is not a folder: set data_root to the folder that holds the videos")
    return os.path.abspath(data_root)


def _index_key(root: str, annotation_file: str, probe: bool) -> dict:
    """What the cached index depends on; any change means a new cache file."""
    key = {"version": INDEX_VERSION, "data_root": root, "probe": probe}
    if annotation_file:
        st = os.stat(annotation_file)
        key.update(annotation_file=os.path.abspath(annotation_file), mtime_ns=st.st_mtime_ns, size=st.st_size)
    else:
        key.update(root_mtime_ns=os.stat(root).st_mtime_ns)
    return key


def _make_index(root: str, annotation_file: str, probe: bool) -> VideoIndex:
    if annotation_file:
        paths, missing = _annotated_paths(root, annotation_file)
    else:
        paths, missing = _scan(root), 0
        if not paths:
            raise DataError(f"no video files ({' '.join(VIDEO_EXTENSIONS)}) under {root}: point data_root at "
                            f"your videos or give an annotation_file")
    index = VideoIndex(VideoEntry(p, _header_frame_count(p) if probe else -1) for p in paths)
    index.missing = missing
    return index


def _scan(root: str) -> list[str]:
    """Every file with a video extension under root (recursive, symlinks followed once), sorted.

    Directories are never entries, even when named like a video (x.mp4/).
    """
    found, stack, seen = [], [root], set()
    while stack:
        folder = stack.pop()
        real = os.path.realpath(folder)
        if real in seen:
            continue
        seen.add(real)
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    if entry.is_dir():
                        stack.append(entry.path)
                    elif entry.is_file() and entry.name.lower().endswith(VIDEO_EXTENSIONS):
                        found.append(entry.path)
        except OSError as err:
            log.warning("cannot list %s (%s); skipping it", folder, err)
    return sorted(found)


def _annotated_paths(root: str, annotation_file: str) -> tuple[list[str], int]:
    """The existing files listed in annotation_file ({"list": [{"path": ...}, ...]}), and how many are missing."""
    listed = _read_annotation(annotation_file)
    paths = [os.path.normpath(os.path.join(root, p)) for p in listed]
    existing = [p for p in paths if os.path.isfile(p)]
    missing = len(paths) - len(existing)
    if not existing:
        raise DataError(f"none of the {len(paths)} videos listed in {annotation_file} exist (e.g. {paths[0]}): "
                        f"relative paths are joined to data_root={root}; fix data_root or the file")
    if missing:
        first = next(p for p in paths if not os.path.isfile(p))
        log.warning("%d of %d videos listed in %s do not exist and are left out (e.g. %s)",
                    missing, len(paths), annotation_file, first)
    return existing, missing


def _read_annotation(annotation_file: str) -> list[str]:
    """The "path" strings of the seed annotation format, or one DataError line saying what is wrong."""
    try:
        with open(annotation_file, encoding="utf-8") as f:
            doc = json.load(f)
    except json.JSONDecodeError as err:
        raise DataError(f"annotation_file {annotation_file} is not valid JSON ({err.msg}, line {err.lineno}): "
                        f"fix the file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"cannot read annotation_file {annotation_file} ({err}): fix the path or permissions") from None
    shape = '{"list": [{"path": "relative/or/absolute.mp4"}, ...]}'
    items = doc.get("list") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise DataError(f"annotation_file {annotation_file} must be {shape}: no \"list\" array found")
    if not items:
        raise DataError(f"annotation_file {annotation_file} lists no videos: add entries to its \"list\"")
    for i, item in enumerate(items):
        if not (isinstance(item, dict) and isinstance(item.get("path"), str) and item["path"]):
            raise DataError(f"annotation_file {annotation_file}: entry {i} is {json.dumps(item)[:80]}, "
                            f"expected {{\"path\": \"...\"}}: fix the file")
    return [item["path"] for item in items]


def _header_frame_count(path: str) -> int:
    """The container's frame count, or -1 when unknown or implausible. Reads the header only."""
    cap = _open(path)
    if cap is None:
        return -1
    try:
        return _plausible(cap.get(cv2.CAP_PROP_FRAME_COUNT))
    finally:
        cap.release()


def _plausible(count: float) -> int:
    """A frame count hint, or -1 when it is <= 0, not finite or absurdly large."""
    if not math.isfinite(count) or count <= 0 or count > MAX_FRAME_HINT:
        return -1
    return int(count)


def _read_index(cache_path: str, key: dict) -> VideoIndex | None:
    """The cached index if the file exists, parses and was made for this key; else None."""
    try:
        with open(cache_path, encoding="utf-8") as f:
            doc = json.load(f)
        if doc.get("key") != key:
            return None
        index = VideoIndex(VideoEntry(str(p), int(n)) for p, n in doc["entries"])
        index.missing = int(doc.get("missing", 0))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    index.cache_path, index.from_cache = cache_path, True
    return index


def _write_index(cache_path: str, key: dict, index: VideoIndex) -> None:
    """Write the index atomically (tmp file + os.replace); a read-only cache dir only warns."""
    doc = {"key": key, "missing": index.missing, "entries": [[e.path, e.frame_count] for e in index]}
    try:
        os.makedirs(os.path.dirname(cache_path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".index-", suffix=".tmp", dir=os.path.dirname(cache_path))
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        os.replace(tmp, cache_path)
    except OSError as err:
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


# --- the split --------------------------------------------------------------------------

def split_train_val(
    entries: Sequence[VideoEntry],
    validation_fraction: float,
    max_validation_videos: int,
    seed: int,
) -> tuple[list[VideoEntry], list[VideoEntry]]:
    """Hold out round(fraction * n) videos (at least 1, at most max and n - 1) for validation.

    Membership is decided by a hash of (seed, path), so it is the same on every rank and in
    every resumed run, and never depends on file order. A single video cannot be split: it
    is returned as the train set and reused as the validation set. validation_fraction <= 0
    or max_validation_videos <= 0 turn validation off (empty val).
    """
    n = len(entries)
    if n == 0:
        raise DataError("no videos to split: the index is empty")
    if validation_fraction <= 0 or max_validation_videos <= 0:
        return list(entries), []
    if n == 1:
        log.warning("only one video: validation reuses the training video %s", entries[0].path)
        return list(entries), list(entries)
    k = min(max(1, round(validation_fraction * n)), max_validation_videos, n - 1)
    ranked = sorted(range(n), key=lambda i: hashlib.sha1(f"{seed}:{entries[i].path}".encode()).digest())
    held = set(ranked[:k])
    return [e for i, e in enumerate(entries) if i not in held], [e for i, e in enumerate(entries) if i in held]


# --- decoding ---------------------------------------------------------------------------

def worker_init_fn(worker_id: int) -> None:
    """DataLoader workers: no OpenCV thread pool per worker (N workers x N threads thrash), and
    stop signals are left to the rank (stop.guard_worker)."""
    from .stop import guard_worker

    guard_worker()
    cv2.setNumThreads(0)


def decode_threads() -> int | None:
    """FFmpeg threads for a capture opened here: None (FFmpeg's default) outside DataLoader workers."""
    info = torch.utils.data.get_worker_info()
    if info is None:
        return None
    if WORKER_DECODE_THREADS is not None:
        return WORKER_DECODE_THREADS
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(1, cores // (ranks * max(1, info.num_workers)))


def capture(path: str, threads: int | None) -> cv2.VideoCapture:
    """cv2.VideoCapture with `threads` FFmpeg decoding threads (None: FFmpeg's default)."""
    if threads is None:
        return cv2.VideoCapture(path)
    return cv2.VideoCapture(path, cv2.CAP_FFMPEG, [cv2.CAP_PROP_N_THREADS, threads])


def _open(path: str) -> cv2.VideoCapture | None:
    """An opened capture, or None (missing, empty, not a video, a directory)."""
    try:
        if not os.path.isfile(path) or os.path.getsize(path) == 0:
            return None
    except OSError:
        return None
    try:
        cap = capture(path, decode_threads())
    except cv2.error:
        return None
    if not cap.isOpened():
        cap.release()
        return None
    return cap


def count_frames(path: str) -> int:
    """Decodable frames, counted with grab() (no colour conversion); 0 if unreadable."""
    cap = _open(path)
    if cap is None:
        return 0
    n = 0
    try:
        while n < MAX_SCAN_FRAMES and cap.grab():
            n += 1
    except cv2.error:
        pass
    finally:
        cap.release()
    return n


def _decode(cap: cv2.VideoCapture, wanted: list[int], seek: bool) -> tuple[dict[int, np.ndarray] | None, int]:
    """Frames (BGR) at the sorted indices `wanted`, read forward from 0 or from a seek.

    Returns (frames, -1) on success. When the file ends early: (None, frames decoded),
    which is the file's real length when we read from 0, or (None, -1) after a seek.
    A seek counts only if the capture then reports the requested position: on some
    files (no_duration.webm) set() returns True and silently stays on frame 0.
    """
    pos = 0
    if seek and wanted[0] >= SEEK_MIN:
        if not (cap.set(cv2.CAP_PROP_POS_FRAMES, wanted[0]) and int(cap.get(cv2.CAP_PROP_POS_FRAMES)) == wanted[0]):
            return None, -1
        pos = wanted[0]
    seeked = pos > 0
    frames: dict[int, np.ndarray] = {}
    try:
        for target in wanted:
            while pos < target:
                if not cap.grab():
                    return None, -1 if seeked else pos
                pos += 1
            ok, frame = cap.read()
            if not ok or frame is None:
                return None, -1 if seeked else pos
            pos += 1
            frames[target] = frame
    except cv2.error:
        return None, -1 if seeked else pos
    return frames, -1


def _decode_path(path: str, wanted: list[int], allow_seek: bool = True) -> tuple[dict[int, np.ndarray] | None, int]:
    """_decode on a fresh capture; a failed seek is retried by reading forward from 0."""
    for seek in (True, False) if allow_seek else (False,):
        cap = _open(path)
        if cap is None:
            return None, 0
        try:
            frames, length = _decode(cap, wanted, seek)
        finally:
            cap.release()
        if frames is not None or length >= 0:
            return frames, length
    return None, 0


def plan_frames(
    rng: np.random.Generator | None, length: int, n_frames: int, min_delta: int, max_delta: int
) -> list[int]:
    """Frame indices of one clip from a video of `length` frames; rng None = centre clip, stride 1.

    Stride is drawn from [min_delta, max_delta] and lowered until the clip fits; a video
    shorter than n_frames gives all its frames and then holds the last one (a freeze
    reads like real video; looping would insert a cut the causal VAE must encode).
    """
    assert length >= 1 and n_frames >= 1, (length, n_frames)
    stride = 1 if rng is None else int(rng.integers(min_delta, max_delta + 1))
    while stride > 1 and (n_frames - 1) * stride + 1 > length:
        stride -= 1
    span = (n_frames - 1) * stride + 1
    if span > length:
        return [min(k, length - 1) for k in range(n_frames)]
    start = (length - span) // 2 if rng is None else int(rng.integers(0, length - span + 1))
    return [start + k * stride for k in range(n_frames)]


@dataclass(frozen=True)
class Crop:
    """A source window (y, x, h, w) that is resized to the output size, then maybe flipped."""

    y: int
    x: int
    h: int
    w: int
    flip: bool


def plan_crop(
    rng: np.random.Generator | None, src_h: int, src_w: int, height: int, width: int,
    random_flip: bool = False, random_downscale: bool = True,
) -> Crop:
    """Where to crop a src_h x src_w video for a height x width clip; rng None = validation.

    The scale s maps source pixels to output pixels. A source smaller than the crop in
    either side is upscaled just enough to cover it (s = cover > 1). A larger source is,
    in training, downscaled by a log-uniform s in [cover, 1] first, so a 4K video gives
    anything from the whole frame to native-resolution detail rather than only tiny
    patches. Validation takes the whole-frame scale (s = cover) and the centre.
    """
    cover = max(height / src_h, width / src_w)
    if rng is None or cover >= 1:
        scale = cover
    else:
        scale = math.exp(rng.uniform(math.log(cover), 0.0)) if random_downscale else 1.0
    h = min(src_h, max(1, round(height / scale)))
    w = min(src_w, max(1, round(width / scale)))
    if rng is None:
        return Crop((src_h - h) // 2, (src_w - w) // 2, h, w, False)
    y, x = int(rng.integers(0, src_h - h + 1)), int(rng.integers(0, src_w - w + 1))
    return Crop(y, x, h, w, bool(random_flip and rng.random() < 0.5))


def _to_rgb(frame: np.ndarray) -> np.ndarray:
    """OpenCV's BGR (or gray / BGRA) frame -> HWC RGB uint8."""
    if frame.ndim == 2:
        return cv2.cvtColor(frame, cv2.COLOR_GRAY2RGB)
    if frame.shape[2] == 4:
        return cv2.cvtColor(frame, cv2.COLOR_BGRA2RGB)
    return cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)


def _apply_crop(frame: np.ndarray, crop: Crop, height: int, width: int) -> np.ndarray:
    """HWC RGB uint8 -> height x width x 3 uint8."""
    out = frame[crop.y: crop.y + crop.h, crop.x: crop.x + crop.w]
    if out.shape[:2] != (height, width):
        shrink = crop.h * crop.w > height * width
        out = cv2.resize(out, (width, height), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
    if crop.flip:
        out = out[:, ::-1]
    return np.ascontiguousarray(out)


# --- the dataset ------------------------------------------------------------------------

class VideoClipDataset(Dataset):
    """Clips of n_frames x height x width from a list of videos.

    item i -> {"frames": uint8 TCHW RGB in [0, 255], "skipped": [broken paths hit]}.
    Video i % len(entries) is used, so an infinite sampler may pass i >= len to draw fresh
    clips; the clip depends only on (seed, epoch, i) and the files, never on which worker
    or how many items came before (resume-safe). Broken files are skipped: the next
    candidates come in an order drawn from the same seed, each video is tried at most once
    per item, and DataError is raised only when none of them is usable.
    """

    def __init__(
        self,
        entries: Sequence[VideoEntry | str],
        height: int,
        width: int,
        n_frames: int,
        min_frame_delta: int = 1,
        max_frame_delta: int = 1,
        random_flip: bool = False,
        seed: int = 0,
        train: bool = True,
        *,
        random_downscale: bool = True,
    ):
        self.entries = [e if isinstance(e, VideoEntry) else VideoEntry(str(e)) for e in entries]
        if not self.entries:
            raise DataError("the dataset has no videos: check data_root / annotation_file")
        _check_sizes(height, width, n_frames, min_frame_delta, max_frame_delta)
        self.height, self.width, self.n_frames = height, width, n_frames
        self.min_frame_delta, self.max_frame_delta = min_frame_delta, max_frame_delta
        self.random_flip, self.random_downscale = random_flip, random_downscale
        self.seed, self.train, self.epoch = seed, train, 0
        self._broken: dict[str, str] = {}   # path -> why; per worker process, saves re-decoding
        self._lengths: dict[str, int] = {}  # counted lengths of files whose header has none

    def __len__(self) -> int:
        return len(self.entries)

    def set_epoch(self, epoch: int) -> None:
        """Fresh clips per epoch (takes effect in workers created after the call)."""
        self.epoch = int(epoch)

    def __getitem__(self, i: int) -> dict:
        assert i >= 0, f"negative index {i}"
        skipped: list[str] = []
        for video in self._candidates(int(i)):
            path = self.entries[video].path
            clip = None if path in self._broken else self._clip(video, int(i))
            if clip is not None:
                return {"frames": clip, "skipped": skipped}
            skipped.append(path)
        raise DataError(f"no usable video among {len(self.entries)} files: every one is unreadable, empty or "
                        f"smaller than {MIN_SIDE}x{MIN_SIDE} pixels (e.g. {skipped[0]}): check data_root / "
                        f"annotation_file")

    def _rng(self, i: int, video: int, stream: int) -> np.random.Generator:
        return np.random.default_rng([self.seed % 2**63, self.epoch % 2**63, i, video, stream])

    def _candidates(self, i: int) -> Iterable[int]:
        """Video i % n first, then every other video once, in a seeded random order."""
        n = len(self.entries)
        first = i % n
        yield first
        if n > 1:
            for video in self._rng(i, first, 2).permutation(n):
                if video != first:
                    yield int(video)

    def _clip(self, video: int, i: int) -> torch.Tensor | None:
        """uint8 TCHW RGB clip of one video, or None (and the file marked broken)."""
        path = self.entries[video].path
        frames, why = self._read(path, video, i)
        if frames is None:
            return self._mark_broken(path, why)
        src_h, src_w = frames[0].shape[:2]
        if min(src_h, src_w) < MIN_SIDE:
            return self._mark_broken(path, f"{src_w}x{src_h} pixels, smaller than {MIN_SIDE}")
        rng = self._rng(i, video, 1) if self.train else None
        crop = plan_crop(rng, src_h, src_w, self.height, self.width, self.random_flip, self.random_downscale)
        out = np.stack([_apply_crop(_to_rgb(_same_size(f, src_h, src_w)), crop, self.height, self.width)
                        for f in frames])
        clip = torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()
        assert clip.shape == (self.n_frames, 3, self.height, self.width) and clip.dtype == torch.uint8, clip.shape
        return clip

    def _read(self, path: str, video: int, i: int) -> tuple[list[np.ndarray] | None, str]:
        """The clip's BGR frames, or (None, why). Trusts the header count until the file ends early."""
        length = self._length_hint(path)
        seek = path not in self._lengths  # no plausible header count: seeking is unreliable too
        if length == 0:
            return None, "cannot be opened or has no frames"
        for _ in range(2):  # second pass only when the header count was too large
            rng = self._rng(i, video, 0) if self.train else None
            wanted = plan_frames(rng, length, self.n_frames, self.min_frame_delta, self.max_frame_delta)
            decoded, real_length = _decode_path(path, sorted(set(wanted)), seek)
            if decoded is not None:
                return [decoded[k] for k in wanted], ""
            if real_length <= 0 or real_length >= length:
                break
            length = real_length
        return None, "cannot be decoded"

    def _length_hint(self, path: str) -> int:
        """The header's frame count if plausible, else the counted one (cached); 0 = unusable."""
        if path in self._lengths:
            return self._lengths[path]
        hint = _header_frame_count(path)
        if hint > 0:
            return hint
        self._lengths[path] = count_frames(path)     # 0 when it cannot be opened
        return self._lengths[path]

    def _mark_broken(self, path: str, why: str) -> None:
        if path not in self._broken:
            log.warning("skipping video %s: %s", path, why)
        self._broken[path] = why
        return None


def _same_size(frame: np.ndarray, h: int, w: int) -> np.ndarray:
    """Frames of a stream whose size changes mid-way are resized to the first frame's size."""
    return frame if frame.shape[:2] == (h, w) else cv2.resize(frame, (w, h), interpolation=cv2.INTER_AREA)


def _check_sizes(height: int, width: int, n_frames: int, min_delta: int, max_delta: int) -> None:
    if height < 1 or width < 1 or n_frames < 1:
        raise ConfigError(f"height={height}, width={width}, n_frames={n_frames} must all be positive")
    if not 1 <= min_delta <= max_delta:
        raise ConfigError(f"need 1 <= min_frame_delta <= max_frame_delta, got {min_delta} and {max_delta}")


def collate(batch: list[dict]) -> dict:
    """Items -> {"frames": uint8 NTCHW RGB, "skipped": all broken paths hit by the batch}."""
    frames = torch.stack([item["frames"] for item in batch])
    assert frames.ndim == 5 and frames.shape[2] == 3 and frames.dtype == torch.uint8, frames.shape
    return {"frames": frames, "skipped": [p for item in batch for p in item["skipped"]]}


def probe_first_usable(entries: Sequence[VideoEntry], n_frames: int, max_tries: int = 16) -> tuple[int, list[str]]:
    """Read the first videos until one gives >= 1 usable frame: (its position, broken paths before it).

    Run at startup so that a dataset of unreadable files fails in seconds with one line,
    not after the DataLoader workers have started. Each try reads at most n_frames frames
    from the start; fewer is fine (short videos are held on their last frame).
    """
    broken: list[str] = []
    for k, entry in enumerate(entries[: max(1, max_tries)]):
        if _gives_usable_frame(entry.path, n_frames):
            return k, broken
        broken.append(entry.path)
    if not broken:
        raise DataError("the dataset has no videos: check data_root / annotation_file")
    raise DataError(f"none of the first {len(broken)} videos gives a usable frame (e.g. {broken[0]}): check "
                    f"data_root / annotation_file and that the files are videos OpenCV can read")


def usable_entries(entries: Sequence[VideoEntry], n_frames: int) -> list[VideoEntry]:
    """The entries that pass probe_first_usable's check (for the few held-out validation videos:
    validation reads only those, so one broken file there would otherwise stop the run)."""
    return [entry for entry in entries if _gives_usable_frame(entry.path, n_frames)]


def _gives_usable_frame(path: str, n_frames: int) -> bool:
    frames = _read_prefix(path, max(1, n_frames))
    return bool(frames) and min(frames[0].shape[:2]) >= MIN_SIDE


def _read_prefix(path: str, n: int) -> list[np.ndarray]:
    """Up to n frames from the start of a video (BGR); [] if it cannot be read."""
    cap = _open(path)
    if cap is None:
        return []
    frames: list[np.ndarray] = []
    try:
        while len(frames) < n:
            ok, frame = cap.read()
            if not ok or frame is None:
                break
            frames.append(frame)
    except cv2.error:
        pass
    finally:
        cap.release()
    return frames
