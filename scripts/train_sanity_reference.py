"""Train a small CogVideoX-architecture VAE as a plain autoencoder, to be the learning-sanity teacher.

python3 scripts/train_sanity_reference.py DATA_ROOT OUT_DIR [STEPS] [SECONDS] [POOL]   (GPU machine)

Why: no trained reference weights can be downloaded where the GPU runs, and a reference VAE with
random weights turns every clip into a random projection that no decoder can invert well: TAEHV's
held-out PSNR then flattens at ~13 dB (docs/benchmarks.md). A teacher whose latents hold the
picture makes the sanity check test what it should: that distillation learns.

The teacher keeps CogVideoX's real compression (8x space, 4x time, 16 channels; narrower blocks so
it trains in minutes) and sees only the training split of DATA_ROOT, drawn by the trainer's own rule
(split_train_val with the default seed and validation settings), so the held-out video stays unseen
by both the teacher and TAEHV. It is saved with save_pretrained and loads like any diffusers VAE.
Prints the teacher's own reconstruction PSNR on the training clips and on the held-out video.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    """a, b in [-1, 1]: PSNR of the [0, 1] images (the trainer's own losses.psnr)."""
    from taehv_launch.train.model.losses import psnr as psnr01

    return psnr01((a + 1) / 2, (b + 1) / 2)


def main() -> None:
    import diffusers

    from taehv_launch.plan.schema import DEFAULTS
    from taehv_launch.train.data.clips import VideoClipDataset, collate, worker_init_fn
    from taehv_launch.train.data.probe import usable_entries
    from taehv_launch.dataindex.index import build_index, split_train_val

    t_start = time.perf_counter()
    root, out = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 3000
    budget = float(sys.argv[4]) if len(sys.argv) > 4 else 240.0
    pool = int(sys.argv[5]) if len(sys.argv) > 5 else 2048
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    entries = build_index(root)
    train_e, val_e = split_train_val(
        entries, DEFAULTS["validation_fraction"], DEFAULTS["max_validation_videos"], DEFAULTS["seed"]
    )
    val_e = usable_entries(val_e, 12)
    print(f"teacher: {len(train_e)} training videos, held out: {[e.path for e in val_e]}", flush=True)
    common = dict(height=128, width=128, n_frames=12, min_frame_delta=1, max_frame_delta=2, seed=7)
    train = VideoClipDataset(train_e, random_flip=True, train=True, **common)
    held = VideoClipDataset(val_e, train=False, **common)
    # A pool of clips decoded once by the trainer's dataset (random starts, strides, crops, flips), kept on
    # the GPU: the teacher's steps are then not bound by decoding 720p-1080p sources.
    loader = DataLoader(
        train, batch_size=16, sampler=range(pool), num_workers=14, collate_fn=collate, worker_init_fn=worker_init_fn
    )
    clips = torch.cat([b["frames"].to(dev) for b in loader])
    print(f"teacher: {len(clips)} training clips decoded in {time.perf_counter() - t_start:.0f} s", flush=True)
    gen = torch.Generator(device=dev).manual_seed(0)

    vae = (
        diffusers.AutoencoderKLCogVideoX(
            block_out_channels=(64, 128, 128, 256), latent_channels=16, layers_per_block=1, norm_num_groups=32
        )
        .to(dev)
        .train()
    )
    opt = torch.optim.AdamW(vae.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-4, total_steps=steps, pct_start=0.05)

    def as_input(frames: torch.Tensor) -> torch.Tensor:  # uint8 NTCHW -> NCTHW in [-1, 1], the first 1 + 4k = 9
        x = frames[:, :9].to(dev, non_blocking=True).float() / 127.5 - 1
        return x.permute(0, 2, 1, 3, 4).contiguous()

    def held_psnr() -> float:
        vae.eval()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            x = as_input(collate([held[i] for i in range(len(held))])["frames"])
            y = vae.decode(vae.encode(x).latent_dist.mode()).sample
        vae.train()
        return psnr(y, x)

    t0, step = time.perf_counter(), 0
    while step < steps and time.perf_counter() - t0 < budget:
        step += 1
        x = as_input(clips[torch.randint(len(clips), (8,), device=dev, generator=gen)])
        with torch.autocast("cuda", dtype=torch.bfloat16):
            post = vae.encode(x).latent_dist
            y = vae.decode(post.mode()).sample
        rec = F.mse_loss(y.float(), x)
        loss = rec + 1e-6 * post.kl().mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 250 == 0 or step == 1:
            print(
                f"teacher step {step}: train psnr {psnr(y.detach(), x):.2f} dB, held-out psnr {held_psnr():.2f} dB, "
                f"{time.perf_counter() - t0:.0f} s",
                flush=True,
            )
    print(
        f"teacher done after {step} steps, {time.perf_counter() - t0:.0f} s: held-out psnr {held_psnr():.2f} dB",
        flush=True,
    )
    vae.eval().save_pretrained(out)


if __name__ == "__main__":
    main()
