"""One line at the start of training: how large the reference latents TAEHV learns are.

A model trained on latents in the wrong space (raw Wan latents instead of (z - latents_mean) /
latents_std, say) trains without any error and decodes the diffusion model's latents blurry
(upstream taehv issue #22, where the maintainer's advice was to print the latents' RMS). The
normalized latents of the released VAEs sit near unit scale: upstream's
examples/test_latents_wan.pth has RMS 0.94 and mean 0.03. So the trainer sums the first micro-
batches' latents on the device (no host sync per step), reads them once and logs their RMS and mean,
as a warning when they are far from that scale.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

# "Far from unit scale": bounds of judgment, not of measurement. The raw latents this catches are
# 2-3x off (Wan 2.1's per-channel stds run 1.1-3.3 and means up to 1.6; HunyuanVideo's scaling_factor
# is 0.477); normalized ones measured 0.94 (above).
RMS_RANGE = (0.5, 2.0)
MEAN_MAX = 0.5


def scale_line(rms: float, mean: float, batches: int, space: str, demo: bool) -> tuple[str, bool]:
    """(the line, whether it is a warning)."""
    line = f"latents: RMS {rms:.3f}, mean {mean:+.3f} over this rank's first {batches} micro-batches ({space})"
    if demo:
        return line + "; the demo's randomly initialised tiny VAE: its scale means nothing", False
    if RMS_RANGE[0] <= rms <= RMS_RANGE[1] and abs(mean) <= MEAN_MAX:
        return line, False
    return (
        f"warning: {line}: far from unit scale (RMS {RMS_RANGE[0]}-{RMS_RANGE[1]}, |mean| <= {MEAN_MAX} expected); "
        "a TAEHV trained on wrongly normalized latents decodes the diffusion model's latents blurry without any "
        "error: check ref_vae_type, ref_vae_path and ref_latent_mean/std (docs/families.md)",
        True,
    )


class LatentScale:
    """Sums of the first `batches` micro-batches' latents; logs scale_line once, then does nothing."""

    def __init__(self, log: Callable[[str], None], space: str, batches: int = 8, demo: bool = False):
        self.log, self.space, self.batches, self.demo = log, space, batches, demo
        self.left, self.count, self.sums = batches, 0, None

    def add(self, latents: torch.Tensor | None) -> None:
        if self.left <= 0 or latents is None:
            return
        z = latents.detach().float()
        sums = torch.stack([z.sum(), z.square().sum()])
        self.sums = sums if self.sums is None else self.sums + sums
        self.count += z.numel()
        self.left -= 1
        if self.left == 0:
            total, squares = self.sums.tolist()  # the one host sync
            self.log(
                scale_line(math.sqrt(squares / self.count), total / self.count, self.batches, self.space, self.demo)[0]
            )


def for_run(cfg, ref, log: Callable[[str], None]) -> LatentScale:
    """The trainer's: over min(8, all) micro-batches, in the space of the loaded reference VAE (or, training
    from a latent cache without one, the space the cache was written in: its fingerprint matched this run)."""
    from ...plan.demo import demo_cache_dir, demo_paths
    from ...plan.families import get_family

    if ref is not None:
        space = ref.latent_space
    elif cfg.ref_latent_mean:
        space = "(z - ref_latent_mean) / ref_latent_std as given"
    else:
        space = get_family(cfg.ref_vae_type).latent_space()
    demo = cfg.ref_vae_path == demo_paths(demo_cache_dir(), cfg.ref_vae_type, cfg.latent_channels)[1]
    return LatentScale(log, space, min(8, cfg.max_train_steps * cfg.gradient_accumulation_steps), demo)
