"""Predicted peak GPU memory of one training process, from a model fitted to measurements.

Peak = fixed + per_clip * micro * (n_frames * height * width) / (12 * 480 * 720), for the
TAEHV + Seraena step, plus the reference VAE's encode peak for one chunk. The coefficients
come from `taehv-launch bench` on one H200 (see docs/benchmarks.md for the run and date);
they are allocator peaks (torch.cuda.max_memory_allocated), so the check adds the CUDA
context and NCCL buffers on top (CONTEXT_GIB). Pure: no torch import.
"""

from __future__ import annotations

from dataclasses import dataclass

REF_PIXELS = 12 * 480 * 720
CONTEXT_GIB = 3.0            # CUDA context + NCCL + cuDNN workspace, not in the allocator's peak

# Filled from docs/benchmarks.md (H200, bf16, 12 x 480 x 720).
# (fixed GiB, GiB per reference clip) for the TAEHV + Seraena step, without / with checkpointing.
STEP_FIT = {False: (None, None), True: (None, None)}
# Reference encode peak GiB for a chunk of 1 clip of 12 x 480 x 720, per family.
REF_ENCODE_GIB: dict[str, float | None] = {"cogvideox": None, "hunyuan": None, "wan": None}

GPU_GIB = {"h100": 80.0, "a800": 80.0, "h200": 141.0}


@dataclass(frozen=True)
class MemoryPlan:
    predicted_gib: float | None
    gpu_gib: float | None
    fits: bool | None
    best_micro: int | None
    best_accum: int | None
    detail: str


def predict_gib(micro: int, n_frames: int, height: int, width: int, checkpointing: bool,
                ref_vae_type: str, ref_chunk: int) -> float | None:
    fixed, per_clip = STEP_FIT[checkpointing]
    ref = REF_ENCODE_GIB.get(ref_vae_type)
    if fixed is None or per_clip is None or ref is None:
        return None
    scale = n_frames * height * width / REF_PIXELS
    return fixed + per_clip * micro * scale + ref * min(ref_chunk, micro) * scale + CONTEXT_GIB


def plan_memory(profile: str, cfg: dict, world_size: int) -> MemoryPlan:
    gpu = GPU_GIB.get(profile)
    args = (cfg["n_frames"], cfg["height"], cfg["width"], cfg["gradient_checkpointing"], cfg["ref_vae_type"],
            cfg["ref_vae_chunk_size"])
    need = predict_gib(cfg["train_batch_size"], *args)
    if gpu is None:
        return MemoryPlan(None, None, None, None, None, "no GPU memory model for this profile")
    if need is None:
        return MemoryPlan(None, gpu, None, None, None, "no measured memory model yet (run taehv-launch bench)")
    if need <= gpu:
        return MemoryPlan(need, gpu, True, cfg["train_batch_size"], cfg["gradient_accumulation_steps"],
                          f"predicted peak {need:.1f} GiB of {gpu:.0f} GiB per GPU")
    best = max((m for m in range(1, cfg["train_batch_size"]) if (predict_gib(m, *args) or 1e9) <= gpu), default=None)
    target = cfg["train_batch_size"] * world_size * cfg["gradient_accumulation_steps"]
    accum = max(1, round(target / (best * world_size))) if best else None
    detail = (f"predicted peak {need:.1f} GiB exceeds {gpu:.0f} GiB per GPU: "
              + (f"use --set train_batch_size={best} --set gradient_accumulation_steps={accum} "
                 f"(global batch {best * world_size * accum})" if best else
                 "no micro-batch fits: lower n_frames/height/width or set gradient_checkpointing=True"))
    return MemoryPlan(need, gpu, False, best, accum, detail)

