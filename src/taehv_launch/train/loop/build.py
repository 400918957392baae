"""Set-up for the loop: the Accelerator, the data loaders, the reference VAE, TAEHV and Seraena.

Each function builds one thing from the config; the loop in loop.py only uses them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, Sampler

from ...errors import ConfigError, DataError, ModelError
from ...plan.schema import Config
from ...plan.demo import demo_cache_dir, demo_paths
from .. import faults


def make_accelerator(cfg: Config, run_dir: Path | None = None):
    """Accelerator with the process-group timeout from nccl_timeout (NCCL ignores an env var for it).

    On CPU the backend is gloo, which DeepSpeed on CPU needs explicitly (PLATFORM.md). With a run
    directory, the trackers the config chooses (trackers.py; started later by Trackers.create).
    """
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    on_gpu = torch.cuda.is_available() and os.environ.get("ACCELERATE_USE_CPU", "").lower() not in ("1", "true")
    use_ds = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    if use_ds and not on_gpu:
        from ...compat import skip_deepspeed_shm_build

        skip_deepspeed_shm_build()  # a 30 s JIT build that gloo on CPU does not need
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    pg = InitProcessGroupKwargs(
        timeout=timedelta(seconds=cfg.nccl_timeout), backend=("nccl" if on_gpu else "gloo") if distributed else None
    )
    kwargs: dict[str, Any] = {"kwargs_handlers": [pg]}
    if not use_ds:  # under DeepSpeed the accumulation comes from deepspeed.json
        kwargs["gradient_accumulation_steps"] = cfg.gradient_accumulation_steps
    if run_dir is not None:
        from .trackers import tracker_objects

        kwargs["log_with"] = tracker_objects(cfg.trackers, run_dir)
        kwargs["project_dir"] = str(run_dir)
    return Accelerator(**kwargs)


def why_default_stream(cfg: Config, nvdec: bool, deepspeed: bool) -> str:
    """Why the step stays on the default CUDA stream ("" when it goes to the high-priority one)."""
    if cfg.step_stream_priority != "high":
        return "step_stream_priority=default"
    if not nvdec:
        return "no NVDEC decode threads to yield to"
    if deepspeed and cfg.zero_stage == 3 and cfg.mixed_precision == "fp16":
        return "ZeRO-3 with fp16: DeepSpeed's overflow check orders itself on the default stream"
    return ""


def use_step_stream(cfg: Config, accelerator) -> str:
    """step_stream_priority "high" on a GPU whose clips NVDEC cuts: this thread's CUDA work from here on (the
    whole step: forward, backward, optimizer, the waits on collectives) runs on a stream of the highest priority
    torch offers, so the blocks of the decode threads' kernels (colour conversion, resize) are scheduled only
    where the step's leave room (a running block is not preempted). The current stream is per thread: the decode
    threads keep their own streams, and every hand-over between them and the step waits on
    `torch.cuda.current_stream()` (nvdec.py, speed.Prefetcher). Returns the model line's phrase ("; ..." or "")."""
    device = accelerator.device
    if device.type != "cuda":
        return ""
    from ..data.nvdec import choose

    deepspeed = accelerator.state.deepspeed_plugin is not None  # as the trainer's own ZeRO stage reads it
    why = why_default_stream(cfg, choose(cfg, device)[0] == "nvdec", deepspeed)
    if why:
        return f"; the step on the default CUDA stream ({why})"
    torch.cuda.synchronize(device)  # what ran on the default stream so far is done before the switch
    stream = torch.cuda.Stream(device, priority=-64)  # an out-of-range value maps to the highest priority
    torch.cuda.set_stream(stream)
    return f"; the step on a CUDA stream of the highest priority ({stream.priority}): decode kernels yield to it"


def resolve_demo_paths(cfg: Config, device: torch.device, log) -> dict[str, Any]:
    """On CPU, the demo assets' paths (the launcher puts them in the config: plan/demo.py) or an
    empty data_root / ref_vae_path mean the built-in demo assets, made here on first use."""
    demo_data, demo_vae = demo_paths(demo_cache_dir(), cfg.ref_vae_type, cfg.latent_channels)
    need_data = cfg.data_root in ("", demo_data)
    loads_vae = cfg.use_ref_vae and not (cfg.latent_cache and cfg.latent_cache_encode == "never")
    need_vae = loads_vae and cfg.ref_vae_path in ("", demo_vae)
    if not (need_data or need_vae):
        return cfg
    if device.type != "cpu":
        what = "data_root" if need_data else "ref_vae_path"
        raise (DataError if need_data else ModelError)(
            f"{what} is empty: on GPUs set --set {what}=/path (the built-in demo assets are for the cpu profile)"
        )
    from ..data.synthetic import ensure_demo_assets

    data_root, vae_path = ensure_demo_assets(
        str(demo_cache_dir()), latent_channels=cfg.latent_channels, ref_vae_type=cfg.ref_vae_type
    )
    out = cfg
    if need_data:
        out = replace(out, data_root=data_root)
        log(f"demo: data_root is the built-in synthetic set ({data_root}): moving shapes, not real video")
    if need_vae:
        out = replace(out, ref_vae_path=vae_path)
        log(
            f"demo: reference VAE is a tiny randomly initialised {cfg.ref_vae_type} ({vae_path}); "
            f"its latents carry no meaning beyond this demo"
        )
    return out


class ShardedInfiniteSampler(Sampler[int]):
    """Endless, resumable shard of a dataset: epoch e is a seeded permutation, rank r takes every
    world-th index. `start` skips that many of this rank's draws without reading any video.

    Yields e * n + video: the dataset reads video (i % n) and seeds its random clip from i, so
    every epoch draws fresh clips and a resumed run draws exactly the clips it would have."""

    def __init__(self, n: int, rank: int, world: int, seed: int, start: int = 0):
        self.n, self.rank, self.world, self.seed, self.start = n, rank, world, seed, start

    def __iter__(self) -> Iterator[int]:
        per_epoch = max(1, len(range(self.rank, self.n, self.world)))
        epoch, offset = divmod(self.start, per_epoch)
        while True:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            perm = torch.randperm(self.n, generator=g).tolist()
            shard = perm[self.rank :: self.world] or perm[:1]
            yield from (epoch * self.n + i for i in shard[offset:])
            offset, epoch = 0, epoch + 1


def build_datasets(cfg: Config, accelerator, log):
    if cfg.latent_cache:
        from ..data.cached import build_cached_datasets

        return build_cached_datasets(cfg, accelerator, log)
    from ..data.clips import VideoClipDataset
    from ..data.probe import probe_first_usable, usable_entries
    from ...dataindex.index import index_once, split_train_val

    entries = index_once(cfg, accelerator)
    train_e, val_e = split_train_val(entries, cfg.validation_fraction, cfg.max_validation_videos, cfg.seed)
    first, _ = probe_first_usable(train_e, cfg.n_frames, max_tries=min(len(train_e), 32))
    # The validation set has no other videos to fall back on: leave its broken files out up front
    # (else the first validation stops the run), and validate on a usable training video if none is left.
    val_ok = usable_entries(val_e, cfg.n_frames)
    if len(val_ok) < len(val_e):
        bad = next(e.path for e in val_e if e not in val_ok)
        log(
            f"data: leaving out {len(val_e) - len(val_ok)} of {len(val_e)} validation videos, unreadable or unusable "
            f"(e.g. {bad})" + ("" if val_ok else f"; validating on training video {train_e[first].path}")
        )
    common = dict(
        height=cfg.height,
        width=cfg.width,
        n_frames=cfg.n_frames,
        min_frame_delta=cfg.min_frame_delta,
        max_frame_delta=cfg.max_frame_delta,
        seed=cfg.seed,
    )
    train_ds = VideoClipDataset(train_e, random_flip=cfg.random_flip, train=True, **common)
    val_ds = VideoClipDataset(val_ok or [train_e[first]], random_flip=False, train=False, **common)
    log(f"data: {len(entries)} videos under {cfg.data_root} ({len(train_e)} train, {len(val_e)} validation)")
    return train_ds, val_ds


def make_loader(dataset, batch_size: int, sampler, cfg: Config) -> DataLoader:
    from ..data.cached import collate_cached
    from ..data.clips import collate, worker_init_fn
    from ..data.workers import WorkerLoader  # workers started with the stop signals blocked

    collate = collate_cached if cfg.latent_cache else collate
    workers = cfg.dataloader_num_workers
    extra = dict(prefetch_factor=cfg.prefetch_factor, persistent_workers=True) if workers > 0 else {}
    return WorkerLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate,
        worker_init_fn=worker_init_fn,
        pin_memory=torch.cuda.is_available(),
        drop_last=True,
        **extra,
    )


# How video_decode_threads=0 came to its number (plan/decodeplan.py DecodeChoice.how); the next line says why.
CHOSEN = {"sources": "chosen from the sources", "default": "the default"}


@dataclass(frozen=True)
class Decoding:
    """How the training clips are cut, decided once at start (`use_decoder`): "opencv" in the DataLoader
    workers, or "nvdec" in the training process by `threads` decoders `make` builds (NvdecDecoder, or the
    tests' stand-in from faults.py)."""

    name: str
    make: Any = None
    threads: int = 0


def use_decoder(cfg: Config, device: torch.device, dataset, log) -> Decoding:
    """Which decoder cuts the training clips ("nvdec" or "opencv"), said in one line; with nvdec the
    dataset plans clips (tickets) and the training process decodes them (nvdec.DecodeStage) with the threads
    video_decode_threads sets, or with 0 those chosen here from the sources (a second line says why)."""
    from ..data import nv12, nvdec_seek
    from ..data.nvdec import DecodeRefused, NvdecDecoder, OpenCVFrames, choose, nvdec_version

    stand_in = faults.decode_stand_in(OpenCVFrames, DecodeRefused)  # the tests' GPU path on any device
    chosen = choose(cfg, device)
    name, why = ("nvdec", "") if stand_in else chosen
    if cfg.video_decoder == "nvdec" and name != "nvdec":
        raise ConfigError(
            f"video_decoder=nvdec, but {why}: install the extra (pip install 'taehv-launch[nvdec]') "
            f"or use --set video_decoder=auto"
        )
    if name != "nvdec":
        log(
            f"data: decoding training clips on the CPU (OpenCV, {cfg.dataloader_num_workers} DataLoader workers "
            f"per rank)" + (f"; not on the GPU: {why}" if why and device.type == "cuda" else "")
        )
        return Decoding("opencv")
    dataset.defer = True
    what = stand_in.what if stand_in else f"NVDEC, PyNvVideoCodec {nvdec_version()}, {nvdec_seek.how()}, {nv12.how()}"
    threads, how, choice = cfg.video_decode_threads, "as set by video_decode_threads", None
    if threads <= 0:  # 0: chosen once, at start, from the sources and the GPU (plan/decodeplan.py)
        from ..data.probe import choose_threads

        choice = choose_threads(dataset, device, cfg.height, cfg.width, cfg)
        threads, how = choice.threads, CHOSEN[choice.how]
    log(
        f"data: decoding training clips on the GPU ({what}, {threads} threads per rank, {how}); "
        f"files it cannot take are decoded on the CPU"
    )
    if choice is not None:
        log(f"data: NVDEC decode threads: {choice.line()}")
    return Decoding("nvdec", stand_in or NvdecDecoder, threads)


def batches(loader, decoding: Decoding, cfg: Config, device: torch.device, log):
    """The loader itself, or with nvdec the DecodeStage that decodes its tickets."""
    if decoding.name != "nvdec":
        return loader
    from ..data.nvdec import DecodeStage

    return DecodeStage(
        loader, loader.dataset, device, cfg.height, cfg.width, decoding.make, threads=decoding.threads, log=log
    )


def load_reference(cfg: Config, device: torch.device):
    if not cfg.use_ref_vae or (cfg.latent_cache and cfg.latent_cache_encode == "never"):
        return None  # a latent cache holds the reference latents: the VAE is not loaded
    from ..reference.refvae import load_reference_vae

    dtype = getattr(torch, cfg.ref_vae_dtype)
    ref = load_reference_vae(
        cfg.ref_vae_type,
        cfg.ref_vae_path,
        dtype=dtype,
        device=device,
        chunk_size=cfg.ref_vae_chunk_size,
        latent_mean=cfg.ref_latent_mean,
        latent_std=cfg.ref_latent_std,
        expect_channels=cfg.latent_channels,
    )
    return ref


def build_seraena(cfg: Config, device: torch.device, rank: int):
    if not cfg.use_seraena:
        return None
    from ..model.seraena import VideoSeraena

    autocast = torch.bfloat16 if (cfg.mixed_precision == "bf16" and device.type == "cuda") else None
    return VideoSeraena(
        cfg.latent_channels,
        frames_per_group=cfg.n_seraena_frames,
        lr=cfg.seraena_lr,
        buffer_bytes=cfg.seraena_buffer_mb << 20,
        autocast_dtype=autocast,
        seed=cfg.seed + rank,
    ).to(device)
