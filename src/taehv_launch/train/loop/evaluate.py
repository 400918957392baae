"""Validation: the EMA TAEHV on held-out clips, sharded over ranks, measured as `taehv-launch eval` measures
(metrics.py clip_scores: PSNR, SSIM, flicker, LPIPS where its weights are on this machine), and what it
leaves: the val/* scalars and sample clips (trackers.py), one log line, <run>/validation.json (status reads
it: rundir/progress.py) and best_model/ at a new best PSNR."""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from ...plan.schema import Config
from ...rundir.progress import write_validation
from ..durability.progress import PROGRESS
from ..model.losses import decoder_targets
from .metrics import clip_scores, load_lpips
from .speed import eager_reference

_LPIPS: dict[str, tuple[Callable | None, str]] = {}  # device -> load_lpips(device), loaded once per process


def lpips_for(device: torch.device, log: Callable[[str], None]) -> tuple[Callable | None, str]:
    """LPIPS on `device` (fn, "") or (None, why), loaded at the first validation; the why is logged once."""
    if str(device) not in _LPIPS:
        _LPIPS[str(device)] = load_lpips(device)
        if _LPIPS[str(device)][1]:
            log(f"validation: {_LPIPS[str(device)][1]} (val/lpips is not logged)")
    return _LPIPS[str(device)]


@torch.no_grad()
def evaluate(
    ema: torch.nn.Module,
    ref,
    val_ds,
    cfg: Config,
    device: torch.device,
    rank: int,
    world: int,
    lpips_fn: Callable | None = None,
) -> tuple[dict[str, Any], list[tuple[torch.Tensor, torch.Tensor]]]:
    """({psnr, ssim, flicker, lpips, clips}: means over every rank's clips, None where no clip has the
    metric, LPIPS only when every rank measured it; this rank's first num_sample_clips (target, decoded)
    pairs). Collective when world > 1: every rank runs the same number of batches."""
    n_batches = max(1, min(cfg.max_validation_batches, math.ceil(len(val_ds) / world)))
    sums = torch.zeros(7, device=device, dtype=torch.float64)  # psnr, ssim, clips, flicker, its clips, lpips, its
    samples = []
    for b in range(n_batches):
        idx = (b * world + rank) % len(val_ds)
        item = val_ds[idx]
        frames = item["frames"][None].to(device).float().div_(255.0)
        if item.get("latents") is not None:  # a latent cache's validation clip
            latents = item["latents"][None].to(device)
        else:
            with eager_reference(ref):  # batch 1: no compile for a shape used only here
                latents = ref.encode(frames) if ref is not None else ema.encode_video(frames)
        dec = ema.decode_video(latents.float(), clamp=True)  # the family's trim rule: TAEHV's own (build_taehv)
        target = decoder_targets(frames, dec)
        s = clip_scores(dec, target, lpips_fn)
        fl, lp = s["flicker"], s["lpips"]
        row = [s["psnr"], s["ssim"], 1.0, fl or 0.0, fl is not None, lp or 0.0, lp is not None]
        sums += torch.tensor(row, device=device, dtype=torch.float64)
        if len(samples) < cfg.num_sample_clips:
            samples.append((target[0].cpu(), dec[0].cpu()))
    if world > 1:
        dist.all_reduce(sums)
    v = sums.tolist()
    return {
        "psnr": v[0] / v[2],
        "ssim": v[1] / v[2],
        "flicker": v[3] / v[4] if v[4] else None,
        "lpips": v[5] / v[6] if v[6] and v[6] == v[2] else None,  # a rank without LPIPS: none
        "clips": int(v[2]),
    }, samples


def _num(x: float | None, digits: int) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def log_line(m: dict[str, Any], step: int) -> str:
    """`validation at step N: psnr P dB, ssim S, flicker F, lpips L (EMA model, K clips)`: status reads
    it back from launch.log where there is no validation.json (rundir/progress.py VALIDATION_LINE)."""
    return (
        f"validation at step {step}: psnr {m['psnr']:.2f} dB, ssim {m['ssim']:.4f}, flicker {_num(m['flicker'], 4)}, "
        f"lpips {_num(m['lpips'], 4)} (EMA model, {m['clips']} clip{'s' if m['clips'] != 1 else ''})"
    )


@torch.no_grad()
def validate(tr) -> float:
    """The trainer's validation (`tr`: train/loop/trainer.py Trainer): the EMA model on the held-out clips,
    sharded over ranks (every rank runs the same count); returns the PSNR."""
    with PROGRESS.phase("validation"), tr.clock.outside():
        lpips_fn, lpips_note = lpips_for(tr.device, tr.log)
        m, samples = evaluate(tr.ema.model, tr.ref, tr.val_ds, tr.cfg, tr.device, tr.rank, tr.world, lpips_fn)
        step, st = tr.state.step, tr.state
        tr.trackers.scalars({f"val/{k}": m[k] for k in ("psnr", "ssim", "flicker", "lpips") if m[k] is not None}, step)
        if tr.trackers.active:
            for i, (real, fake) in enumerate(samples):  # rows: input frames, reconstruction
                grid = torch.cat([torch.cat(list(real), -1), torch.cat(list(fake), -1)], -2)
                tr.trackers.image(f"val/clip_{i}", grid, step)
                side = torch.cat([real, fake], -1)  # T x 3 x H x 2W: input | reconstruction
                tr.trackers.video(f"val/video_{i}", side, step)
            tr.trackers.flush()
        tr.log(log_line(m, step))
        if m["psnr"] > st.best_psnr and step > 0:  # step 0: the untrained baseline
            st.best_psnr, st.best_step = m["psnr"], step
            tr.export("best_model")
        if tr.acc.is_main_process:
            best = st.best_step > 0 and st.best_psnr >= 0
            finite = {k: (v if v is None or math.isfinite(v) else None) for k, v in m.items()}  # NaN: not JSON
            record = {"step": step, "time": time.time(), "model": "ema", **finite, "lpips_note": lpips_note or None}
            record |= {"best_step": st.best_step if best else None, "best_psnr": st.best_psnr if best else None}
            with contextlib.suppress(OSError):  # a full disk is said once, by the next checkpoint
                write_validation(tr.run_dir, record)
    return m["psnr"]


def gif_bytes(frames: torch.Tensor, fps: int = 8) -> bytes:
    """T x 3 x H x W frames in [0, 1] as an animated GIF (Pillow, which diffusers already needs)."""
    import io

    from PIL import Image

    arrays = frames.mul(255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    images = [Image.fromarray(a) for a in arrays]
    out = io.BytesIO()
    images[0].save(out, format="GIF", save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    return out.getvalue()
