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
# over micro 1, 2, 4, 8).
STEP_FIT = {False: (0.281, 6.312), True: (0.249, 4.452)}  # gradient_checkpointing -> (fixed, per clip)
STEP_FIT_SHAPE = (1, 4)  # the TAEHV it was measured on: (patch_size, time stride); other shapes are not predicted
# Reference encode peak for one clip per encode call: the family record's encode_gib (families.py).
# Each extra clip in the call adds this share of it: measured for CogVideoX (26.58 GiB at chunk 4 vs
# 7.32 GiB at chunk 1); the other families are assumed to scale alike.
REF_EXTRA_CLIP_SHARE = (26.58 - 7.32) / 3 / 7.32
# Real run at micro 8 peaked at 54.1 GiB vs 50.78 GiB for the bare step: DeepSpeed buckets, fp32
# master weights and AdamW moments, EMA, the Seraena replay buffer, the reference VAE's weights.
TRAINER_OVERHEAD_GIB = 54.1 - 50.78
CUDA_CONTEXT_GIB = 1.1  # total - free after CUDA init, single process
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


def predict_gib(
    micro: int,
    n_frames: int,
    height: int,
    width: int,
    checkpointing: bool,
    ref_vae_type: str,
    ref_chunk: int,
    use_ref_vae: bool = True,
) -> float:
    scale = n_frames * height * width / REF_PIXELS
    fixed, per_clip = STEP_FIT[checkpointing]
    step = fixed + per_clip * micro * scale
    ref = 0.0
    if use_ref_vae:
        one = get_family(ref_vae_type).encode_gib
        assert one is not None, f"{ref_vae_type}: encode memory not measured (plan_memory checks unmeasured())"
        ref = one * (1 + REF_EXTRA_CLIP_SHARE * (min(ref_chunk, micro) - 1)) * scale
    return TRAINER_OVERHEAD_GIB + max(step, ref) + CUDA_CONTEXT_GIB


def _measured_shape(cfg: dict) -> bool:
    """Whether TAEHV has the shape STEP_FIT was measured on: patch_size 1, 4x in time."""
    return (cfg["patch_size"], 2 ** sum(cfg["encoder_time_downscale"])) == (1, 4)


def step_floor_gib(cfg: dict, micro: int) -> float:
    """The least memory a training step on clips of this size can take on any device: the step of the
    model above with gradient checkpointing on, its fixed costs, and no reference encode (a latent cache
    can spare it). The GPU's bf16 activations are a floor for the CPU too, which computes in fp32 or
    bf16. For a TAEHV of another shape (not measured) only what must exist whatever the model: the
    micro-batch's decoded uint8 clips. resolve.check_clip_size refuses clips no profile could hold."""
    if not _measured_shape(cfg):
        return micro * cfg["n_frames"] * 3 * cfg["height"] * cfg["width"] / 2**30
    return predict_gib(micro, cfg["n_frames"], cfg["height"], cfg["width"], True, cfg["ref_vae_type"], 1, False)


def max_clip_pixels(cfg: dict, gib: float, micro: int = 1) -> int:
    """The largest n_frames x height x width whose step_floor_gib at `micro` is at most `gib`."""
    if not _measured_shape(cfg):
        return int(gib * 2**30 / (3 * micro))
    fixed, per_clip = STEP_FIT[True]
    return max(0, int((gib - TRAINER_OVERHEAD_GIB - CUDA_CONTEXT_GIB - fixed) / (per_clip * micro) * REF_PIXELS))


def decode_gib(cfg: dict) -> float:
    """GPU memory of the GPU video decoder (0 when training decodes on the CPU)."""
    if cfg.get("video_decoder", "opencv") == "opencv":
        return 0.0
    batch = cfg["micro_batch_size"] * cfg["n_frames"] * 3 * cfg["height"] * cfg["width"] / 2**30
    return cfg.get("video_decode_threads", 4) * NVDEC_GIB_PER_THREAD + NVDEC_BATCHES_IN_FLIGHT * batch


def runs_reference_encode(cfg: dict) -> bool:
    """Whether training runs the reference encode on the GPU (not when it reads a latent cache only)."""
    return bool(cfg["use_ref_vae"]) and not (cfg.get("latent_cache") and cfg.get("latent_cache_encode") == "never")


def unmeasured(cfg: dict) -> str:
    """What of this plan's memory was never measured ('' when all of it was): a family whose record has no
    encode_gib (families.py), or a TAEHV of another shape than STEP_FIT's. No figure is guessed for it."""
    family = get_family(cfg["ref_vae_type"])
    parts = [f"the {family.name} reference encode"] if runs_reference_encode(cfg) and family.encode_gib is None else []
    shape = (cfg["patch_size"], 2 ** sum(cfg["encoder_time_downscale"]))
    if shape != STEP_FIT_SHAPE:
        parts.append(f"TAEHV's training step at patch_size {shape[0]}, {shape[1]}x in time")
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
