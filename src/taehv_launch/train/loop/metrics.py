"""Quality metrics of decoded video against its target, pure torch: what validation logs (evaluate.py)
and what `taehv-launch eval` prints (quality/measure.py), both through clip_scores, so the two measure
the same thing. Frames are NTCHW in [0, 1]; the decoded side is clamped.

- PSNR and SSIM: train/model/losses.py's (the training loss module owns them; re-exported here).
- flicker: the mean absolute error between the decoded and the target frame-to-frame differences,
  mean |(d[t+1] - d[t]) - (x[t+1] - x[t])| over t, pixels and channels, in [0, 1] units (0 = the
  decoded video changes from frame to frame exactly as the target does). A per-frame metric cannot
  see temporal shimmer; this one can.
- LPIPS (AlexNet): only when the `lpips` package and its backbone's weights are already on this
  machine (nothing is downloaded); otherwise `load_lpips` returns None and one note saying why.
"""

from __future__ import annotations

import importlib.util
import math
import os
from typing import Callable

import torch

from ..model.losses import psnr, ssim

__all__ = ["psnr", "ssim", "flicker", "load_lpips", "clip_scores", "mean_scores", "METRICS", "LPIPS_BACKBONE"]

METRICS = ("psnr", "ssim", "lpips", "flicker")
LPIPS_BACKBONE = "alexnet-owt-7be5be79.pth"  # torchvision's AlexNet weights, as lpips.LPIPS(net="alex") loads them


@torch.no_grad()
def flicker(decoded: torch.Tensor, target: torch.Tensor) -> float:
    """Mean absolute error of the frame-to-frame differences (NTCHW, T >= 2; NaN for one frame)."""
    if decoded.shape[1] < 2:
        return float("nan")
    d = decoded.detach().float().clamp(0, 1)
    x = target.detach().float()
    return float(((d[:, 1:] - d[:, :-1]) - (x[:, 1:] - x[:, :-1])).abs().mean())


def lpips_missing() -> str | None:
    """Why LPIPS cannot run here without a download, or None when it can."""
    if importlib.util.find_spec("lpips") is None:
        return "the lpips package is not installed (pip install lpips)"
    if importlib.util.find_spec("torchvision") is None:
        return "torchvision (lpips' AlexNet) is not installed"
    backbone = os.path.join(torch.hub.get_dir(), "checkpoints", LPIPS_BACKBONE)
    if not os.path.isfile(backbone):
        return f"torchvision's AlexNet weights are not at {backbone} (nothing is downloaded)"
    return None


def load_lpips(device: torch.device | str) -> tuple[Callable[[torch.Tensor, torch.Tensor], float] | None, str]:
    """(fn(decoded, target) -> mean LPIPS over frames, "") or (None, why) when it is not available."""
    why = lpips_missing()
    if why:
        return None, f"LPIPS n/a: {why}"
    try:
        import lpips

        net = lpips.LPIPS(net="alex", verbose=False).to(device).eval()
    except Exception as exc:  # a broken install: the metric is left out, the evaluation goes on
        return None, f"LPIPS n/a: lpips failed to load ({type(exc).__name__}: {str(exc)[:120]})"

    @torch.no_grad()
    def fn(decoded: torch.Tensor, target: torch.Tensor) -> float:
        d = decoded.detach().float().clamp(0, 1).flatten(0, 1) * 2 - 1  # NT x C x H x W in [-1, 1]
        x = target.detach().float().flatten(0, 1) * 2 - 1
        return float(torch.cat([net(d[i : i + 16], x[i : i + 16]).flatten() for i in range(0, len(d), 16)]).mean())

    return fn, ""


def clip_scores(
    decoded: torch.Tensor, target: torch.Tensor, lpips_fn: Callable[[torch.Tensor, torch.Tensor], float] | None
) -> dict[str, float | None]:
    """METRICS of one decoded clip against its target: None for LPIPS without lpips_fn and for flicker
    of a one-frame clip (it has no frame-to-frame difference)."""
    fl = flicker(decoded, target)
    return {
        "psnr": psnr(decoded, target),
        "ssim": ssim(decoded, target),
        "lpips": lpips_fn(decoded, target) if lpips_fn is not None else None,
        "flicker": fl if math.isfinite(fl) else None,
    }


def mean_scores(rows: list[dict[str, float | None]]) -> dict[str, float | None]:
    """Each metric's mean over the clips that have it; None where none has."""
    out: dict[str, float | None] = {}
    for k in METRICS:
        vals = [r[k] for r in rows if r.get(k) is not None]
        out[k] = sum(vals) / len(vals) if vals else None
    return out
