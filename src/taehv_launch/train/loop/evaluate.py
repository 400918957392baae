"""Validation: the EMA TAEHV on held-out clips, sharded over ranks, as PSNR/SSIM and sample clips."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ...plan.schema import Config
from ..model.losses import decoder_targets, psnr, ssim
from .speed import eager_reference


@torch.no_grad()
def evaluate(
    ema: torch.nn.Module, ref, val_ds, cfg: Config, device: torch.device, rank: int, world: int
) -> tuple[float, float, list[tuple[torch.Tensor, torch.Tensor]]]:
    """(PSNR, SSIM averaged over every rank's clips, this rank's first num_sample_clips (target, decoded)
    pairs). Collective when world > 1: every rank runs the same number of batches."""
    n_batches = max(1, min(cfg.max_validation_batches, math.ceil(len(val_ds) / world)))
    sums = torch.zeros(3, device=device, dtype=torch.float64)
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
        sums += torch.tensor([psnr(dec, target), ssim(dec, target), 1.0], device=device, dtype=torch.float64)
        if len(samples) < cfg.num_sample_clips:
            samples.append((target[0].cpu(), dec[0].cpu()))
    if world > 1:
        dist.all_reduce(sums)
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item(), samples


def gif_bytes(frames: torch.Tensor, fps: int = 8) -> bytes:
    """T x 3 x H x W frames in [0, 1] as an animated GIF (Pillow, which diffusers already needs)."""
    import io

    from PIL import Image

    arrays = frames.mul(255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    images = [Image.fromarray(a) for a in arrays]
    out = io.BytesIO()
    images[0].save(out, format="GIF", save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    return out.getvalue()
