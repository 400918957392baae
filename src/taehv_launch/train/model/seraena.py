"""Seraena for video: adversarial correction targets for the TAEHV decoder.

After madebyollin/seraena. A patch discriminator, conditioned on the latents, learns to
tell decoded ("fake") frames from real ones; the gradient of its features gives each fake
a correction toward the real distribution, and the decoder is trained with
MSE(decoded, fake + correction). For video, `frames_per_group` consecutive frames are
stacked on channels into one image (3 frames -> 9 channels), so the discriminator also
judges short-range motion, and the context is the clip's time-averaged latent.

Differences from upstream, for multi-GPU training at 480x720:
* the replay buffer of past fakes is bounded in bytes, not entries;
* all randomness comes from a torch.Generator owned here (checkpointable, reproducible);
* with torch.distributed initialised, gradients are averaged and BatchNorm running stats
  all-reduced after every step, so every rank holds an identical discriminator.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def conv_bn_act(n_in: int, n_out: int, stride: int = 1) -> nn.Sequential:
    k = 4 if stride == 2 else 3  # 4x4 / stride 2 halves H and W exactly with padding 1
    return nn.Sequential(
        nn.Conv2d(n_in, n_out, k, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(n_out),
        nn.ReLU(inplace=True),
    )


class PatchDiscWithContext(nn.Module):
    """Patch discriminator scoring images given a context (latent) image.

    x: BCHW in [0, 1] (C = c_im); ctx: Bchw (any size, resized to x's).
    Returns B x n_blocks x H/8 x W/8 scores: each block's 1x1 projection averaged to the
    same grid, so shallow (texture) and deep (structure) features all vote.
    """

    def __init__(self, c_im: int = 9, c_ctx: int = 16):
        super().__init__()
        self.blocks = nn.Sequential(
            conv_bn_act(c_im + c_ctx, 64),
            conv_bn_act(64, 128, stride=2),
            conv_bn_act(128, 256, stride=2),
            conv_bn_act(256, 512, stride=2),
            conv_bn_act(512, 512),
            conv_bn_act(512, 512),
        )
        self.proj = nn.ModuleList(nn.Conv2d(b[0].out_channels, 1, 1, bias=False) for b in self.blocks)

    def forward(self, x, ctx):
        assert x.shape[-2] >= 8 and x.shape[-1] >= 8, f"images must be at least 8x8, got {tuple(x.shape)}"
        out_hw = (x.shape[-2] // 8, x.shape[-1] // 8)
        x = torch.cat([x * 2 - 1, F.interpolate(ctx, x.shape[-2:])], 1)
        out = []
        for block, proj in zip(self.blocks, self.proj):
            x = block(x)
            out.append(F.adaptive_avg_pool2d(proj(x), out_hw))
        return torch.cat(out, 1)


class ReplayBuffer:
    """Past (fake, ctx) pairs, bounded in bytes; once full, new pairs overwrite random ones."""

    def __init__(self, max_bytes: int, dtype: torch.dtype | None):
        self.max_bytes = int(max_bytes)
        self.dtype = dtype  # None: keep the input dtype
        self.items: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.nbytes = 0

    @staticmethod
    def _size(item) -> int:
        return sum(t.numel() * t.element_size() for t in item)

    def add(self, fake: torch.Tensor, ctx: torch.Tensor, gen: torch.Generator) -> None:
        """fake: CHW, ctx: chw (one grouped sample)."""
        dtype = self.dtype or fake.dtype
        item = (fake.detach().to(dtype, copy=True), ctx.detach().to(dtype, copy=True))
        if self.items and (item[0].shape != self.items[0][0].shape or item[1].shape != self.items[0][1].shape):
            self.clear()  # resolution changed: old fakes cannot be batched with new ones
        size = self._size(item)
        if self.nbytes + size <= self.max_bytes:
            self.items.append(item)
            self.nbytes += size
        elif self.items:
            i = int(torch.randint(len(self.items), (), generator=gen))
            self.items[i][0].copy_(item[0])
            self.items[i][1].copy_(item[1])

    def sample(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(len(self.items), (n,), generator=gen).tolist()
        return (torch.stack([self.items[i][0] for i in idx]), torch.stack([self.items[i][1] for i in idx]))

    def clear(self) -> None:
        self.items, self.nbytes = [], 0


class VideoSeraena(nn.Module):
    def __init__(
        self,
        latent_channels: int,
        frames_per_group: int = 3,
        lr: float = 3e-4,
        buffer_bytes: int = 1 << 30,
        autocast_dtype: torch.dtype | None = None,
        seed: int = 0,
        buffer_dtype: torch.dtype | None = torch.bfloat16,
        correction_eps: float = 1e-12,
    ):
        """Discriminator, its AdamW, and the replay buffer of past fakes.

        Usage in a training loop (the decoder trains on reference latents):
            fake = taehv.decode_video(ref_latents, clamp=False)       # NTCHW, T = 9
            targets, stats = seraena.step_and_make_targets(frames[:, :9], fake, ref_latents)
            loss = F.mse_loss(fake, targets)

        Args:
            latent_channels: channels of the context latents.
            frames_per_group: consecutive frames stacked into one discriminator image.
            lr: discriminator AdamW learning rate (betas (0.9, 0.99) as upstream).
            buffer_bytes: replay-buffer bound per rank; 0 disables replay (fresh fakes only).
            autocast_dtype: None (fp32), torch.bfloat16, or torch.float16 (adds a GradScaler).
            seed: seeds the discriminator init and this object's own generator (replay and
                real/fake choices). Ranks may pass different seeds: weights are broadcast
                from rank 0 at the first distributed step anyway.
            buffer_dtype: dtype of stored fakes (None: the input dtype).
            correction_eps: added to the correction's std before dividing. Upstream uses 1e-5,
              which is larger than the gradient's std on full-size frames (on an H200 at
              480x720 the Seraena loss stayed at 1e-4..5e-2 instead of ~1), silently turning
              the corrections off; 1e-12 only guards against a zero gradient.
        """
        super().__init__()
        self.latent_channels = latent_channels
        self.frames_per_group = frames_per_group
        self.autocast_dtype = autocast_dtype
        self.correction_eps = correction_eps
        with torch.random.fork_rng(devices=[]):  # init independent of (and not touching) global RNG
            torch.manual_seed(seed)
            self.disc = PatchDiscWithContext(c_im=3 * frames_per_group, c_ctx=latent_channels)
        self.opt = torch.optim.AdamW(self.disc.parameters(), lr, betas=(0.9, 0.99))
        self.scaler: torch.amp.GradScaler | None = None  # made on first use (fp16 only), on the right device
        self.buffer = ReplayBuffer(buffer_bytes, buffer_dtype)
        self.gen = torch.Generator().manual_seed(seed)
        self._synced = False

    # --- layout ---------------------------------------------------------------------------

    def _group(self, x: torch.Tensor) -> torch.Tensor:
        """NTCHW -> (N*G) x (F*C) x H x W, G = ceil(T / F) groups of F consecutive frames.

        T is padded up to a multiple of F by prepending copies of the first frame (the same
        rule for real and fake, so pairs stay aligned; the copies only enter the first group).
        """
        N, T, C, H, W = x.shape
        fpg = self.frames_per_group
        n_pad = -T % fpg
        if n_pad:
            x = torch.cat([x[:, :1].expand(-1, n_pad, -1, -1, -1), x], 1)
        return x.reshape(N * (T + n_pad) // fpg, fpg * C, H, W)

    def _ungroup(self, x: torch.Tensor, N: int, T: int) -> torch.Tensor:
        """Inverse of _group: (N*G) x (F*C) x H x W -> NTCHW, padding frames dropped."""
        _NG, FC, H, W = x.shape
        x = x.reshape(N, -1, FC // self.frames_per_group, H, W)
        return x[:, x.shape[1] - T :]

    def _autocast(self, device: torch.device):
        return torch.autocast(
            device.type, dtype=self.autocast_dtype or torch.float32, enabled=self.autocast_dtype is not None
        )

    # --- distributed ----------------------------------------------------------------------

    @staticmethod
    def _world() -> int:
        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

    def _float_buffers(self) -> list[torch.Tensor]:
        return [b for b in self.disc.buffers() if b.is_floating_point()]

    def _broadcast_from_rank0(self) -> None:
        """Start every rank from rank 0's discriminator (ranks may be seeded differently)."""
        for t in [*self.disc.parameters(), *self.disc.buffers()]:
            dist.broadcast(t.data, src=0)

    @staticmethod
    def _all_reduce_mean(tensors: list[torch.Tensor], world: int) -> bool:
        """Mean over ranks, in place, through one flat buffer (one collective, not dozens).

        Returns whether every value is finite: the same answer on every rank.
        """
        flat = torch.cat([t.reshape(-1).float() for t in tensors])
        dist.all_reduce(flat)
        flat /= world
        offset = 0
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
        return bool(torch.isfinite(flat).all())

    def _get_scaler(self, device: torch.device) -> torch.amp.GradScaler | None:
        if self.autocast_dtype == torch.float16 and self.scaler is None:
            self.scaler = torch.amp.GradScaler(device.type)
        return self.scaler

    # --- the two halves of a step ---------------------------------------------------------

    def _disc_train_step(self, real: torch.Tensor, fake: torch.Tensor, ctx: torch.Tensor) -> tuple[float, bool]:
        """One discriminator step on grouped BCHW real / fake and Bchw ctx.

        Returns (loss, skipped). A non-finite loss or gradient on any rank skips the update
        on every rank alike and restores the BatchNorm statistics, so one bad batch cannot
        poison the discriminator.
        """
        self.disc.train()
        bn_before = [b.clone() for b in self.disc.buffers()]
        keep = torch.isfinite(fake.flatten(1)).all(1).tolist()  # one sync, not one per sample
        for f, c, ok in zip(fake, ctx, keep):
            if ok:  # a non-finite fake would poison every later replay
                self.buffer.add(f, c, self.gen)

        # half fresh fakes, half replayed ones (fresh only while the buffer is empty)
        B = fake.shape[0]
        n_replay = B // 2 if self.buffer.items else 0
        fakes, ctxs = fake[: B - n_replay], ctx[: B - n_replay]
        if n_replay:
            old_fake, old_ctx = self.buffer.sample(n_replay, self.gen)
            fakes = torch.cat([fakes, old_fake.to(fake.dtype)])
            ctxs = torch.cat([ctxs, old_ctx.to(ctx.dtype)])

        # each sample is shown as fake (target +1) or real (target -1), LSGAN loss
        is_fake = (torch.rand(B, 1, 1, 1, generator=self.gen) < 0.5).to(real.device)
        images = torch.where(is_fake, fakes, real)
        contexts = torch.where(is_fake, ctxs, ctx)
        with self._autocast(real.device):
            scores = self.disc(images, contexts)
        targets = (is_fake.float() * 2 - 1).expand(scores.shape)
        loss = F.mse_loss(scores.float(), targets)

        scaler = self._get_scaler(real.device)
        self.opt.zero_grad(set_to_none=True)
        (scaler.scale(loss) if scaler else loss).backward()
        params = list(self.disc.parameters())
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        loss_t = loss.detach().float().reshape(1).clone()
        world = self._world()
        if world > 1:  # average gradients (and the loss, for logging) across ranks
            finite = self._all_reduce_mean([*(p.grad for p in params), loss_t], world)
        else:
            finite = bool(torch.isfinite(torch.cat([loss_t, *(p.grad.reshape(-1) for p in params)])).all())
        if scaler:  # fp16: overflowing gradients are the scaler's business, a bad loss is ours
            finite = bool(torch.isfinite(loss_t).all())
        if not finite:
            self.opt.zero_grad(set_to_none=True)
            for b, b0 in zip(self.disc.buffers(), bn_before):
                b.copy_(b0)
            return float(loss_t), True
        if scaler:
            scaler.step(self.opt)
            scaler.update()
        else:
            self.opt.step()
        if world > 1:
            self._all_reduce_mean(self._float_buffers(), world)
        return float(loss_t), False

    def _make_correction(self, real: torch.Tensor, fake: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """Feature-matching gradient pushing each fake toward its real, divided by its std.

        The eval-mode discriminator is a fixed featurizer here. The divisor is
        std + correction_eps, so the correction has unit std at any resolution.
        """
        self.disc.eval()
        with torch.no_grad(), self._autocast(real.device):
            ref_feats = self.disc(real, ctx).float()
        fake = fake.detach().requires_grad_(True)
        with torch.enable_grad():
            with self._autocast(real.device):
                feats = self.disc(fake, ctx).float()
            loss = F.mse_loss(feats, ref_feats, reduction="none").mean((1, 2, 3)).sum()
            (grad,) = torch.autograd.grad(loss, fake)
        correction = -grad
        return correction / (correction.std(correction=0) + self.correction_eps)

    def step_and_make_targets(
        self, real: torch.Tensor, fake: torch.Tensor, latents: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Train the discriminator one step, then return corrected targets for `fake`.

        Args:
            real: NTCHW RGB in [0, 1], the frames `fake` should reproduce.
            fake: NTCHW RGB (~[0, 1], unclamped is fine), the decoder output; same shape.
            latents: NT'chw reference latents of the clip; their time average is the context.
        Returns:
            targets: fake + correction, NTCHW like `fake`, detached.
            stats: {"disc_loss": float (mean over ranks), "disc_step_skipped": 0.0 or 1.0,
                "replay_buffer_mb": float}.
        """
        assert real.ndim == 5 and real.shape[2] == 3, f"expected NTCHW RGB frames, got real {tuple(real.shape)}"
        assert fake.shape == real.shape, f"fake {tuple(fake.shape)} and real {tuple(real.shape)} must match"
        assert latents.ndim == 5 and latents.shape[0] == real.shape[0] and latents.shape[2] == self.latent_channels, (
            f"expected N x T' x {self.latent_channels} x h x w latents for {real.shape[0]} clips, got {tuple(latents.shape)}"
        )
        param = next(self.disc.parameters())
        if self._world() > 1 and not self._synced:
            self._broadcast_from_rank0()
        self._synced = True
        N, T = fake.shape[:2]
        dtype = param.dtype
        real_g = self._group(real.detach().to(dtype))
        fake_g = self._group(fake.detach().to(dtype))
        ctx = latents.detach().to(dtype).mean(1).repeat_interleave(real_g.shape[0] // N, 0)

        with torch.enable_grad():  # callers may sit under no_grad; the discriminator still trains
            disc_loss, skipped = self._disc_train_step(real_g, fake_g, ctx)
        correction = self._make_correction(real_g, fake_g, ctx)
        targets = self._ungroup(fake_g + correction, N, T).to(fake.dtype)
        return targets, {
            "disc_loss": disc_loss,
            "disc_step_skipped": float(skipped),
            "replay_buffer_mb": self.buffer.nbytes / 2**20,
        }

    # --- checkpoints ----------------------------------------------------------------------

    @property
    def buffer_nbytes(self) -> int:
        return self.buffer.nbytes

    def state_dict_for_checkpoint(self, include_buffer: bool) -> dict[str, Any]:
        """Discriminator, optimizer, generator state and (optionally) the replay buffer."""
        d: dict[str, Any] = {
            "disc": self.disc.state_dict(),
            "opt": self.opt.state_dict(),
            "rng": self.gen.get_state(),
        }
        if self.scaler:
            d["scaler"] = self.scaler.state_dict()
        if include_buffer:
            d["buffer"] = {"fakes": [f for f, _ in self.buffer.items], "ctxs": [c for _, c in self.buffer.items]}
        return d

    def load_checkpoint_state(self, d: dict[str, Any]) -> None:
        """Inverse of state_dict_for_checkpoint; a missing buffer starts empty."""
        self.disc.load_state_dict(d["disc"])
        self.opt.load_state_dict(d["opt"])
        self.gen.set_state(d["rng"].cpu())
        if "scaler" in d and self._get_scaler(next(self.disc.parameters()).device):
            self.scaler.load_state_dict(d["scaler"])
        self.buffer.clear()
        if "buffer" in d:
            device = next(self.disc.parameters()).device
            for f, c in zip(d["buffer"]["fakes"], d["buffer"]["ctxs"]):
                item = (f.to(device), c.to(device))
                self.buffer.items.append(item)
                self.buffer.nbytes += self.buffer._size(item)
        self._synced = True  # every rank loads the same checkpoint


def seraena_crop(
    target: torch.Tensor, dec: torch.Tensor, latents: torch.Tensor, crop: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(target, decoded, latents) as Seraena sees them: one random crop x crop window on the latent grid
    (a latent cell is 8 x patch_size pixels: H / h), the same for every clip of the micro-batch; the
    whole frames when crop is 0 or not smaller than the frame. target/dec NTCHW, latents NT'chw. The
    plan keeps crop a multiple of the cell (plan/resolve.py)."""
    h, w = target.shape[-2:]
    if crop <= 0 or (crop >= h and crop >= w):
        return target, dec, latents
    cell = h // latents.shape[-2]  # 8, or 16 with patch_size 2
    ch, cw = min(crop, h), min(crop, w)
    y = cell * int(torch.randint(0, (h - ch) // cell + 1, (1,), generator=gen))
    x = cell * int(torch.randint(0, (w - cw) // cell + 1, (1,), generator=gen))
    window = (..., slice(y, y + ch), slice(x, x + cw))
    lat_window = (..., slice(y // cell, (y + ch) // cell), slice(x // cell, (x + cw) // cell))
    return target[window], dec[window], latents[lat_window]
