"""TAEHV: Tiny AutoEncoder for Hunyuan Video (and Wan, CogVideoX, LTX-2, MiniMax H3 ...), made trainable.

A port of public madebyollin/taehv `taehv.py`: the same layers at the same indices (blocks.py), so every
upstream release (`taehv.pth`, `taecvx.pth`, `taew2_2_super.pth` ...) loads here and our exports load in
upstream's `TAEHV(checkpoint_path=...)`; the same decode rules, which upstream picks from the file name
and we from the family record (plan/families.py): CogVideoX leaves an even latent count untrimmed, H3
encodes 17-frame chunks and decodes 5-latent chunks. `scripts/check_upstream_taehv.py` compares the two
on every family and decoder. What differs is the training path:

* no in-place clamp of the output (`clamp_` zeroes the gradient of every pixel outside
  [0, 1]); `decode_video(..., clamp=False)` returns the raw decoder output;
* `gradient_checkpointing=True` really recomputes: each memory block starts a segment that runs
  under `torch.utils.checkpoint` in training, so only segment inputs are kept for backward;
* only the parallel-over-time application (training needs the whole clip anyway).

Layouts: frames are NTCHW RGB in [0, 1]; latents are NTCHW with ~Gaussian values (the latents the
diffusion model sees).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .blocks import (
    DECODER_ARCHS,
    MEMORY_BLOCKS,
    Clamp,
    MemBlock,
    SuperMemBlock,
    TGrow,
    TPool,
    base_decoder,
    encoder,
    super_decoder,
)
from .weights import load_taehv_state_dict

__all__ = ["TAEHV", "MemBlock", "SuperMemBlock", "Clamp", "TPool", "TGrow", "build_taehv", "count_params"]
__all__ += ["load_taehv_state_dict"]


def _memory(x: torch.Tensor, n: int) -> torch.Tensor:
    """(N*T)CHW -> the same frames shifted one step later in time, zeros at t = 0."""
    NT, C, H, W = x.shape
    x = x.reshape(n, NT // n, C, H, W)
    return F.pad(x, (0, 0, 0, 0, 0, 0, 1, 0))[:, :-1].reshape(NT, C, H, W)


def _run_segment(blocks: list[nn.Module], x: torch.Tensor, n: int) -> torch.Tensor:
    """Apply blocks in order, all frames at once; memory blocks get the previous frame as memory."""
    for b in blocks:
        x = b(x, _memory(x, n)) if isinstance(b, MEMORY_BLOCKS) else b(x)
    return x


def _segments(model: nn.Sequential) -> list[list[nn.Module]]:
    """Cut the block list before every memory block.

    Each segment is a memory block plus the stateless layers after it (upsample, TGrow, conv),
    so checkpointing a segment keeps one tensor per segment, never the full-resolution tail.
    """
    segments: list[list[nn.Module]] = [[]]
    for b in model:
        if isinstance(b, MEMORY_BLOCKS) and segments[-1]:
            segments.append([])
        segments[-1].append(b)
    return segments


class TAEHV(nn.Module):
    def __init__(
        self,
        latent_channels: int = 16,
        patch_size: int = 1,
        encoder_time_downscale=(True, True, False),
        decoder_time_upscale=(False, True, True),
        decoder_space_upscale=(True, True, True),
        gradient_checkpointing: bool = False,
        decoder_arch: str = "base",
        even_latents_decode_all: bool = False,
        clip_length: int = 0,
        token_drop: int = 0,
        decode_chunk_latents: int = 0,
    ):
        """Tiny video autoencoder, randomly initialised (see `from_family` and `load_taehv_state_dict`).

        Args:
            latent_channels: channels of the reference VAE's latents (16 CogVideoX / Hunyuan / Wan 2.1,
                24 H3, 32 Hunyuan 1.5, 48 Wan 2.2, 128 LTX-2).
            patch_size: pixel-(un)shuffle factor around the encoder / decoder.
            encoder_time_downscale: per encoder stage, halve the frame count.
            decoder_time_upscale: per decoder stage, double the frame count (2 entries are
                read as (False, *entries), as upstream does).
            decoder_space_upscale: per decoder stage, double height and width.
            gradient_checkpointing: recompute memory-block segments in backward (less memory).
            decoder_arch: "base" (upstream's decoder) or "super" (its Super decoder: SuperMemBlocks,
                widths 512/256/128/64).
            even_latents_decode_all: CogVideoX's rule: an even latent count decodes untrimmed.
            clip_length, token_drop, decode_chunk_latents: H3's rule (17, 3, 5; 0 = none): the encoder
                sees clip_length-frame chunks, each with zero frames in front up to decode_chunk_latents
                latents, and the last token_drop latents are dropped; the decode is trimmed per chunk of
                decode_chunk_latents latents and loses the last token_drop latents' frames.
        """
        super().__init__()
        if len(decoder_time_upscale) == 2:
            decoder_time_upscale = (False, *decoder_time_upscale)
        for name, flags in [
            ("encoder_time_downscale", encoder_time_downscale),
            ("decoder_time_upscale", decoder_time_upscale),
            ("decoder_space_upscale", decoder_space_upscale),
        ]:
            assert len(flags) == 3, f"{name} needs 3 entries (one per stage), got {tuple(flags)}"
        assert decoder_arch in DECODER_ARCHS, f"decoder_arch={decoder_arch!r}: use one of {DECODER_ARCHS}"
        self.latent_channels = latent_channels
        self.patch_size = patch_size
        self.image_channels = 3
        self.decoder_arch = decoder_arch
        self.gradient_checkpointing = gradient_checkpointing
        self.channels_last = False  # NHWC frames: set for compiled GPU training (train/loop/speed.py)
        c_img = self.image_channels * patch_size**2
        self.encoder = encoder(c_img, latent_channels, tuple(encoder_time_downscale))
        make_decoder = super_decoder if decoder_arch == "super" else base_decoder
        self.decoder = make_decoder(latent_channels, c_img, tuple(decoder_time_upscale), tuple(decoder_space_upscale))
        self.t_downscale = 2 ** sum(b.stride == 2 for b in self.encoder if isinstance(b, TPool))
        self.t_upscale = 2 ** sum(b.stride == 2 for b in self.decoder if isinstance(b, TGrow))
        self.frames_to_trim = self.t_upscale - 1
        self.even_latents_decode_all = even_latents_decode_all
        self.clip_length, self.token_drop, self.decode_chunk_latents = clip_length, token_drop, decode_chunk_latents
        # H3: zero frames in front of each clip so that it encodes to decode_chunk_latents latents (3 = 5 x 4 - 17)
        self.chunk_pad = decode_chunk_latents * self.t_downscale - clip_length if clip_length else 0
        assert self.chunk_pad >= 0, f"clip_length={clip_length} is more than {decode_chunk_latents} latents hold"

    @classmethod
    def from_family(cls, family: Any, decoder_arch: str = "base", **overrides) -> TAEHV:
        """The shape upstream releases for a family (plan/families.py record) and its decode rule.
        overrides: constructor arguments to change (latent_channels of a demo VAE, gradient_checkpointing)."""
        kwargs = dict(
            latent_channels=family.latent_channels,
            patch_size=family.patch_size,
            encoder_time_downscale=tuple(family.encoder_time_downscale),
            decoder_time_upscale=tuple(family.decoder_time_upscale),
            **decode_rule(family),
        )
        return cls(decoder_arch=decoder_arch, **{**kwargs, **overrides})

    def _run_blocks(self, model: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
        """NTCHW -> NTCHW through `model`, parallel over time, checkpointed when asked."""
        N, T, C, H, W = x.shape
        x = x.reshape(N * T, C, H, W)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for seg in _segments(model):
            if recompute and any(isinstance(b, MEMORY_BLOCKS) for b in seg):
                x = checkpoint(_run_segment, seg, x, N, use_reentrant=False)
            else:
                x = _run_segment(seg, x, N)
        NT, C, H, W = x.shape
        return x.reshape(N, NT // N, C, H, W)

    def encode_video(self, x: torch.Tensor) -> torch.Tensor:
        """Frames NTCHW RGB in [0, 1] -> latents NT'CHW, T' = ceil(T / t_downscale).

        T is padded to a multiple of t_downscale by repeating the last frame (as upstream). With
        clip_length (H3): T is padded to whole clips the same way, each clip gets chunk_pad zero frames
        in front and is encoded on its own, and the last token_drop latents are dropped: T' = 5 x clips - 3.
        """
        assert x.ndim == 5 and x.shape[2] == self.image_channels, f"expected NTCHW RGB frames, got {tuple(x.shape)}"
        step = 8 * self.patch_size
        assert x.shape[-2] % step == 0 and x.shape[-1] % step == 0, (
            f"frame size {tuple(x.shape[-2:])} must be a multiple of {step} (8 x patch_size)"
        )
        if self.clip_length:
            return self._encode_clips(x)
        if x.shape[1] % self.t_downscale:
            n_pad = self.t_downscale - x.shape[1] % self.t_downscale
            x = torch.cat([x, x[:, -1:].expand(-1, n_pad, -1, -1, -1)], 1)
        if self.patch_size > 1:
            x = F.pixel_unshuffle(x, self.patch_size)
        return self._run_blocks(self.encoder, x)

    def _encode_clips(self, x: torch.Tensor) -> torch.Tensor:
        N, T = x.shape[:2]
        x = torch.cat([x, x[:, -1:].expand(-1, -T % self.clip_length, -1, -1, -1)], 1)
        x = x.reshape(-1, self.clip_length, *x.shape[2:])  # (N * clips) x clip_length x CHW
        x = F.pad(x, (0, 0, 0, 0, 0, 0, self.chunk_pad, 0))
        if self.patch_size > 1:
            x = F.pixel_unshuffle(x, self.patch_size)
        z = self._run_blocks(self.encoder, x)
        z = z.reshape(N, -1, *z.shape[2:])
        return z[:, : z.shape[1] - self.token_drop]

    def decode_video(self, z: torch.Tensor, trim: bool = True, clamp: bool = True) -> torch.Tensor:
        """Latents NTCHW -> frames NT'CHW RGB, T' = T * t_upscale, less what the family's rule trims.

        trim applies upstream's rule for the family, so output frame i lines up with input frame i of
        the encoded clip: drop the first frames_to_trim frames; CogVideoX (even_latents_decode_all)
        keeps all of an even latent count's; H3 (decode_chunk_latents) drops them per chunk of latents
        and the last token_drop latents' frames. trim=False returns every decoded frame. clamp=True
        gives [0, 1] (out of place); training passes clamp=False so every pixel keeps its gradient.
        """
        assert z.ndim == 5 and z.shape[2] == self.latent_channels, (
            f"expected NTCHW latents with {self.latent_channels} channels, got {tuple(z.shape)}"
        )
        x = self._run_blocks(self.decoder, z)
        if self.patch_size > 1:
            x = F.pixel_shuffle(x, self.patch_size)
        if trim:
            x = self._trim(x, z.shape[1])
        return x.clamp(0, 1) if clamp else x

    def trims(self, n_latents: int) -> bool:
        """Whether decode_video(trim=True) of n_latents latents drops any decoded frame."""
        return bool(self.decode_chunk_latents) or not (self.even_latents_decode_all and n_latents % 2 == 0)

    def _trim(self, x: torch.Tensor, n_latents: int) -> torch.Tensor:
        if self.decode_chunk_latents:
            chunk = self.decode_chunk_latents * self.t_upscale
            x = F.pad(x, (0, 0, 0, 0, 0, 0, 0, -x.shape[1] % chunk))
            x = x.unflatten(1, (-1, chunk))[:, :, self.frames_to_trim :].flatten(1, 2)
            return x[:, : max(0, x.shape[1] - self.token_drop * self.t_upscale)]
        return x[:, self.frames_to_trim :] if self.trims(n_latents) else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Round trip: frames NTCHW in [0, 1] -> reconstruction (trimmed, unclamped)."""
        return self.decode_video(self.encode_video(x), clamp=False)


def decode_rule(family: Any) -> dict[str, Any]:
    """A family record's decode rule as TAEHV's constructor arguments."""
    return dict(
        even_latents_decode_all=family.even_latents_decode_all,
        clip_length=family.clip_length,
        token_drop=family.token_drop,
        decode_chunk_latents=family.decode_chunk_latents,
    )


def build_taehv(cfg: Any) -> TAEHV:
    """TAEHV from the training config (a mapping or an object with the schema.py keys): the shape from
    its keys, the decode rule from its family, and its pretrained_model_path loaded strictly."""
    from taehv_launch.plan.families import FAMILIES, get_family
    from taehv_launch.plan.schema import DEFAULTS

    def get(key: str):
        if isinstance(cfg, Mapping):
            return cfg.get(key, DEFAULTS[key])
        return getattr(cfg, key, DEFAULTS[key])

    family = get_family(str(get("ref_vae_type")))
    model = TAEHV(
        latent_channels=int(get("latent_channels")),
        patch_size=int(get("patch_size")),
        encoder_time_downscale=tuple(bool(v) for v in get("encoder_time_downscale")),
        decoder_time_upscale=tuple(bool(v) for v in get("decoder_time_upscale")),
        decoder_space_upscale=tuple(bool(v) for v in get("decoder_space_upscale")),
        gradient_checkpointing=bool(get("gradient_checkpointing")),
        decoder_arch=str(get("decoder_arch")),
        **decode_rule(family),
    )
    path = get("pretrained_model_path")
    if path:
        load_taehv_state_dict(model, os.path.expanduser(str(path)), family, FAMILIES)
    return model


def count_params(model: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
