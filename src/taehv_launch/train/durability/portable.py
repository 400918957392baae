"""A world-size-free copy of the model and AdamW state, so a checkpoint resumes on any layout.

DeepSpeed partitions the fp32 master weights and the AdamW moments by world size and ZeRO
stage, so its own checkpoint only loads on the layout that wrote it. Every checkpoint
therefore also holds, per parameter name:

- model.safetensors      full fp32 weights (the master copy under DeepSpeed) and buffers
- optimizer.safetensors  `exp_avg/<name>`, `exp_avg_sq/<name>` of the trained parameters (a frozen part,
                         plan/trainable.py, has none); metadata: the AdamW step

For the 11.28M-parameter TAEHV that is 45 + 90 MB per checkpoint (measured; the base decoder: with
decoder_arch=super TAEHV has 20.44M parameters at 16 latent channels against 11.32M, count_params).
Reading it back works on plain DDP and on DeepSpeed ZeRO-1/2/3 at any world size: the fp32 master values and
moments go into DeepSpeed's partitions through its `safe_set_*` API, then the training-precision
weights are refreshed from them. Both directions are collective under DeepSpeed.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ...errors import CheckpointError
from ...rundir.checkpoint import (
    EMA_FILE,
    MODEL_FILE,
    MOMENTS,
    OPTIMIZER_FILE,
    PORTABLE_FORMAT as FORMAT,
    CheckpointMismatch,
)
from ...compat import init_zero_optimizer_state
from ..model.ema import gathered


def gather(accelerator, model, optimizer) -> tuple[dict, dict, int] | None:
    """Collective. (fp32 weights and buffers by name, {moment/name: tensor}, AdamW step) on the
    main process, None on the others."""
    net = accelerator.unwrap_model(model)
    main = accelerator.is_main_process
    weights: dict[str, torch.Tensor] = {}
    moments: dict[str, torch.Tensor] = {}
    cpu32 = lambda t: t.detach().float().cpu().contiguous()
    if accelerator.state.deepspeed_plugin is None:
        if not main:
            return None
        weights = {n: cpu32(p) for n, p in net.named_parameters()}
        names, step = [n for n, p in net.named_parameters() if p.requires_grad], 0  # the optimizer's (trainable)
        for idx, st in optimizer.state_dict()["state"].items():
            step = int(st["step"])
            moments |= {f"{key}/{names[idx]}": cpu32(st[key]) for key in MOMENTS}
    else:
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

        base = model.optimizer.optimizer  # the engine's ZeRO optimizer wraps the torch AdamW
        has_state = len(base.state) > 0  # AdamW creates its state at the first step
        step = int(next(iter(base.state.values()))["step"]) if has_state else 0
        for name, p in net.named_parameters():
            if not p.requires_grad:  # frozen (plan/trainable.py): no fp32 master, no moments; gathered under ZeRO-3
                with gathered([p], 3 if hasattr(p, "ds_id") else 0):
                    weights[name] = cpu32(p)
                continue
            weights[name] = cpu32(safe_get_full_fp32_param(p))
            for key in MOMENTS if has_state else ():
                moments[f"{key}/{name}"] = cpu32(safe_get_full_optimizer_state(p, key))
    weights |= {n: cpu32(b) for n, b in net.named_buffers()}  # never partitioned
    return (weights, moments, step) if main else None


def save(folder: Path, gathered_state: tuple[dict, dict, int]) -> None:
    model_sd, moments, step = gathered_state
    save_file(model_sd, str(folder / MODEL_FILE))
    save_file(moments, str(folder / OPTIMIZER_FILE), metadata={"format": FORMAT, "step": str(step)})


def _read(folder: Path) -> tuple[dict, dict, int]:
    with safe_open(str(folder / MODEL_FILE), "pt") as f:
        model_sd = {k: f.get_tensor(k) for k in f.keys()}
    with safe_open(str(folder / OPTIMIZER_FILE), "pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != FORMAT:
            raise CheckpointError(
                f"{folder / OPTIMIZER_FILE} has format {meta.get('format')!r}, not "
                f"{FORMAT!r}: pass a checkpoint written by taehv-launch"
            )
        moments = {k: f.get_tensor(k) for k in f.keys()}
    return model_sd, moments, int(meta.get("step", 0))


def load(folder: Path, accelerator, model, optimizer, zero_stage: int) -> None:
    """Collective. Put the portable state into this run's model and optimizer, whatever the layout."""
    weights, moments, step = _read(folder)
    net = accelerator.unwrap_model(model)
    params, buffers = dict(net.named_parameters()), dict(net.named_buffers())
    missing = sorted(set(params) - set(weights)) + sorted(set(buffers) - set(weights))
    unexpected = sorted(set(weights) - set(params) - set(buffers))
    if missing or unexpected:
        raise CheckpointMismatch(f"missing {missing[:3]}, unexpected {unexpected[:3]}")
    for name, p in params.items():
        shape = p.ds_shape if hasattr(p, "ds_shape") else p.shape  # ZeRO-3 holds a partition
        if tuple(weights[name].shape) != tuple(shape):
            raise CheckpointMismatch(
                f"{name} has shape {tuple(weights[name].shape)} in the checkpoint, {tuple(shape)} in this model"
            )
    device = accelerator.device
    trained = {n: p for n, p in params.items() if p.requires_grad}  # frozen parts: weights only (plan/trainable.py)
    lacking = [n for n in trained if f"{MOMENTS[0]}/{n}" not in moments]
    if moments and lacking:
        raise CheckpointMismatch(
            f"it holds no optimizer state for {len(lacking)} of this run's trained parameters (e.g. {lacking[0]}), "
            f"frozen when it was written (freeze_encoder, use_ref_vae=False or a loss weight of 0); to train them, "
            f"start a new run from its weights: --set pretrained_model_path={folder / EMA_FILE}"
        )
    if accelerator.state.deepspeed_plugin is None:
        if moments:
            osd = optimizer.state_dict()
            osd["state"] = {
                i: {"step": torch.tensor(float(step)), **{key: moments[f"{key}/{n}"] for key in MOMENTS}}
                for i, n in enumerate(trained)
            }
            optimizer.load_state_dict(osd)
    else:
        zero_opt = model.optimizer  # DeepSpeed's ZeRO optimizer (the engine's)
        if moments:
            _materialise_adam_state(zero_opt, step)
        for name, p in trained.items():
            _set_master(p, weights[name].to(device), None)
            for key in MOMENTS if moments else ():
                _set_master(p, moments[f"{key}/{name}"].to(device), key)
    # the weights the forward pass uses (under DeepSpeed: the master values in training precision)
    with torch.no_grad(), gathered(list(params.values()), zero_stage, modifier_rank=0):
        if zero_stage != 3 or accelerator.is_main_process:
            for name, p in params.items():
                p.data.copy_(weights[name].to(device=p.device, dtype=p.dtype))
        for name, b in buffers.items():
            b.copy_(weights[name].to(device=b.device, dtype=b.dtype))


def _set_master(p: torch.nn.Parameter, full: torch.Tensor, key: str | None) -> None:
    """Write a full fp32 value (the master weight when key is None, else an AdamW moment) into
    this rank's part of DeepSpeed's partitioned state."""
    from deepspeed.utils import (
        safe_set_full_fp32_param,
        safe_set_full_optimizer_state,
        safe_set_local_fp32_param,
        safe_set_local_optimizer_state,
    )

    if not hasattr(p, "ds_id"):  # ZeRO-1/2: every rank holds the full parameter
        safe_set_full_fp32_param(p, full) if key is None else safe_set_full_optimizer_state(p, full, key)
        return
    # ZeRO-3: cut this rank's slice ourselves. DeepSpeed 0.19's full-value setter slices past the
    # end on the last rank when the partitions are padded (numel not divisible by the world size).
    import torch.distributed as dist

    group = getattr(p, "ds_process_group", None)
    rank, world, part = dist.get_rank(group=group), dist.get_world_size(group=group), p.ds_tensor.numel()
    flat = torch.zeros(part * world, dtype=full.dtype, device=full.device)
    flat[: full.numel()] = full.flatten()
    local = flat[rank * part : (rank + 1) * part]
    safe_set_local_fp32_param(p, local) if key is None else safe_set_local_optimizer_state(p, local, key)


def _materialise_adam_state(zero_opt, step: int) -> None:
    """Create AdamW's per-partition state as its first step would, and link it to the parameters.

    AdamW creates its state at the first step, and ZeRO-1/2 link each parameter to its slice of
    that state only then; before it `safe_set_full_optimizer_state` has nowhere to write.
    """
    base = zero_opt.optimizer
    # ZeRO-3 hands its flat fp32 partitions to AdamW one sub-group at a time; ZeRO-1/2 keep them in param_groups
    flats = getattr(zero_opt, "fp32_partitioned_groups_flat", None) or [
        flat for group in base.param_groups for flat in group["params"]
    ]
    for flat in flats:
        st = base.state[flat]
        for key in MOMENTS:
            if key not in st:
                st[key] = torch.zeros_like(flat, memory_format=torch.preserve_format)
        st["step"] = torch.tensor(float(step))
    init_zero_optimizer_state(zero_opt)


def carried_over(before: Path, after: Path, beta1: float, beta2: float) -> dict[str, float]:
    """Evidence that a resume from `before` kept the state, read from the next checkpoint `after`
    (one optimizer step later, at a negligible learning rate): the AdamW steps, the largest weight
    change, and how far the moments depart from one AdamW update m' = b1 m + (1 - b1) g,
    v' = b2 v + (1 - b2) g^2 with the same g (relative; ~1e-7 when the moments were carried over,
    of order 1 when they restarted from zero). Used by the tests and scripts/gpu_check.sh."""
    wa, ma, sa = _read(before)
    wb, mb, sb = _read(after)
    num = den = 0.0
    for key in ma:
        if key.startswith("exp_avg/"):
            name = key.split("/", 1)[1]
            g = (mb[key] - beta1 * ma[key]) / (1 - beta1)
            g2 = (mb[f"exp_avg_sq/{name}"] - beta2 * ma[f"exp_avg_sq/{name}"]) / (1 - beta2)
            num += float((g * g - g2).abs().sum())
            den += float(g2.abs().sum())
    return {
        "step_before": sa,
        "step_after": sb,
        "max_weight_change": max(float((wa[k] - wb[k]).abs().max()) for k in wa),
        "moment_mismatch": num / den if den else float("nan"),
    }
