"""A training clip's FLOPs, counted once at start-up; the run's Rate (plan/flops.py) that turns each log
window's clips/s into TFLOP/s per GPU and MFU (the log line, the trackers, progress.json, speed.json).

torch's FLOP counter (torch.utils.flop_counter: convolutions, matrix products and attention, 2 FLOPs per
multiply-accumulate) runs one forward + backward of the run's own modules - TAEHV (build_taehv from the
run's config), Seraena's discriminator and the reference VAE's class from its config - on the meta
device: shapes only, no weights, no memory, no arithmetic, nothing of the run's state touched. Counted
as executed by one training clip:

- TAEHV: encode and decode forward, and the backward of the losses (no weight gradient for the frames'
  first layer input, as in training). Gradient checkpointing's recomputation is not counted (MFU counts
  the model's FLOPs, as PaLM's definition does; the recompute would be hardware FLOPs).
- Seraena: the discriminator's step (a forward of the grouped fakes/reals and the backward to its
  weights) and the correction (the reals' features, the fakes' features and their gradient w.r.t. the
  fakes), on the Seraena crop when seraena_crop is set.
- The reference encode (forward only), when every clip is encoded online: not with a latent cache
  (latent_cache_encode=never or missing; =always encodes each clip and is counted).

Not counted: the optimizer, the EMA, losses, norms and activations (elementwise), and validation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from ...errors import one_line
from ...plan.families import get_family
from ...plan.flops import ClipFlops, Rate
from ...plan.schema import config_dict

_RATE: list[Rate] = []  # this process's run: set once at start-up by SpeedLog.count_flops (timing.py)


def current_rate() -> Rate | None:
    """The Rate of this process's run, once counted (None before, and in a process that trains nothing)."""
    return _RATE[-1] if _RATE else None


def set_rate(rate: Rate | None) -> None:
    _RATE.clear()
    if rate is not None:
        _RATE.append(rate)


class _NoModules:
    """FlopCounterMode's per-module tracker, doing nothing: every count goes to "Global"."""

    parents = {"Global"}

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


class Counter(FlopCounterMode):
    """torch's FLOP counter without its per-module tracker, whose backward hooks make autograd.grad() on a
    leaf tensor fail ("A leaf node was passed to _will_engine_execute_node"): Seraena's correction is one."""

    def __init__(self) -> None:
        super().__init__(display=False)
        self.mod_tracker = _NoModules()

    @property
    def total(self) -> int:
        return int(self.get_total_flops())


def _get(config: Any, key: str):
    if isinstance(config, Mapping):
        return config[key]
    return getattr(config, key)


def count_clip_flops(
    config: Any, ref_model: torch.nn.Module | None, reference_note: str = "reference encode: none"
) -> ClipFlops:
    """FLOPs of one training clip at the config's shapes (a Config or a config dict). ref_model: the
    reference VAE's diffusers module whose encode runs online for every clip, or None (reference_note
    says why it is not counted)."""
    from ..model.losses import DistillNet, decoder_targets
    from ..model.taehv import build_taehv

    keys = ("n_frames", "height", "width", "ref_vae_type", "latent_channels", "use_ref_vae", "use_seraena")
    n, h, w, kind, channels, distilling, seraena = (_get(config, k) for k in keys)
    family = get_family(kind)
    meta = torch.device("meta")
    whole = dict(config) if isinstance(config, Mapping) else config_dict(config)
    model_cfg = whole | {"pretrained_model_path": "", "gradient_checkpointing": False}  # the shape, no weights
    with meta:
        net = DistillNet(build_taehv(model_cfg).train(), family)
    frames = torch.zeros(1, n, 3, h, w, device=meta)
    s = family.space_stride
    latents = torch.zeros(1, family.latent_frames(n), channels, h // s, w // s, device=meta) if distilling else None
    with Counter() as taehv:
        enc, dec = net(frames, latents)
        target = decoder_targets(frames, dec)
        loss = F.mse_loss(dec, target)
        if distilling:  # the encoder loss (its weight may be 0: the backward still runs, as in training)
            loss = loss + F.mse_loss(enc, latents)
        loss.backward()
    shape = f"{n} x {h}x{w}"
    ser = 0
    if seraena:
        crop = _get(config, "seraena_crop")
        ctx = latents if latents is not None else enc.detach()
        ser = _seraena_flops(target.detach(), dec.detach(), ctx, channels, _get(config, "n_seraena_frames"), crop)
        if 0 < crop < max(h, w):
            shape += f", Seraena crop {crop}"
    ref = _reference_flops(ref_model, kind, n, h, w) if ref_model is not None else 0
    return ClipFlops(float(taehv.total), float(ser), float(ref), shape, reference_note)


def _seraena_flops(
    target: torch.Tensor, dec: torch.Tensor, latents: torch.Tensor, channels: int, per_group: int, crop: int
) -> int:
    """One clip's Seraena work as step_and_make_targets does it (train/model/seraena.py), on meta tensors."""
    from ..model.seraena import VideoSeraena, seraena_crop

    with torch.device("meta"):
        ser = VideoSeraena(channels, frames_per_group=per_group, buffer_bytes=0)
    ser._autocast = lambda device: contextlib.nullcontext()  # no autocast on the meta device; same FLOPs
    real, fake, ctx = seraena_crop(target, dec, latents, crop, torch.Generator().manual_seed(0))
    with Counter() as c:
        real_g, fake_g = ser._group(real), ser._group(fake)
        ctx_g = ctx.mean(1).repeat_interleave(real_g.shape[0], 0)
        scores = ser.disc(fake_g, ctx_g)  # the discriminator's step: forward, backward to its weights
        F.mse_loss(scores, torch.zeros_like(scores)).backward()
        ser._make_correction(real_g, fake_g, ctx_g)  # reals' features, fakes' features and their input gradient
    return c.total


def _reference_flops(ref_model: torch.nn.Module, kind: str, n: int, h: int, w: int) -> int:
    """The reference encode of one clip (the family's ref_frames of it), forward only, as refvae.encode
    calls it: the same diffusers class from the same config, built on the meta device, frozen alike."""
    from ..reference.refvae import freeze

    family = get_family(kind)
    with torch.device("meta"):
        model = freeze(type(ref_model).from_config(ref_model.config), family)
    dtype = next(model.parameters()).dtype
    x = torch.zeros(1, 3, family.ref_frames(n), h, w, device="meta", dtype=dtype)  # NCTHW
    with torch.no_grad(), Counter() as c:
        model.encode(x).latent_dist.mode()
    return c.total


def reference_online(cfg: Any, ref: Any) -> tuple[torch.nn.Module | None, str]:
    """(the reference VAE module whose encode every clip runs, or None, and why not)."""
    if ref is None:
        why = "use_ref_vae=False" if not _get(cfg, "use_ref_vae") else "the latents come from the latent cache"
        return None, f"no reference encode ({why})"
    if _get(cfg, "latent_cache") and _get(cfg, "latent_cache_encode") != "always":
        return None, "reference encode not counted (latent cache: only the views it lacks are encoded online)"
    return ref.model, ""


def run_rate(
    cfg: Any, ref: Any, device: torch.device, processes: int, log: Callable[[str], None]
) -> tuple[ClipFlops, Rate] | None:
    """Count one clip's FLOPs for this run, say it in one line and return them with the run's Rate. A model
    the meta device cannot run is said in one line (no TFLOP/s or MFU then): the count never stops a run."""
    model, note = reference_online(cfg, ref)
    try:
        clip = count_clip_flops(cfg, model, note)
    except Exception as exc:  # a diffusers or torch version whose ops the meta device lacks
        why = one_line(f"{type(exc).__name__}: {exc}")[:200]
        log(f"speed: FLOPs not counted ({why}); no TFLOP/s or MFU in the log lines")
        return None
    on_gpu = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if on_gpu else "cpu"
    rate = Rate.of(clip.total, processes, name, on_gpu)
    peak = (
        f"peak {rate.peak_tflops:g} TFLOP/s per GPU ({name}, BF16 dense)"
        if rate.peak_tflops is not None
        else f"MFU n/a ({rate.why_no_mfu()})"
    )
    log(f"speed: {clip.line()}; {peak}")
    return clip, rate
