"""Predicted peak GPU memory of one training process, from a model fitted to measurements.

All coefficients were measured on one NVIDIA H200 (bf16, torch 2.11 + CUDA 13, 2026-11-21;
docs/benchmarks.md has the runs): `taehv-launch bench` for the TAEHV + Seraena step and the
reference encodes, and a real `taehv-launch 1 h200` run for the trainer's own overhead.
Checked on one real H100 80GB (2026-11-23, `bash scripts/gpu_speed.sh compare`): the h100 profile
(micro 8, compiled reference encode at chunk 2, Seraena crop 256) peaked at 53.9-54.0 GiB allocated
against 55.2 GiB predicted here.

    peak = TRAINER_OVERHEAD + max(step(micro), reference_encode(chunk)) + CUDA_CONTEXT + decode

`decode` is the GPU video decoder (video_decoder nvdec or auto on a GPU profile): its NVDEC
sessions' surfaces per thread and the decoded batches in flight, which live beside the step.

The step and the reference encode do not overlap (latents are computed before TAEHV's
activations exist), hence the max. Sizes scale with n_frames x height x width relative to
12 x 480 x 720. Pure: no torch import.
"""

from __future__ import annotations

from dataclasses import dataclass

from .families import get_family
from .schema import global_batch

REF_PIXELS = 12 * 480 * 720

# TAEHV + Seraena train step, allocator peak = fixed + per_clip * micro (max fit error 0.005 GiB
# over micro 1, 2, 4, 8), for TAEHV at patch_size 1, 4x in time (cogvideox, hunyuan, wan). A family of
# another shape has its own fit in its record (Family.step_fit, measured at Family.step_frames()).
STEP_FIT = {False: (0.281, 6.312), True: (0.249, 4.452)}  # gradient_checkpointing -> (fixed, per clip)
STEP_FIT_SHAPE = (1, 4)  # the TAEHV it was measured on: (patch_size, time stride)
# decoder_arch=super: the Super decoder's step is the base step times this ratio, the ratio of the two
# peaks at micro 4 measured on one H100 (12x480x720, patch 1; docs/evidence/super_decoder/: base 25.53 vs
# super 34.64 GiB without checkpointing, 18.06 vs 19.76 with). It reproduces the six other measured
# points (micro 1 and 2) within 0.08 GiB (tests/test_memory_families.py); other shapes are assumed alike.
SUPER_STEP_MEASURED = {  # checkpointing -> {micro: (base peak, super peak)}
    False: {1: (6.59, 8.96), 2: (12.91, 17.52), 4: (25.53, 34.64)},
    True: {1: (4.70, 5.20), 2: (9.15, 10.05), 4: (18.06, 19.76)},
}
SUPER_STEP_RATIO = {ckpt: points[4][1] / points[4][0] for ckpt, points in SUPER_STEP_MEASURED.items()}
# Reference encode peak for one clip per encode call: the family record's encode_gib (families.py).
# Each extra clip in the call adds this share of it: measured for CogVideoX (26.58 GiB at chunk 4 vs
# 7.32 GiB at chunk 1); the other families are assumed to scale alike.
REF_EXTRA_CLIP_SHARE = (26.58 - 7.32) / 3 / 7.32
# Real run at micro 8 peaked at 54.1 GiB vs 50.78 GiB for the bare step: DeepSpeed buckets, fp32
# master weights and AdamW moments, EMA, the Seraena replay buffer, the reference VAE's weights.
TRAINER_OVERHEAD_GIB = 54.1 - 50.78
CUDA_CONTEXT_GIB = 1.1  # total - free after CUDA init, single process
# compile_layout='force' (compiled TAEHV kept channels-last): the trainer's peak allocated fell by 7.1 GiB at
# micro 8 (52.4 -> 45.3 from the latent cache, 52.8 -> 45.7 online) and at micro 9 (58.0 -> 50.9), one H100,
# 2026-11-27 (docs/benchmarks.md "Where the step's time went"). Counted as that amount, at most the share of the
# step it was at micro 8, so a smaller step is not credited with more than it measured; only for the base step
# it was measured on (STEP_FIT's shape, no gradient checkpointing, the base decoder): other families' own fits not.
LAYOUT_FORCE_SAVED_GIB = 52.4 - 45.3
LAYOUT_FORCE_SAVED_SHARE = LAYOUT_FORCE_SAVED_GIB / (STEP_FIT[False][0] + STEP_FIT[False][1] * 8)
# NVDEC per decoding thread: its sessions' surfaces and the float working frames of the conversion and
# resize. Measured on the H100 with 4 threads (scripts/gpu_decode_check.py, docs/benchmarks.md issue 23):
# the process grew 5.9 GiB beyond its CUDA context at 1080p and 7.8 GiB more with 2160p sources.
NVDEC_GIB_PER_THREAD = 1.9
NVDEC_BATCHES_IN_FLIGHT = 4  # DecodeStage depth 3 + the batch the step holds
HEADROOM = 0.90  # plan to use at most this share of the GPU (10% headroom)


@dataclass(frozen=True)
class MemoryPlan:
    predicted_gib: float | None
    gpu_gib: float | None
    fits: bool | None
    best_micro: int | None
    best_accum: int | None
    detail: str


def step_fit(cfg: dict, checkpointing: bool) -> tuple[float, float, int] | None:
    """(fixed GiB, GiB per clip, the pixels n_frames x height x width they were measured at) of TAEHV's base
    step for this config's TAEHV, or None where that shape was never measured."""
    family = get_family(cfg["ref_vae_type"])
    shape = (cfg.get("patch_size", 1), 2 ** sum(cfg.get("encoder_time_downscale", (True, True, False))))
    own = (family.patch_size, family.time_stride, family.latent_channels)
    if checkpointing in family.step_fit and (*shape, cfg.get("latent_channels", family.latent_channels)) == own:
        n, h, w = family.step_frames()
        return (*family.step_fit[checkpointing], n * h * w)
    if shape == STEP_FIT_SHAPE:
        return (*STEP_FIT[checkpointing], REF_PIXELS)
    return None


def layout_forced(cfg: dict | None) -> bool:
    """TAEHV compiled with compile_layout='force' (compile 'all', not under ZeRO-3, where it stays eager)."""
    return (
        bool(cfg)
        and cfg.get("compile") == "all"
        and cfg.get("compile_layout") == "force"
        and cfg.get("channels_last", True)  # compile_taehv forces the layout only for channels-last frames
        and cfg.get("zero_stage") != 3
    )


def predict_gib(
    micro: int,
    n_frames: int,
    height: int,
    width: int,
    checkpointing: bool,
    ref_vae_type: str,
    ref_chunk: int,
    use_ref_vae: bool = True,
    decoder_arch: str = "base",
    cfg: dict | None = None,
) -> float:
    """cfg: the TAEHV keys (patch_size, encoder_time_downscale, latent_channels); None: the family's shape."""
    family = get_family(ref_vae_type)
    fit = step_fit({**family.defaults(), **(cfg or {}), "ref_vae_type": ref_vae_type}, checkpointing)
    assert fit is not None, f"{ref_vae_type}: step memory not measured (plan_memory checks unmeasured())"
    fixed, per_clip, pixels = fit
    step = (fixed + per_clip * micro * n_frames * height * width / pixels) * (
        SUPER_STEP_RATIO[checkpointing] if decoder_arch == "super" else 1.0
    )
    if layout_forced(cfg) and fit[:2] == STEP_FIT[False] and not checkpointing and decoder_arch == "base":
        step -= min(LAYOUT_FORCE_SAVED_GIB, LAYOUT_FORCE_SAVED_SHARE * step)  # only where it was measured
    ref = 0.0
    if use_ref_vae:
        one = family.encode_gib
        assert one is not None, f"{ref_vae_type}: encode memory not measured (plan_memory checks unmeasured())"
        n, h, w = family.step_frames()
        scale = n_frames * height * width / (n * h * w)
        ref = one * (1 + REF_EXTRA_CLIP_SHARE * (min(ref_chunk, micro) - 1)) * scale
    return TRAINER_OVERHEAD_GIB + max(step, ref) + CUDA_CONTEXT_GIB


def step_floor_gib(cfg: dict, micro: int) -> float:
    """The least memory a training step on clips of this size can take on any device: the step of the
    model above with gradient checkpointing on, its fixed costs, and no reference encode (a latent cache
    can spare it). The GPU's bf16 activations are a floor for the CPU too, which computes in fp32 or
    bf16. For a TAEHV whose checkpointed step was not measured only what must exist whatever the model:
    the micro-batch's decoded uint8 clips. resolve.check_clip_size refuses clips no profile could hold."""
    if step_fit(cfg, True) is None:
        return micro * cfg["n_frames"] * 3 * cfg["height"] * cfg["width"] / 2**30
    return predict_gib(
        micro, cfg["n_frames"], cfg["height"], cfg["width"], True, cfg["ref_vae_type"], 1, False,
        cfg.get("decoder_arch", "base"), cfg,
    )  # fmt: skip


def max_clip_pixels(cfg: dict, gib: float, micro: int = 1) -> int:
    """The largest n_frames x height x width whose step_floor_gib at `micro` is at most `gib`."""
    fit = step_fit(cfg, True)
    if fit is None:
        return int(gib * 2**30 / (3 * micro))
    fixed, per_clip, pixels = fit
    ratio = SUPER_STEP_RATIO[True] if cfg.get("decoder_arch", "base") == "super" else 1.0
    return max(0, int(((gib - TRAINER_OVERHEAD_GIB - CUDA_CONTEXT_GIB) / ratio - fixed) / (per_clip * micro) * pixels))


def decode_gib(cfg: dict) -> float:
    """GPU memory of the GPU video decoder (0 when training decodes on the CPU)."""
    if cfg.get("video_decoder", "opencv") == "opencv":
        return 0.0
    batch = cfg["micro_batch_size"] * cfg["n_frames"] * 3 * cfg["height"] * cfg["width"] / 2**30
    threads = cfg.get("video_decode_threads") or 4  # 0: chosen at start, from 4 up within the headroom (decodeplan.py)
    return threads * NVDEC_GIB_PER_THREAD + NVDEC_BATCHES_IN_FLIGHT * batch


def runs_reference_encode(cfg: dict) -> bool:
    """Whether training runs the reference encode on the GPU (not when it reads a latent cache only)."""
    return bool(cfg["use_ref_vae"]) and not (cfg.get("latent_cache") and cfg.get("latent_cache_encode") == "never")


def unmeasured(cfg: dict) -> str:
    """What of this plan's memory was never measured ('' when all of it was): a family whose record has no
    encode_gib, or a TAEHV step neither STEP_FIT nor the family's step_fit covers (families.py). No figure is
    guessed for it: measuring is one line in the record (scripts/gpu_families.sh, docs/families.md)."""
    family = get_family(cfg["ref_vae_type"])
    parts = [f"the {family.name} reference encode"] if runs_reference_encode(cfg) and family.encode_gib is None else []
    ckpt = bool(cfg.get("gradient_checkpointing", False))
    if step_fit(cfg, ckpt) is None:
        shape = (cfg["patch_size"], 2 ** sum(cfg["encoder_time_downscale"]))
        with_ckpt = " with gradient checkpointing" if ckpt and step_fit(cfg, False) else ""
        parts.append(f"TAEHV's training step at patch_size {shape[0]}, {shape[1]}x in time{with_ckpt}")
    return " and ".join(parts)


def plan_memory(gpu: float | None, cfg: dict, world_size: int) -> MemoryPlan:
    """`gpu`: GiB of one GPU (the profile record's gpu_gib); None where GPU memory does not apply."""
    if gpu is None:
        return MemoryPlan(None, None, None, None, None, "GPU memory does not apply to this profile")
    if missing := unmeasured(cfg):
        return MemoryPlan(
            None,
            gpu,
            None,
            None,
            None,
            f"not predicted: {missing} not measured yet (docs/families.md); the first log lines show the real "
            f"peak (gpu_memory_gb): try a short run before a long one",
        )

    def need(micro: int) -> float:
        return predict_gib(
            micro,
            cfg["n_frames"],
            cfg["height"],
            cfg["width"],
            cfg["gradient_checkpointing"],
            cfg["ref_vae_type"],
            cfg["ref_vae_chunk_size"],
            runs_reference_encode(cfg),
            cfg.get("decoder_arch", "base"),
            cfg,
        ) + decode_gib({**cfg, "micro_batch_size": micro})

    micro, budget = cfg["micro_batch_size"], gpu * HEADROOM
    peak = need(micro)
    if peak <= budget:
        return MemoryPlan(
            peak,
            gpu,
            True,
            micro,
            cfg["gradient_accumulation_steps"],
            f"predicted peak {peak:.1f} GiB of {gpu:.0f} GiB per GPU (micro {micro})",
        )
    target = global_batch(cfg, world_size)
    fitting = [m for m in range(1, micro) if need(m) <= budget]
    exact = [m for m in fitting if target % (m * world_size) == 0]  # keeps the global batch exactly
    best = max(exact or fitting, default=None)
    accum = max(1, round(target / (best * world_size))) if best else None
    if best:
        fix = (
            f"use --set micro_batch_size={best} --set gradient_accumulation_steps={accum} "
            f"(global batch {best * world_size * accum})"
        )
    elif not cfg["gradient_checkpointing"]:
        fix = "set --set gradient_checkpointing=True, or lower n_frames / height / width"
    else:
        fix = "lower n_frames / height / width"
    return MemoryPlan(
        peak,
        gpu,
        False,
        best,
        accum,
        f"predicted peak {peak:.1f} GiB exceeds {budget:.0f} of {gpu:.0f} GiB per GPU "
        f"(micro {micro}, {cfg['n_frames']}x{cfg['height']}x{cfg['width']}): {fix}",
    )


def shm_bytes(config: dict, gpus_per_machine: int) -> int:
    """Shared memory (/dev/shm) one node's DataLoader workers need: every worker of every process
    holds prefetch_factor uint8 batches in flight, twice over (the batch and its tensor copy).
    validate-env checks it; the Kubernetes template sizes its memory-backed /dev/shm with it."""
    clip = config["n_frames"] * 3 * config["height"] * config["width"]
    return (
        2
        * config["dataloader_num_workers"]
        * config["prefetch_factor"]
        * config["micro_batch_size"]
        * clip
        * gpus_per_machine
    )
