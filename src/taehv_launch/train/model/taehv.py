"""TAEHV: Tiny AutoEncoder for Hunyuan Video (and Wan, CogVideoX ...), made trainable.

The module layout (indices, key names, parameter shapes of `encoder` / `decoder`) is the
public madebyollin/taehv one, so `taehv.pth`, `taew2_1.pth`, `taecvx.pth` load here and
our exported weights load in the public `taehv.py`. What differs is the training path:

* no in-place clamp of the output (`clamp_` zeroes the gradient of every pixel outside
  [0, 1]); `decode_video(..., clamp=False)` returns the raw decoder output;
* `gradient_checkpointing=True` really recomputes: each MemBlock starts a segment that runs
  under `torch.utils.checkpoint` in training, so only segment inputs are kept for backward;
* only the parallel-over-time application (training needs the whole clip anyway).

Layouts: frames are NTCHW RGB in [0, 1]; latents are NTCHW with ~Gaussian values (the raw
reference-VAE latents, no scaling factor).
"""

from __future__ import annotations

import math
import os
import pickle
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from taehv_launch.errors import ModelError

N_F = (256, 128, 64, 64)  # decoder widths per stage (the encoder is 64 throughout)


def conv(n_in: int, n_out: int, **kwargs) -> nn.Conv2d:
    return nn.Conv2d(n_in, n_out, 3, padding=1, **kwargs)


class Clamp(nn.Module):
    """Soft clamp of the latents to (-3, 3): tanh keeps gradients alive."""

    def forward(self, x):
        return torch.tanh(x / 3) * 3


class MemBlock(nn.Module):
    """Residual block that also sees the previous frame's input ("memory").

    x, past: (N*T)CHW; past[t] is x[t-1] (zeros for t = 0).
    """

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        # In-place ReLUs act on fresh conv / sum outputs that nothing saves for backward.
        self.conv = nn.Sequential(
            conv(n_in * 2, n_out),
            nn.ReLU(inplace=True),
            conv(n_out, n_out),
            nn.ReLU(inplace=True),
            conv(n_out, n_out),
        )
        self.skip = nn.Conv2d(n_in, n_out, 1, bias=False) if n_in != n_out else nn.Identity()
        self.act = nn.ReLU(inplace=True)

    def forward(self, x, past):
        return self.act(self.conv(torch.cat([x, past], 1)) + self.skip(x))


class TPool(nn.Module):
    """Merge `stride` consecutive frames into one: (N*T)CHW -> (N*T/stride)CHW."""

    def __init__(self, n_f: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(n_f * stride, n_f, 1, bias=False)

    def forward(self, x):
        NT, C, H, W = x.shape
        assert NT % self.stride == 0, f"TPool: {NT} frames do not split into groups of {self.stride}"
        return self.conv(x.reshape(-1, self.stride * C, H, W))


class TGrow(nn.Module):
    """Split each frame into `stride` frames: (N*T)CHW -> (N*T*stride)CHW."""

    def __init__(self, n_f: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(n_f, n_f * stride, 1, bias=False)

    def forward(self, x):
        _NT, C, H, W = x.shape
        return self.conv(x).reshape(-1, C, H, W)


def _memory(x: torch.Tensor, n: int) -> torch.Tensor:
    """(N*T)CHW -> the same frames shifted one step later in time, zeros at t = 0."""
    NT, C, H, W = x.shape
    x = x.reshape(n, NT // n, C, H, W)
    return F.pad(x, (0, 0, 0, 0, 0, 0, 1, 0))[:, :-1].reshape(NT, C, H, W)


def _run_segment(blocks: list[nn.Module], x: torch.Tensor, n: int) -> torch.Tensor:
    """Apply blocks in order, all frames at once; MemBlocks get the previous frame as memory."""
    for b in blocks:
        x = b(x, _memory(x, n)) if isinstance(b, MemBlock) else b(x)
    return x


def _segments(model: nn.Sequential) -> list[list[nn.Module]]:
    """Cut the block list before every MemBlock.

    Each segment is a MemBlock plus the stateless layers after it (upsample, TGrow, conv),
    so checkpointing a segment keeps one tensor per segment, never the full-resolution tail.
    """
    segments: list[list[nn.Module]] = [[]]
    for b in model:
        if isinstance(b, MemBlock) and segments[-1]:
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
    ):
        """Tiny video autoencoder, randomly initialised (see `load_taehv_state_dict`).

        Args:
            latent_channels: channels of the reference VAE's latents (16 Hunyuan / Wan 2.1,
                16 CogVideoX, 32 TAEHV 1.5, 48 Wan 2.2).
            patch_size: pixel-(un)shuffle factor around the encoder / decoder.
            encoder_time_downscale: per encoder stage, halve the frame count.
            decoder_time_upscale: per decoder stage, double the frame count (2 entries are
                read as (False, *entries), as the public code does).
            decoder_space_upscale: per decoder stage, double height and width.
            gradient_checkpointing: recompute MemBlock segments in backward (less memory).
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
        self.latent_channels = latent_channels
        self.patch_size = patch_size
        self.image_channels = 3
        self.gradient_checkpointing = gradient_checkpointing
        self.channels_last = False  # NHWC frames: set for compiled GPU training (train/loop/speed.py)

        def enc_stage(down_t: bool) -> list[nn.Module]:
            return [
                TPool(64, 2 if down_t else 1),
                conv(64, 64, stride=2, bias=False),
                MemBlock(64, 64),
                MemBlock(64, 64),
                MemBlock(64, 64),
            ]

        def dec_stage(n_in: int, n_out: int, up_t: bool, up_s: bool) -> list[nn.Module]:
            return [
                MemBlock(n_in, n_in),
                MemBlock(n_in, n_in),
                MemBlock(n_in, n_in),
                nn.Upsample(scale_factor=2 if up_s else 1),
                TGrow(n_in, 2 if up_t else 1),
                conv(n_in, n_out, bias=False),
            ]

        c_img = self.image_channels * patch_size**2
        self.encoder = nn.Sequential(
            conv(c_img, 64),
            nn.ReLU(inplace=True),
            *enc_stage(encoder_time_downscale[0]),
            *enc_stage(encoder_time_downscale[1]),
            *enc_stage(encoder_time_downscale[2]),
            conv(64, latent_channels),
        )
        self.decoder = nn.Sequential(
            Clamp(),
            conv(latent_channels, N_F[0]),
            nn.ReLU(inplace=True),
            *dec_stage(N_F[0], N_F[1], decoder_time_upscale[0], decoder_space_upscale[0]),
            *dec_stage(N_F[1], N_F[2], decoder_time_upscale[1], decoder_space_upscale[1]),
            *dec_stage(N_F[2], N_F[3], decoder_time_upscale[2], decoder_space_upscale[2]),
            nn.ReLU(inplace=True),
            conv(N_F[3], c_img),
        )
        self.t_downscale = 2 ** sum(b.stride == 2 for b in self.encoder if isinstance(b, TPool))
        self.t_upscale = 2 ** sum(b.stride == 2 for b in self.decoder if isinstance(b, TGrow))
        self.frames_to_trim = self.t_upscale - 1

    def _run_blocks(self, model: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
        """NTCHW -> NTCHW through `model`, parallel over time, checkpointed when asked."""
        N, T, C, H, W = x.shape
        x = x.reshape(N * T, C, H, W)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for seg in _segments(model):
            if recompute and any(isinstance(b, MemBlock) for b in seg):
                x = checkpoint(_run_segment, seg, x, N, use_reentrant=False)
            else:
                x = _run_segment(seg, x, N)
        NT, C, H, W = x.shape
        return x.reshape(N, NT // N, C, H, W)

    def encode_video(self, x: torch.Tensor) -> torch.Tensor:
        """Frames NTCHW RGB in [0, 1] -> latents NT'CHW, T' = ceil(T / t_downscale).

        T is padded to a multiple of t_downscale by repeating the last frame (as upstream).
        """
        assert x.ndim == 5 and x.shape[2] == self.image_channels, f"expected NTCHW RGB frames, got {tuple(x.shape)}"
        step = 8 * self.patch_size
        assert x.shape[-2] % step == 0 and x.shape[-1] % step == 0, (
            f"frame size {tuple(x.shape[-2:])} must be a multiple of {step} (8 x patch_size)"
        )
        if x.shape[1] % self.t_downscale:
            n_pad = self.t_downscale - x.shape[1] % self.t_downscale
            x = torch.cat([x, x[:, -1:].expand(-1, n_pad, -1, -1, -1)], 1)
        if self.patch_size > 1:
            x = F.pixel_unshuffle(x, self.patch_size)
        return self._run_blocks(self.encoder, x)

    def decode_video(self, z: torch.Tensor, trim: bool = True, clamp: bool = True) -> torch.Tensor:
        """Latents NTCHW -> frames NT'CHW RGB, T' = T * t_upscale (- frames_to_trim if trim).

        trim drops the first frames_to_trim frames, so output frame i lines up with input frame
        i of the encoded clip. clamp=True gives [0, 1] (out of place); training passes
        clamp=False so every pixel keeps its gradient.
        """
        assert z.ndim == 5 and z.shape[2] == self.latent_channels, (
            f"expected NTCHW latents with {self.latent_channels} channels, got {tuple(z.shape)}"
        )
        x = self._run_blocks(self.decoder, z)
        if self.patch_size > 1:
            x = F.pixel_shuffle(x, self.patch_size)
        if clamp:
            x = x.clamp(0, 1)
        return x[:, self.frames_to_trim :] if trim else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Round trip: frames NTCHW in [0, 1] -> reconstruction (trimmed, unclamped)."""
        return self.decode_video(self.encode_video(x), clamp=False)


# --- weights ----------------------------------------------------------------------------


def _read_state_dict(path: str) -> dict[str, torch.Tensor]:
    if not os.path.isfile(path):
        raise ModelError(
            f"TAEHV weights not found: {path}; set pretrained_model_path to an existing "
            f".pth/.safetensors file, or to '' to train from scratch"
        )
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            sd = load_file(path, device="cpu")
        else:
            sd = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # weights_only=True refuses anything but tensors
        raise ModelError(
            f"cannot read TAEHV weights {path}: it holds pickled Python objects, not just "
            f"tensors; re-save it as model.state_dict() (.pth) or as .safetensors"
        ) from e
    except Exception as e:  # corrupt or truncated file, wrong format
        reason = (str(e).strip().splitlines() or [""])[0]  # keep the message to one line
        raise ModelError(
            f"cannot read TAEHV weights {path} ({type(e).__name__}: {reason}); "
            f"expected a state dict saved as .pth or .safetensors"
        ) from e
    if not isinstance(sd, Mapping) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ModelError(
            f"TAEHV weights {path} are not a flat state dict of tensors; "
            f"export the model's state_dict() (public taehv.pth format)"
        )
    return dict(sd)


def _settings_in(sd: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """Read the architecture settings a public-layout state dict implies (best effort)."""
    got: dict[str, Any] = {}
    if "decoder.1.weight" in sd:
        got["latent_channels"] = sd["decoder.1.weight"].shape[1]
    if "encoder.0.weight" in sd:
        p = math.isqrt(sd["encoder.0.weight"].shape[1] // 3)
        got["patch_size"] = p
    pools = [f"encoder.{i}.conv.weight" for i in (2, 7, 12)]
    if all(k in sd for k in pools):
        got["encoder_time_downscale"] = tuple(sd[k].shape[1] == 2 * sd[k].shape[0] for k in pools)
    grows = [f"decoder.{i}.conv.weight" for i in (7, 13, 19)]
    if all(k in sd for k in grows):
        got["decoder_time_upscale"] = tuple(sd[k].shape[0] == 2 * sd[k].shape[1] for k in grows)
    return got


def _mismatch_hint(model: TAEHV, sd: Mapping[str, torch.Tensor]) -> str:
    """What to change, from the settings the file implies (read after TGrow patching)."""
    ours = {
        "latent_channels": model.latent_channels,
        "patch_size": model.patch_size,
        "encoder_time_downscale": tuple(b.stride == 2 for b in model.encoder if isinstance(b, TPool)),
        "decoder_time_upscale": tuple(b.stride == 2 for b in model.decoder if isinstance(b, TGrow)),
    }
    diff = [f"{k}={v!r}" for k, v in _settings_in(sd).items() if v != ours[k]]
    if diff:
        return f"the file was made with {', '.join(diff)}: set {'/'.join(d.split('=')[0] for d in diff)} to match"
    return "is this a TAEHV (public taehv.py layout) checkpoint?"


def load_taehv_state_dict(model: TAEHV, path: str) -> TAEHV:
    """Load public-layout TAEHV weights (.pth or .safetensors) into `model`, strictly.

    A checkpoint whose TGrow layers upscale time more than the model does (e.g. full
    weights into a preview decoder) is cut to the last-timestep output channels, as the
    public code does. Any other difference raises ModelError naming the first bad key.
    """
    sd = _read_state_dict(path)
    want = model.state_dict()
    for i, b in enumerate(model.decoder):
        key = f"decoder.{i}.conv.weight"
        if isinstance(b, TGrow) and key in sd and sd[key].shape[0] > want[key].shape[0]:
            sd[key] = sd[key][-want[key].shape[0] :]
    for key, ref in want.items():
        if key not in sd:
            raise ModelError(
                f"TAEHV weights {path} lack {key} (model shape {tuple(ref.shape)}); {_mismatch_hint(model, sd)}"
            )
        if sd[key].shape != ref.shape:
            raise ModelError(
                f"TAEHV weights {path}: {key} has shape {tuple(sd[key].shape)} in the file but "
                f"{tuple(ref.shape)} in the model; {_mismatch_hint(model, sd)}"
            )
    extra = [k for k in sd if k not in want]
    if extra:
        raise ModelError(
            f"TAEHV weights {path} have a key the model lacks: {extra[0]} "
            f"(shape {tuple(sd[extra[0]].shape)}, {len(extra)} extra in all); {_mismatch_hint(model, sd)}"
        )
    model.load_state_dict(sd, strict=True)
    return model


def build_taehv(cfg: Any) -> TAEHV:
    """TAEHV from the training config (a mapping or an object with the schema.py keys)."""
    from taehv_launch.plan.schema import DEFAULTS

    def get(key: str):
        if isinstance(cfg, Mapping):
            return cfg.get(key, DEFAULTS[key])
        return getattr(cfg, key, DEFAULTS[key])

    model = TAEHV(
        latent_channels=int(get("latent_channels")),
        patch_size=int(get("patch_size")),
        encoder_time_downscale=tuple(bool(v) for v in get("encoder_time_downscale")),
        decoder_time_upscale=tuple(bool(v) for v in get("decoder_time_upscale")),
        decoder_space_upscale=tuple(bool(v) for v in get("decoder_space_upscale")),
        gradient_checkpointing=bool(get("gradient_checkpointing")),
    )
    path = get("pretrained_model_path")
    if path:
        load_taehv_state_dict(model, os.path.expanduser(str(path)))
    return model


def count_params(model: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
