"""How many threads decode the training clips: chosen from the sources and the GPU. Pure.

`video_decode_threads=0` (the default) lets `decode_choice` choose the GPU decoder's threads per process;
1-32 is taken as set. Each thread is one NVDEC session on its own CUDA stream (train/data/nvdec.py).
The sources come from a probed sample of the files (dataindex/sources.py): size, keyframe interval, length.

The model (docs/benchmarks.md, "Long keyframe intervals"): a thread cuts one clip at a time, decoding
every frame from the keyframe before the clip's start to its last frame, then converting, cropping and
resizing them on the GPU, so one clip takes

    t_clip = CLIP_OVERHEAD_S + decoded pixels / SESSION_PIXELS_PER_S

and K threads give K / t_clip clips/s. Both constants are fitted to the trainer's own loader on long-GOP
sources at the thread counts the choice lands on (`bench loader --decoder nvdec --workers 12`, one H100,
2026-11-26, docs/benchmarks.md "Long-GOP rows"): 63.4 clips/s from 720x480 H.264 with a keyframe every 250
frames at 4 threads (~97 frames decoded a clip) and 37.1 from 1920x1080 with x264's default interval at 6
(~72 frames a clip). The rate per thread falls as threads are added (1080p: 6.6 clips/s a thread at 4, 6.2
at 6, 3.4 at 14), so no straight line fits every count: the first fit (2026-11-24, 4 threads on short-GOP
1080p) read 1.5-1.7x high on these sets, and training from the cache on long-GOP 1080p at the 6 threads it
chose ran at 0.91 of 480p; at 8 it ran at 0.975 (2026-11-27). This fit reads low for short GOPs at 4
threads (35 clips/s against 54.8 measured on 1080p, a keyframe every 60): it errs towards more threads.

The choice is the fewest threads, never under BASE_THREADS (the default before; enough for 480p), that
reach twice the fastest consumer measured (training from the latent cache on one H100: 28.59 clips/s
at 12 x 480x720, issue 38; scaled by the clip's pixels) with MODEL_MARGIN to spare, capped at
SESSIONS_PER_ENGINE sessions per NVDEC engine of the GPU (BASE_THREADS on a GPU whose engines are not in
NVDEC_ENGINES), by the GPU memory the plan leaves (thread_gib each: more for sources above 1080p), by
the process's cores (CORES_PER_THREAD each) and at MAX_THREADS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from .memory import HEADROOM, NVDEC_GIB_PER_THREAD, REF_PIXELS, plan_memory

BASE_THREADS = 4  # memory.decode_gib counts these for video_decode_threads=0
MAX_THREADS = 32  # the key's upper bound (resolve.check_config)
CLIP_OVERHEAD_S = 0.0345  # per clip and thread: open/reconfigure, seek, conversion, crop and resize (fitted)
SESSION_PIXELS_PER_S = 1174e6  # decoded pixels per second of one NVDEC session (fitted)
CONSUMER_CLIPS_PER_S = 28.59  # the fastest consumer measured: from the latent cache, one H100, 12 x 480x720
# (compile_layout='force', 2026-11-27, docs/benchmarks.md "Where the step's time went"; 20.63 before it)
LOADER_MARGIN = 2.0  # the loader should give twice what the consumer takes
MODEL_MARGIN = 1.2  # the rate a thread gives varies with the count (see above): threads for 1.2x the target
CORES_PER_THREAD = 0.25  # measured 0.15-0.25 cores per NVDEC thread at 1-4 threads (docs/benchmarks.md)
SESSIONS_PER_ENGINE = 2  # at most: a second session keeps an engine busy while the first parses or resizes
UNKNOWN_GOP = 250  # a stream that flags no keyframe: taken as x264's default interval
UHD_GIB_PER_THREAD = (5.9 + 7.8) / 4  # measured per thread with 3840x2160 sources (thread_gib)
# NVDEC engines per GPU (NVIDIA's data sheets: H100 and H200 7, A100 and A800 5), by a name's lower case.
NVDEC_ENGINES = {"h100": 7, "h200": 7, "a100": 5, "a800": 5}
# Codecs (OpenCV's header names) NVDEC decodes here (train/data/nvdec.py): the rest go to the CPU.
NVDEC_CODECS = frozenset({"h264", "avc1", "avc3"})
# MPEG transport and program streams carry no seek index, which PyNvVideoCodec's random access needs: such
# files are decoded on the CPU (OpenCV's seeks in them were checked against reading forward, frame for frame).
NVDEC_UNINDEXED = (".ts", ".mts", ".m2ts", ".mpg", ".mpeg")


@dataclass(frozen=True)
class DecodeChoice:
    """threads: NVDEC sessions per process; how: "set", "sources" or "default"; reason: the phrase the dry
    run and the trainer print after the count."""

    threads: int
    how: str
    reason: str
    engines: int = 0  # the GPU's NVDEC engines, 0: not known or not counted

    def line(self) -> str:
        """e.g. '8 threads per process (1.1 per NVDEC engine of 7), chosen from the sources: ...'."""
        per = f" ({self.threads / self.engines:.1f} per NVDEC engine of {self.engines})" if self.engines else ""
        return f"{self.threads} threads per process{per}, {self.reason}"


def nvdec_engines(gpu_name: str) -> int:
    """The NVDEC engines of a GPU named like torch's device name or a profile ("NVIDIA H100 80GB HBM3", "h100");
    0 when not known."""
    name = gpu_name.lower()
    return next((n for key, n in NVDEC_ENGINES.items() if key in name), 0)


def decoded_frames(gop: int, length: int, n_frames: int, min_delta: int, max_delta: int) -> float:
    """Frames a decoder decodes for one clip on average: from the keyframe before a random start to the
    clip's last frame, over the strides plan_frames draws (train/data/clips.py)."""
    gop = gop if gop > 0 else UNKNOWN_GOP
    total, strides = 0.0, range(max(1, min_delta), max(1, min_delta, max_delta) + 1)
    for stride in strides:
        while stride > 1 and length > 0 and (n_frames - 1) * stride + 1 > length:
            stride -= 1
        span = (n_frames - 1) * stride + 1
        if length <= 0:
            seek = (gop - 1) / 2
        else:
            starts = max(1, length - span + 1)  # start positions, each as likely
            q, r = divmod(starts, gop)
            seek = (q * gop * (gop - 1) / 2 + r * (r - 1) / 2) / starts  # mean of start % gop
        total += seek + span
    return total / len(strides)


def clip_seconds(source, n_frames: int, min_delta: int, max_delta: int) -> float:
    """One thread's time for one clip of `source` (an object with width, height, gop, frames), by the model."""
    frames = decoded_frames(source.gop, source.frames, n_frames, min_delta, max_delta)
    return CLIP_OVERHEAD_S + frames * source.width * source.height / SESSION_PIXELS_PER_S


def thread_gib(source_pixels: int) -> float:
    """GPU memory of one decode thread for sources of this many pixels a frame: the plan's NVDEC_GIB_PER_THREAD
    up to 1920x1080, then growing linearly to the 3.43 GiB measured at 3840x2160 (4 threads: 5.9 GiB at
    1080p, 7.8 GiB more with 2160p sources; docs/benchmarks.md, issue 23)."""
    hd, uhd = 1920 * 1080, 3840 * 2160
    return NVDEC_GIB_PER_THREAD + max(0, source_pixels - hd) * (UHD_GIB_PER_THREAD - NVDEC_GIB_PER_THREAD) / (uhd - hd)


def largest_pixels(sources) -> int:
    """The largest frame (width x height) among the sampled files NVDEC decodes; 0 when none."""
    return max(
        (s.width * s.height for s in getattr(sources, "sources", []) if s.codec in NVDEC_CODECS or not s.codec),
        default=0,
    )


def memory_cap(cfg: dict, gpu_gib: float | None, world_size: int = 1, source_pixels: int = 0) -> int | None:
    """The most decode threads whose memory fits the plan's headroom: BASE_THREADS (counted in the plan at
    NVDEC_GIB_PER_THREAD) plus what the GPU has left beside the predicted peak, each at thread_gib of the
    largest sources; never under BASE_THREADS; None when no prediction applies (CPU, unmeasured)."""
    if not gpu_gib:
        return None
    plan = plan_memory(gpu_gib, {**cfg, "video_decode_threads": BASE_THREADS}, world_size)
    if plan.predicted_gib is None:
        return None
    per = thread_gib(source_pixels)
    room = gpu_gib * HEADROOM - plan.predicted_gib - BASE_THREADS * (per - NVDEC_GIB_PER_THREAD)
    return BASE_THREADS + max(0, math.floor(room / per))


def opencv_threads(cores: int, ranks: int, workers: int) -> int:
    """FFmpeg threads per DataLoader worker: the process's share of the node's cores, at least 1."""
    return max(1, cores // (max(1, ranks) * max(1, workers)))


def decode_choice(
    setting: int,
    sources,
    *,
    n_frames: int,
    min_delta: int,
    max_delta: int,
    clip_pixels: int,
    engines: int,
    gpu: str = "the GPU",
    cores: float | None = None,
    memory: int | None = None,
) -> DecodeChoice:
    """NVDEC threads per process. setting: video_decode_threads (> 0: taken as set); sources: a
    dataindex.sources.SourceSample, or None when not probed; clip_pixels: n_frames x height x width of the
    training clips; engines: the GPU's NVDEC engines (0: unknown); cores: CPU cores per process (None:
    not known); memory: memory_cap's threads (None: no cap known)."""
    if setting > 0:
        return DecodeChoice(setting, "set", f"as set (video_decode_threads={setting})")
    if sources is None:
        return DecodeChoice(BASE_THREADS, "default", "the sources were not probed")
    probed: Sequence = [s for s in sources.sources if s.codec in NVDEC_CODECS or not s.codec]
    if not probed:
        why = "no sampled file is H.264 (NVDEC's codec here; the rest decode on the CPU)" if sources.sources else ""
        return DecodeChoice(BASE_THREADS, "default", why or sources.line())
    per_clip = sum(clip_seconds(s, n_frames, min_delta, max_delta) for s in probed) / len(probed)
    frames = sum(decoded_frames(s.gop, s.frames, n_frames, min_delta, max_delta) for s in probed) / len(probed)
    target = LOADER_MARGIN * CONSUMER_CLIPS_PER_S * REF_PIXELS / max(1, clip_pixels)
    need = max(1, math.ceil(MODEL_MARGIN * target * per_clip - 1e-9))
    caps = [(MAX_THREADS, "the key's limit")]
    caps.append(
        (SESSIONS_PER_ENGINE * engines, f"{SESSIONS_PER_ENGINE} per NVDEC engine")
        if engines
        else (BASE_THREADS, f"NVDEC engines of {gpu} not known")
    )
    if memory is not None:
        caps.append((memory, "the GPU memory the plan leaves"))
    if cores is not None:
        caps.append((max(1, math.floor(cores / CORES_PER_THREAD)), f"{cores:g} cores"))
    cap, cap_why = min(caps, key=lambda c: c[0])
    threads = max(BASE_THREADS, min(need, cap))
    text = (
        f"chosen from the sources: {sources.line()}; a clip decodes ~{frames:.0f} frames, {1 / per_clip:.1f} "
        f"clips/s per thread by the decode model, so {need} reach {target:.0f} clips/s (twice the fastest consumer "
        f"measured) with {MODEL_MARGIN - 1:.0%} to spare"
    )
    if need > cap:
        text += f", capped at {cap} by {cap_why}"
    elif need < BASE_THREADS:
        text += f"; {BASE_THREADS} at least"
    if sources.sources and len(probed) < len(sources.sources):
        text += f"; {len(sources.sources) - len(probed)} sampled files are not H.264 (CPU)"
    return DecodeChoice(threads, "sources", text, engines)
