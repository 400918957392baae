"""Videos in, fixed-size clips out: decoding and the clip dataset (the index is index.py).

Some files of a large dataset are broken, so:
- `VideoClipDataset` finds broken files lazily: a file that cannot be opened, has no
  frames, is degenerate or is shorter than n_frames is skipped (reported in the item's
  "skipped" list, and why in its "why" map: the trainer prints one line per video and rank, so
  the workers, each of which meets the file on its own, print none) and another video is tried,
  so a bad file never crashes or stalls training;
- clips are a pure function of (seed, epoch, index): a resumed run that replays the same
  index sequence gets the same clips, whatever the number of workers; indices past
  len(dataset) mean "the same video, a fresh clip" (for endless samplers).

Clips are uint8 TCHW RGB (collated: NTCHW), in [0, 255]; the trainer scales to [0, 1].
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import cv2
import numpy as np
import torch
from torch.utils.data import Dataset

from ...errors import ConfigError, DataError
from .decode import _decode_path, count_frames, header_frame_count, header_info
from .decode import opencv_garbles, ticket_traits
from ...dataindex.flat import VideoEntry, as_flat
from ...dataindex.listing import name_text

log = logging.getLogger(__name__)

HEADER_CACHE = 4096  # headers kept per worker when planning for the GPU decoder (bounded: millions of files)
MIN_SIDE = 8  # frames smaller than this (test_video.mp4 is 1x1) hold nothing to learn: broken
# --- decoding ---------------------------------------------------------------------------


def worker_init_fn(worker_id: int) -> None:
    """DataLoader workers: no OpenCV thread pool per worker (N workers x N threads thrash), and
    stop signals are left to the rank (stop.guard_worker)."""
    from ..durability.stop import guard_worker

    guard_worker()
    cv2.setNumThreads(0)


def plan_frames(
    rng: np.random.Generator | None, length: int, n_frames: int, min_delta: int, max_delta: int
) -> list[int]:
    """Frame indices of one clip from a video of `length` frames; rng None = centre clip, stride 1.

    Stride is drawn from [min_delta, max_delta] and lowered until the clip fits. A video
    shorter than n_frames gives all its frames and then holds the last one; VideoClipDataset
    skips such videos instead (a frozen tail is not real motion), only the loader benchmark
    relies on this.
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
    rng: np.random.Generator | None,
    src_h: int,
    src_w: int,
    height: int,
    width: int,
    random_flip: bool = False,
    random_downscale: bool = True,
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
    out = frame[crop.y : crop.y + crop.h, crop.x : crop.x + crop.w]
    if out.shape[:2] != (height, width):
        shrink = crop.h * crop.w > height * width
        out = cv2.resize(out, (width, height), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
    if crop.flip:
        out = out[:, ::-1]
    return np.ascontiguousarray(out)


@dataclass(frozen=True)
class View:
    """How one clip was cut from a video: the frame indices (in clip order), the crop, and whether
    the decoder may seek (False for files whose header frame count was unusable)."""

    frames: tuple[int, ...]
    crop: Crop
    seek: bool = True


@dataclass(frozen=True)
class Ticket:
    """A clip planned but not decoded (video_decoder="nvdec": decoded on the GPU, train/data/nvdec.py). `src`: the
    header's (height, width) or None; `video`, `item`: the item to cut on the CPU instead (-1: none)."""

    path: str
    view: View
    src: tuple[int, int] | None = None
    video: int = -1
    item: int = -1
    codec: str = ""  # the header's codec name (decode.codec_of), "" when unknown
    turns: int = 0  # quarter turns bringing the coded frames upright (decode.display_turns), as the CPU path sees them
    trimmed: bool = False  # its first packets lie before the edit list's start (decode.trimmed_start)
    colour: str = "bt601"  # the YUV -> RGB conversion its header names, as OpenCV applies it (decode.colour_of)


def render_clip(frames: Sequence[np.ndarray], crop: Crop, height: int, width: int) -> torch.Tensor:
    """Decoded BGR frames -> the uint8 TCHW RGB clip of `crop`, resized to height x width."""
    src_h, src_w = frames[0].shape[:2]
    out = np.stack([_apply_crop(_to_rgb(_same_size(f, src_h, src_w)), crop, height, width) for f in frames])
    clip = torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()
    assert clip.shape == (len(frames), 3, height, width) and clip.dtype == torch.uint8, clip.shape
    return clip


def read_view(path: str, view: View, height: int, width: int) -> torch.Tensor | None:
    """The clip a recorded View describes, decoded again from the file; None if it cannot be read."""
    decoded, _ = _decode_path(path, sorted(set(view.frames)), view.seek) if not opencv_garbles(path) else (None, 0)
    if decoded is None or any(k not in decoded for k in view.frames):
        return None
    frames = [decoded[k] for k in view.frames]
    if min(frames[0].shape[:2]) < MIN_SIDE:
        return None
    return render_clip(frames, view.crop, height, width)


# --- the dataset ------------------------------------------------------------------------


class VideoClipDataset(Dataset):
    """Clips of n_frames x height x width from a list of videos.

    item i -> {"frames": uint8 TCHW RGB in [0, 255], "skipped": [broken paths hit], "why": {path: why}}.
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
        self.entries = as_flat(entries)  # flat arrays: forked workers read it without copying it
        if not self.entries:
            raise DataError("the dataset has no videos: check data_root / annotation_file")
        _check_sizes(height, width, n_frames, min_frame_delta, max_frame_delta)
        self.height, self.width, self.n_frames = height, width, n_frames
        self.min_frame_delta, self.max_frame_delta = min_frame_delta, max_frame_delta
        self.random_flip, self.random_downscale = random_flip, random_downscale
        self.seed, self.train, self.epoch = seed, train, 0
        self._broken: dict[str, str] = {}  # path -> why; per worker process, saves re-decoding
        self._lengths: dict[str, int] = {}  # counted lengths of files whose header has none
        self.defer = False  # True: items carry a Ticket, not frames (GPU decode)
        self._headers: dict[str, tuple[int, int, int]] = {}  # deferred planning: a bounded header cache

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
            if self.defer:
                ticket = self.plan(video, int(i))
                if ticket is not None:
                    return {"ticket": ticket, "skipped": skipped, "why": self._why(skipped)}
            else:
                clip = self.clip(video, int(i))
                if clip is not None:
                    return {"frames": clip, "skipped": skipped, "why": self._why(skipped)}
            skipped.append(path)
        raise DataError(
            f"no usable video among {len(self.entries)} files: every one is unreadable, empty, "
            f"shorter than n_frames={self.n_frames} frames or smaller than {MIN_SIDE}x{MIN_SIDE} pixels "
            f"(e.g. {name_text(skipped[0])}: {self._broken.get(skipped[0], 'unusable')}): "
            f"check data_root / annotation_file"
        )

    def _why(self, skipped: list[str]) -> dict[str, str]:
        return {p: self._broken[p] for p in skipped if p in self._broken}

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

    def clip(self, video: int, i: int) -> torch.Tensor | None:
        """Item i's clip of one video (uint8 TCHW RGB), or None: the file is broken (and marked so)."""
        path = self.entries[video].path
        if path in self._broken:
            return None
        got = self.make_view(path, (lambda stream: self._rng(i, video, stream)) if self.train else None)
        if isinstance(got, str):
            return self._mark_broken(path, got)
        return got[0]

    def plan(self, video: int, i: int) -> Ticket | None:
        """Item i's clip of one video, planned from the header without decoding (the same frames and
        crop as clip() draws), or None: the file is unusable (and marked so)."""
        path = self.entries[video].path
        if path in self._broken:
            return None
        garbled = opencv_garbles(path)  # NVDEC's handling of interlaced streams is not checked: not offered either
        if garbled:
            return self._mark_broken(path, garbled)
        length, w, h = self._header(path)
        if length == 0:
            return self._mark_broken(path, "cannot be opened or has no frames")
        if length < self.n_frames:
            return self._mark_broken(path, f"{length} frames, fewer than n_frames={self.n_frames}")
        if min(w, h) < MIN_SIDE:
            return self._mark_broken(
                path, f"{w}x{h} pixels, smaller than {MIN_SIDE}" if w and h else "no frame size in its header"
            )
        rng = (lambda stream: self._rng(i, video, stream)) if self.train else None
        wanted = plan_frames(rng(0) if rng else None, length, self.n_frames, self.min_frame_delta, self.max_frame_delta)
        crop = plan_crop(
            rng(1) if rng else None, h, w, self.height, self.width, self.random_flip, self.random_downscale
        )
        view = View(tuple(wanted), crop, path not in self._lengths)
        return Ticket(path, view, (h, w), video, i, **ticket_traits(path))

    def recover(self, ticket: Ticket) -> torch.Tensor | None:
        """The ticket's clip cut on the CPU (when the GPU decoder cannot take the file): the same item
        as clip() gives it, re-planned if the file is shorter than its header says; None: unusable."""
        return self.clip(ticket.video, ticket.item)

    def _header(self, path: str) -> tuple[int, int, int]:
        """(usable length, width, height) from the header; a short or missing count is counted."""
        got = self._headers.get(path)
        if got is None:
            count, w, h = header_info(path)
            if count < self.n_frames:
                if path not in self._lengths:
                    self._lengths[path] = count_frames(path)  # 0 when it cannot be opened
                count = self._lengths[path]
            if len(self._headers) >= HEADER_CACHE:
                self._headers.pop(next(iter(self._headers)))
            got = self._headers[path] = (count, w, h)
        return got

    def make_view(self, path: str, rng: Callable[[int], np.random.Generator] | None) -> tuple[torch.Tensor, View] | str:
        """A clip of `path` and the View it was cut by, or why the file is unusable.

        rng(stream) gives the generator of one random stream (0: frames, 1: crop); None = the
        centre clip at stride 1 (validation). The latent cache records the View and replays it."""
        frames, wanted, seek, why = self._read(path, rng)
        if frames is None:
            return why
        src_h, src_w = frames[0].shape[:2]
        if min(src_h, src_w) < MIN_SIDE:
            return f"{src_w}x{src_h} pixels, smaller than {MIN_SIDE}"
        crop = plan_crop(
            rng(1) if rng else None, src_h, src_w, self.height, self.width, self.random_flip, self.random_downscale
        )
        return render_clip(frames, crop, self.height, self.width), View(tuple(wanted), crop, seek)

    def _read(self, path: str, rng) -> tuple[list[np.ndarray] | None, list[int], bool, str]:
        """The clip's BGR frames, their indices and whether seeking was allowed, or (None, [], _, why).
        Trusts the header count until the file ends early."""
        garbled = opencv_garbles(path)
        if garbled:
            return None, [], True, garbled
        length = self._length_hint(path)
        seek = path not in self._lengths  # no plausible header count: seeking is unreliable too
        if length == 0:
            return None, [], seek, "cannot be opened or has no frames"
        for _ in range(2):  # second pass only when the header count was too large
            if length < self.n_frames:  # a frozen tail would teach stillness: skipped, like a broken file
                return None, [], seek, f"{length} frames, fewer than n_frames={self.n_frames}"
            wanted = plan_frames(
                rng(0) if rng else None, length, self.n_frames, self.min_frame_delta, self.max_frame_delta
            )
            decoded, real_length = _decode_path(path, sorted(set(wanted)), seek)
            if decoded is not None:
                return [decoded[k] for k in wanted], wanted, seek, ""
            if real_length <= 0 or real_length >= length:
                break
            length = real_length
        return None, [], seek, "cannot be decoded"

    def _length_hint(self, path: str) -> int:
        """The header's frame count if plausible and long enough for a clip, else the counted one
        (cached); 0 = unusable. A short header count is checked, so a long file is never skipped on it."""
        if path in self._lengths:
            return self._lengths[path]
        hint = header_frame_count(path)
        if hint >= self.n_frames:
            return hint
        self._lengths[path] = count_frames(path)  # 0 when it cannot be opened
        return self._lengths[path]

    def _mark_broken(self, path: str, why: str) -> None:
        """Remember why `path` is unusable (the item's "why" carries it to the one line the trainer prints;
        a warning here would be one more line per DataLoader worker)."""
        if path not in self._broken:
            log.debug("skipping video %s: %s", name_text(path), why)
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
    """Items -> {"frames": uint8 NTCHW RGB (or "tickets": planned clips), "skipped": all broken paths hit,
    "why": {path: why unusable}}."""
    skipped = [p for item in batch for p in item["skipped"]]
    why = {p: w for item in batch for p, w in item.get("why", {}).items()}
    if "ticket" in batch[0]:
        return {"tickets": [item["ticket"] for item in batch], "skipped": skipped, "why": why}
    frames = torch.stack([item["frames"] for item in batch])
    assert frames.ndim == 5 and frames.shape[2] == 3 and frames.dtype == torch.uint8, frames.shape
    return {"frames": frames, "skipped": skipped, "why": why}
