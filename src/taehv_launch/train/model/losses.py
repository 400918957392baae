"""The distillation objective and the image metrics.

Frame alignment (SPEC.md "Frame alignment"): n input frames -> n/4 reference latents; the
decoder turns them into n frames and drops the first `frames_to_trim` (3), so its output
lines up with input frames [0, n-3). CogVideoX decodes an even latent count to all 4T
frames (upstream's skip_trim quirk), so then nothing is trimmed and the targets are all frames
(the family record's `trims` rule, plan/families.py).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...plan.families import Family
from ...plan.trainable import Trained


class DistillNet(nn.Module):
    """TAEHV behind one forward(), so DDP and DeepSpeed see every parameter used in one call."""

    def __init__(self, taehv: nn.Module, family: Family, trained: Trained | None = None):
        """trained (plan/trainable.py): the parts that get no gradient in this config are frozen here, before
        DDP or DeepSpeed wrap the model (DDP stops on a parameter without a gradient); None trains both."""
        super().__init__()
        self.taehv = taehv
        self.family = family
        self.encode = True  # a frozen encoder runs only where there are no reference latents to decode
        if trained is not None:
            taehv.encoder.requires_grad_(not trained.encoder)
            taehv.decoder.requires_grad_(not trained.decoder)
            self.encode = not trained.encoder

    def trims(self, n_latents: int) -> bool:
        return self.family.trims(n_latents)

    def forward(self, frames: torch.Tensor, latents: torch.Tensor | None):
        """frames NTCHW RGB in [0, 1]; latents NTCHW reference latents (raw), or None to decode
        TAEHV's own (detached) encodings.

        Returns (encoded latents, or None where a frozen encoder is not run; decoded frames NTCHW,
        unclamped: the loss sees gradients outside [0, 1]).
        """
        dtype = self.taehv.encoder[0].weight.dtype  # bf16 when DeepSpeed holds the weights in bf16
        enc = self.taehv.encode_video(frames.to(dtype)) if self.encode or latents is None else None
        if latents is None:  # use_ref_vae=False: decode our own encodings
            latents = enc.detach()
        dec = self.taehv.decode_video(latents.to(dtype), trim=self.trims(latents.shape[1]), clamp=False)
        return enc, dec


def reconstruction_loss(decoded: torch.Tensor, target: torch.Tensor, kind: str) -> torch.Tensor:
    """The reconstruction_loss key: "mse" (mean squared error) or "l1" (mean absolute error)."""
    return F.l1_loss(decoded, target) if kind == "l1" else F.mse_loss(decoded, target)


def decoder_targets(frames: torch.Tensor, decoded: torch.Tensor) -> torch.Tensor:
    """The input frames the decoder output lines up with: the first decoded.shape[1] frames."""
    t = decoded.shape[1]
    assert t <= frames.shape[1], f"decoder produced {t} frames from a {frames.shape[1]}-frame clip"
    return frames[:, :t]


def psnr_t(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """PSNR in dB of images in [0, 1] (a is clamped), as a 0-d tensor on their device (no host sync)."""
    mse = F.mse_loss(a.detach().float().clamp(0, 1), b.detach().float())
    return -10 * torch.log10(mse.clamp_min(1e-10))


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    """PSNR in dB of images in [0, 1] (a is clamped)."""
    return float(psnr_t(a, b))


def ssim(a: torch.Tensor, b: torch.Tensor, window: int = 11, sigma: float = 1.5) -> float:
    """Mean SSIM (Gaussian window, per channel) of NTCHW or NCHW images in [0, 1]."""
    a = a.detach().float().clamp(0, 1).flatten(0, -4)
    b = b.detach().float().flatten(0, -4)
    c = a.shape[1]
    window = min(window, a.shape[-1], a.shape[-2])  # tiny crops: a smaller window
    coords = torch.arange(window, dtype=torch.float32, device=a.device) - (window - 1) / 2
    g = torch.exp(-(coords**2) / (2 * sigma**2))
    g = g / g.sum()
    kernel = (g[:, None] * g[None, :]).expand(c, 1, window, window).contiguous()

    def blur(x):
        return F.conv2d(x, kernel, groups=c)

    mu_a, mu_b = blur(a), blur(b)
    var_a = blur(a * a) - mu_a**2
    var_b = blur(b * b) - mu_b**2
    cov = blur(a * b) - mu_a * mu_b
    c1, c2 = 0.01**2, 0.03**2
    s = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return s.mean().item()
