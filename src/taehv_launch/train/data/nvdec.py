"""Decoding clips on the GPU (NVDEC, through PyNvVideoCodec) inside the training process.

With video_decoder="nvdec" the DataLoader workers only plan clips (data.Ticket: the file, frames and crop the
CPU path would cut). DecodeStage turns a batch of tickets into a batch of clips on a pool of threads, each with
its own NVDEC session and CUDA stream (threads share the process's CUDA context; decoder processes would each
need their own and time-slice the GPU: docs/benchmarks.md, "Video decoders"), several batches ahead of the step.
A file NVDEC cannot take (codec, pixel format, a failed fetch, ...) is cut on the CPU by the dataset's own code
(`recover`) from then on, each reason logged once; a file neither can read is replaced in its batch by another
clip of that batch and reported like any broken video.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

from ...plan.decodeplan import NVDEC_CODECS, NVDEC_UNINDEXED
from .clips import Crop, Ticket
from .decode import colour_of
from . import nv12, nvdec_seek
from .nv12 import nv12_to_rgb
from .nvdec_env import nvdec_available, nvdec_version  # noqa: F401  (callers import them from here)
from .probe import choose_threads

CHUNK_BYTES = 256 << 20  # float32 frames resized at a time: bounds the 4K crop's working memory
DECODER_CACHE = 2  # NVDEC sessions PyNvVideoCodec keeps per thread (one per stream shape)
# NVDEC_CODECS: H.264 was checked frame for frame against a decode from frame 0 on the H100
# (docs/benchmarks.md). HEVC gave wrong frames for some clips, so it and every codec not checked yet
# (VP8/VP9/AV1, ...) are decoded on the CPU.
RUN_CONFIG: dict[str, Any] = {}  # device -> the run's config, noted by choose() for the thread choice
FETCH_FAILURES = 3  # failed frame fetches after which a file goes to the CPU for good (HEVC fails on a
# few clips of a file that NVDEC otherwise decodes: docs/benchmarks.md)


class DecodeRefused(Exception):
    """The decoder cannot give this file's frames; `reason` is the category logged once."""

    def __init__(self, reason: str, detail: str = "", *, for_good: bool = True):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail, self.for_good = reason, detail, for_good


class NvdecDecoder:
    """One thread's NVDEC: a PyNvVideoCodec SimpleDecoder reconfigured per file, on its own CUDA stream.

    output "nv12" (default) takes the decoder's native 8-bit 4:2:0 surfaces and converts them here
    (nv12.nv12_to_rgb); "rgbp" takes NVDEC's own RGB conversion, whose colours differ from OpenCV's."""

    output = "nv12"

    def __init__(self, device: torch.device):
        import PyNvVideoCodec as nvc

        self.nvc, self.device = nvc, device
        self.stream = torch.cuda.Stream(device)
        self.dec = None
        self.seek = None  # nvdec_seek.SeekCutter, made on the first clip it takes

    def frames(self, path: str, indices: tuple[int, ...]) -> torch.Tensor:
        """uint8 (T, 3, H, W) RGB frames at `indices` (clip order), on self.stream's device."""
        return _rgb(*self._surfaces(path, indices), indices, colour_of(path))

    def clip(self, ticket: Ticket, height: int, width: int) -> torch.Tensor:
        """finish() of the ticket's frames; from NV12 surfaces in one kernel a frame where it runs (nv12.nv12_clip:
        no full-size RGB frame is made), else the frames converted and finished in torch ops."""
        view = ticket.view
        planes, at, size = self._surfaces(ticket.path, view.frames)
        if size is not None and not ticket.turns % 4:
            window = scaled_crop(view.crop, ticket.src, *size)
            got = nv12.nv12_clip([planes[at[k]] for k in view.frames], *size, window, height, width, ticket.colour)
            if got is not None:
                return got
        return finish(
            _rgb(planes, at, size, view.frames, ticket.colour), view.crop, ticket.src, height, width, ticket.turns
        )

    def _surfaces(self, path: str, indices: tuple[int, ...]) -> tuple[list[torch.Tensor], dict[int, int], Any]:
        """(frames of sorted(set(indices)), at: index -> position, size): NV12 of size (h, w), or "rgbp" RGB: None."""
        wanted = sorted(set(indices))
        got = self._seeking(path, tuple(wanted))
        if got is not None:
            return got[0], {k: n for n, k in enumerate(wanted)}, got[1]
        try:
            if self.dec is None:
                colour = self.nvc.OutputColorType.RGBP if self.output == "rgbp" else self.nvc.OutputColorType.NATIVE
                self.dec = self.nvc.SimpleDecoder(
                    path,
                    gpu_id=self.device.index or 0,
                    cuda_stream=self.stream.cuda_stream,
                    use_device_memory=True,
                    decoder_cache_size=DECODER_CACHE,
                    output_color_type=colour,
                )
            else:
                self.dec.reconfigure_decoder(path)
            total = len(self.dec)
        except Exception as err:
            self.dec = None  # a failed session is not reused
            raise DecodeRefused("NVDEC cannot open the stream", _first_line(err)) from None
        if total and wanted[-1] >= total:
            raise DecodeRefused("the frame count NVDEC reads differs from the header's", f"{total} frames")
        try:
            got = self.dec.get_batch_frames_by_index(wanted)
            planes = [torch.from_dlpack(f) for f in got]
        except Exception as err:
            self.dec = None
            raise DecodeRefused("NVDEC failed to decode frames", _first_line(err), for_good=False) from None
        size = None
        if self.output != "rgbp" and planes and planes[0].ndim == 2:
            meta = self.dec.get_stream_metadata()
            h, w = int(meta.height), int(meta.width)
            if planes[0].dtype != torch.uint8 or planes[0].shape[0] < h * 3 // 2 or planes[0].shape[1] != w:
                what = f"{planes[0].dtype} {tuple(planes[0].shape)} for {w}x{h}"
                raise DecodeRefused("NVDEC's surfaces are not 8-bit 4:2:0 here", what)
            size = (h, w)
        if len(planes) != len(wanted) or (size is None and any(p.ndim != 3 or p.shape[0] != 3 for p in planes)):
            raise DecodeRefused(
                "NVDEC returned frames of an unexpected layout",
                f"{len(planes)} of {len(wanted)}, shape {tuple(planes[0].shape) if planes else ()}",
            )
        return planes, {k: n for n, k in enumerate(wanted)}, size

    def _seeking(self, path: str, wanted: tuple[int, ...]):
        """(NV12 planes, (h, w)) through nvdec_seek (only the clip's pictures mapped), or None where that path
        does not take this file or clip (nvdec_seek.SeekCutter.cut)."""
        if self.output == "rgbp" or not nvdec_seek.enabled():
            return None
        if self.seek is None:
            self.seek = nvdec_seek.SeekCutter(self.nvc, self.device.index or 0, self.stream)
        return self.seek.cut(path, wanted)


class OpenCVFrames:
    """The same interface over OpenCV on the CPU (train/data/decode.py): the CPU tests' stand-in for NVDEC,
    and what a subclass refusing some files uses to exercise the fallback path. Frames as coded, as NVDEC
    gives them (OpenCV's turn by the display rotation off): finish() turns them."""

    def __init__(self, device: torch.device):
        self.device = device
        # a stream of its own on a GPU, as NVDEC's: the stage syncs it before the step (on another stream) reads
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def frames(self, path: str, indices: tuple[int, ...]) -> torch.Tensor:
        import cv2

        from .decode import _decode_path

        got, _ = _decode_path(path, sorted(set(indices)), upright=False)
        if got is None:
            raise DecodeRefused("OpenCV cannot decode the frames")
        rgb = [cv2.cvtColor(got[k], cv2.COLOR_BGR2RGB) for k in indices]
        return torch.from_numpy(_stack(rgb)).permute(0, 3, 1, 2).to(self.device)


def _rgb(planes: list[torch.Tensor], at: dict[int, int], size: tuple[int, int] | None, indices, colour: str):
    """_surfaces' frames in clip order, uint8 (T, 3, H, W) RGB (NV12 converted with the stream's `colour`)."""
    if size is not None:
        planes = [nv12_to_rgb(p, size[0], size[1], colour) for p in planes]
    return torch.stack([planes[at[k]] for k in indices])  # copies out of the decoder's surfaces


def _stack(frames):
    import numpy as np

    return np.ascontiguousarray(np.stack(frames))


def finish(
    x: torch.Tensor, crop: Crop, src: tuple[int, int] | None, height: int, width: int, turns: int = 0
) -> torch.Tensor:
    """uint8 (T, 3, H, W) frames as coded -> the clip: turned upright (`turns` quarter turns counter-clockwise:
    the container's display rotation, which the CPU path's OpenCV applies and NVDEC does not), cropped, resized
    (bilinear, antialiased) in chunks of frames that bound the float working memory, flipped. A source whose
    decoded size differs from the header's (`src`) gets the crop scaled to the decoded size."""
    if turns % 4:
        x = torch.rot90(x, turns, dims=(-2, -1))
    t, _, h, w = x.shape
    crop = scaled_crop(crop, src, h, w)
    x = x[:, :, crop.y : crop.y + crop.h, crop.x : crop.x + crop.w]
    if tuple(x.shape[-2:]) != (height, width):
        out = torch.empty((t, 3, height, width), dtype=torch.uint8, device=x.device)
        step = max(1, CHUNK_BYTES // (3 * x.shape[-2] * x.shape[-1] * 4))
        for k in range(0, t, step):
            part = F.interpolate(
                x[k : k + step].float(), size=(height, width), mode="bilinear", antialias=True, align_corners=False
            )
            out[k : k + step] = part.round_().clamp_(0, 255).to(torch.uint8)
        x = out
    if crop.flip:
        x = x.flip(-1)
    return x.contiguous()


def scaled_crop(crop: Crop, src: tuple[int, int] | None, h: int, w: int) -> Crop:
    """The crop planned on a source of the header's size `src`, on the decoded (h, w) frames where they differ."""
    if src is None or src == (h, w):
        return crop
    sy, sx = h / src[0], w / src[1]
    return Crop(
        min(h - 1, round(crop.y * sy)),
        min(w - 1, round(crop.x * sx)),
        max(1, round(crop.h * sy)),
        max(1, round(crop.w * sx)),
        crop.flip,
    )


def cut(dec, ticket: Ticket, height: int, width: int) -> torch.Tensor:
    """The ticket's clip from a thread's decoder: its clip() where it has one, else finish() of its frames()."""
    if hasattr(dec, "clip"):
        return dec.clip(ticket, height, width)
    view = ticket.view
    return finish(dec.frames(ticket.path, view.frames), view.crop, ticket.src, height, width, ticket.turns)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:160]


class DecodeStage:
    """Iterate a DataLoader of tickets, yielding batches with "frames" decoded on `device`.

    `depth` batches are decoding while the step runs; `make_decoder(device)` builds one decoder per
    thread (NvdecDecoder on GPUs). `dataset.recover(ticket)` cuts a refused file's clip on the CPU.
    threads 0 (video_decode_threads' default): chosen from the dataset's sources and the GPU
    (probe.choose_threads), said in one log line. Log lines from the threads are handed to `log` by the
    consuming thread."""

    def __init__(
        self,
        loader,
        dataset,
        device: torch.device,
        height: int,
        width: int,
        make_decoder: Callable[[torch.device], Any],
        threads: int = 4,
        depth: int = 3,
        log: Callable[[str], None] = print,
    ):
        self.it: Iterator[dict[str, Any]] = iter(loader)
        self.dataset, self.device, self.height, self.width = dataset, device, height, width
        self.make_decoder, self.log = make_decoder, log
        if threads <= 0:
            choice = choose_threads(dataset, device, height, width, RUN_CONFIG.get(str(device)))
            threads = choice.threads
            log(f"data: NVDEC decode threads: {choice.line()}")
        self.threads = threads
        self.pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="video-decode")
        self.local = threading.local()
        self.lock = threading.Lock()
        self.refused: dict[str, str] = {}  # path -> reason: decoded on the CPU from now on
        self.failures: dict[str, int] = {}  # path -> failed frame fetches so far
        self.reasons: set[str] = set()
        self.messages: list[str] = []
        self.counts = {"gpu": 0, "cpu": 0, "lost": 0}
        self.pending: deque[tuple[dict[str, Any], list[Future]]] = deque()
        for _ in range(max(1, depth)):
            self._submit()

    def __iter__(self) -> "DecodeStage":
        return self

    def _submit(self) -> None:
        batch = next(self.it)
        self.pending.append((batch, [self.pool.submit(self._clip, t) for t in batch["tickets"]]))

    def _decoder(self):
        dec = getattr(self.local, "decoder", None)
        if dec is None:
            if self.device.type == "cuda" and self.device.index is not None:
                torch.cuda.set_device(self.device)
            dec = self.local.decoder = self.make_decoder(self.device)
        return dec

    def _clip(self, ticket: Ticket) -> torch.Tensor | None:
        """The ticket's clip on self.device, or None when no decoder can read the file."""
        if ticket.path not in self.refused:
            if ticket.codec and ticket.codec not in NVDEC_CODECS:
                why = DecodeRefused(
                    f"NVDEC is not used for {ticket.codec} files", "only H.264 is checked frame for frame"
                )
                self._refuse(ticket.path, why)
            elif ticket.path.lower().endswith(NVDEC_UNINDEXED):
                why = DecodeRefused("NVDEC is not used for MPEG-TS/PS files", "no seek index for its random access")
                self._refuse(ticket.path, why)
            elif ticket.trimmed:
                why = DecodeRefused("NVDEC is not used for trimmed files", "frames before the edit list's start")
                self._refuse(ticket.path, why)
        if ticket.path not in self.refused:
            dec = self._decoder()
            stream = torch.cuda.stream(dec.stream) if dec.stream is not None else contextlib.nullcontext()
            try:
                with stream:
                    clip = cut(dec, ticket, self.height, self.width)
                if dec.stream is not None:
                    dec.stream.synchronize()  # this thread's stream only: the step's stream runs on
                notes = [n for n in (nv12.take_note(), nvdec_seek.take_note()) if n]
                with self.lock:
                    self.messages.extend(notes)
                self._count("gpu")
                return clip
            except DecodeRefused as err:
                self._refuse(ticket.path, err)
        cpu = self.dataset.recover(ticket)
        if cpu is None:
            self._count("lost")
            return None
        self._count("cpu")
        if self.device.type != "cuda":
            return cpu
        copy = getattr(self.local, "copy", None) or torch.cuda.Stream(self.device)
        self.local.copy = copy
        with torch.cuda.stream(copy):
            out = cpu.to(self.device)
        copy.synchronize()  # a pageable copy may still be in flight when .to returns
        return out

    def _count(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1

    def _refuse(self, path: str, err: DecodeRefused) -> None:
        """This clip goes to the CPU; the file too once it is refused for good or failed FETCH_FAILURES times."""
        with self.lock:
            self.failures[path] = self.failures.get(path, 0) + 1
            if err.for_good or self.failures[path] >= FETCH_FAILURES:
                self.refused[path] = err.reason
            if err.reason not in self.reasons:
                self.reasons.add(err.reason)
                what = (
                    "such files are"
                    if err.for_good
                    else f"such clips are (and a file's every clip after {FETCH_FAILURES} failures)"
                )
                self.messages.append(
                    f"data: {err.reason} of {path} ({err.detail or 'no detail'}); {what} decoded on "
                    f"the CPU (this line once per reason)"
                )

    def __next__(self) -> dict[str, Any]:
        skipped: list[str] = []
        while True:
            batch, futures = self.pending.popleft()
            self._submit()
            clips = [f.result() for f in futures]
            skipped += batch["skipped"] + [t.path for t, c in zip(batch["tickets"], clips) if c is None]
            self._flush()
            good = [c for c in clips if c is not None]
            if good:
                break  # else: every file of the batch is unreadable; the next one
        if self.device.type == "cuda":
            current = torch.cuda.current_stream(self.device)
            for c in good:
                c.record_stream(current)  # made on a decode thread's stream, used and freed on this one
        filled = [c if c is not None else good[n % len(good)] for n, c in enumerate(clips)]
        out = {k: v for k, v in batch.items() if k != "tickets"}
        out.update(frames=torch.stack(filled), skipped=skipped)
        return out

    def _flush(self) -> None:
        with self.lock:
            lines, self.messages = self.messages, []
        for line in lines:
            self.log(line)

    def close(self) -> None:
        """Stop the decode threads: queued clips are dropped, running ones finish (a clip takes well under a
        second), so no thread is inside a decoder when the caller goes on, e.g. to fork a DataLoader's
        workers, which would inherit a lock that thread held."""
        self.pool.shutdown(wait=True, cancel_futures=True)


def choose(cfg, device: torch.device) -> tuple[str, str]:
    """(decoder, why): "nvdec" or "opencv" for this run's training clips, and one phrase on the choice.

    video_decoder "auto" takes NVDEC on a GPU when PyNvVideoCodec is installed; "nvdec" insists (the
    caller refuses the run when it cannot); "opencv" decodes in the DataLoader workers on the CPU."""
    want = cfg.video_decoder
    if want == "opencv" or device.type != "cuda":
        return "opencv", "" if want != "nvdec" else "no CUDA device"
    missing = nvdec_available()
    if missing:
        return "opencv", missing
    RUN_CONFIG[str(device)] = cfg
    return "nvdec", ""
