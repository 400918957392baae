"""The frozen reference VAE whose latents TAEHV learns to reproduce.

One adapter over the diffusers video VAEs of every family (plan/families.py) so that the trainer
speaks TAEHV's language on both sides: frames NTCHW RGB in [0, 1] in, latents NTCHW out, in the
latent space upstream's TAE file of the family decodes: the diffusion model's latents, normalized as
the family record says (CogVideoX raw; HunyuanVideo z * scaling_factor; Wan (z - latents_mean) /
latents_std; LTX-2 by its weight buffers; docs/families.md), unless ref_latent_mean/std replace that.
Loaded from a local folder only; anything missing or mismatched is a `ModelError`, never random
latents (the seeds silently fell back to `torch.randn`).

Frame alignment (measured, tests/test_refvae.py): the causal families are "1 + sk" encoders when
given 1 + sk frames (s: the time stride): latent 0 sees frame 0, latent k sees frames <= sk. Given
12 frames, Wan and Hunyuan ignore frames 9-11 by construction, but CogVideoX (even frame count)
regroups every latent onto frames 4k..4k+3 and its decode no longer lines up with frames 0-8.
`encode` therefore feeds those families only the first 1 + s * ((T - 1) // s) frames (the family's
ref_frames), so that decode(encode(12 frames)) gives 9 frames aligned with input frames 0-8 (the
trainer's targets). MiniMax-H3 encodes 17-frame chunks and pads the last itself: it gets all frames.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Sequence

import torch

from ...dataindex.refweights import model_dir
from ...errors import ConfigError, ModelError
from ...plan.families import NORMS, Family, family_of_config, get_family

_WEIGHT_FILES = (
    "diffusion_pytorch_model.safetensors",
    "diffusion_pytorch_model.bin",
    "diffusion_pytorch_model.safetensors.index.json",
    "diffusion_pytorch_model.bin.index.json",
)


class ChannelMismatch(ModelError):
    """The reference VAE's latent channel count differs from the config's latent_channels."""

    def __init__(self, message: str, channels: int):
        super().__init__(message)
        self.channels = channels


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """Accept the config's strings ("bfloat16") as well as torch dtypes."""
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype), None)
    if not isinstance(value, torch.dtype):
        raise ConfigError(f"ref_vae_dtype={dtype!r} is not a torch dtype: use float32, bfloat16 or float16")
    return value


def _check_folder(folder: str, kind: str) -> None:
    """Read config.json and look for weights before diffusers does (its errors are long)."""
    cfg_path = os.path.join(folder, "config.json")
    try:
        with open(cfg_path) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as err:
        raise ModelError(f"cannot read {cfg_path} ({err}): re-download the reference VAE") from None
    found = cfg.get("_class_name") if isinstance(cfg, dict) else None
    family = get_family(kind)
    marks = all(cfg.get(k) == v for k, v in family.config_marks.items()) if isinstance(cfg, dict) else True
    if found and (found != family.class_name or not marks):
        other = family_of_config(cfg)
        hint = f"set ref_vae_type={other.name}" if other else f"use a {family.class_name} folder"
        what = f"an {found}" + (f" of the {other.name} family" if other and found == family.class_name else "")
        raise ModelError(
            f"{folder} is {what}, not the {family.class_name} ({family.models}) that ref_vae_type={kind} needs: {hint}"
        )
    if not any(os.path.isfile(os.path.join(folder, name)) for name in _WEIGHT_FILES):
        raise ModelError(f"no weights (diffusion_pytorch_model.safetensors) in {folder}: re-download the reference VAE")


def _from_pretrained(kind: str, path: str, subfolder: str | None, dtype: torch.dtype):
    """diffusers from_pretrained, local only, with every missing or mismatched weight an error."""
    import diffusers

    cls = getattr(diffusers, get_family(kind).class_name)
    kwargs = {"torch_dtype": dtype, "local_files_only": True, "output_loading_info": True}
    if subfolder:
        kwargs["subfolder"] = subfolder
    try:
        model, info = cls.from_pretrained(path, **kwargs)
    except Exception as err:  # diffusers raises OSError, ValueError, RuntimeError, KeyError ...
        raise ModelError(
            f"cannot load the {kind} reference VAE from {path}: {_first_sentence(err)}: "
            f"check ref_vae_type, or re-download the VAE"
        ) from None
    bad = list(info.get("missing_keys", [])) + [str(k[0]) for k in info.get("mismatched_keys", [])]
    if bad:
        raise ModelError(
            f"{path}: {len(bad)} weights are missing or of the wrong shape (e.g. {bad[0]}): "
            f"check ref_vae_type={kind}, or re-download the VAE"
        )
    return model


def _first_sentence(err: Exception) -> str:
    """diffusers' errors run on with advice we do not want (random re-initialisation): keep the start."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text.split(". ")[0].rstrip(".")[:300]


def freeze(model: torch.nn.Module, family: Family | None = None) -> torch.nn.Module:
    """Eval mode, no grads, and none of diffusers' tiling (we chunk over the batch ourselves), except
    for a family released with its tiling on (MiniMax-H3: its latents are the tiled encode's)."""
    model.eval().requires_grad_(False)
    if hasattr(model, "disable_tiling") and not (family and family.keeps_tiling):
        model.disable_tiling()
    if hasattr(model, "disable_slicing"):
        model.disable_slicing()
    # Hunyuan blends overlapping temporal tiles above 16 frames: an approximation of the
    # full encode that the real pipelines' 1+4k clips do not need at training lengths.
    for flag in ("use_framewise_encoding", "use_framewise_decoding"):
        if hasattr(model, flag):
            setattr(model, flag, False)
    return model


IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # MiniMax-H3's pixel space


def family_norm(family: Family, model: torch.nn.Module) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(mean, std) that take the VAE's z to the family's latent space, (z - mean) / std (None: 0 / 1),
    from the VAE's own config.json or weight buffers (family.latent_norm, plan/families.py)."""
    cfg, rule = model.config, family.latent_norm
    channels = int(cfg[family.channels_key])
    if rule == "raw":
        return None, None

    def scale() -> float:
        value = cfg.get("scaling_factor")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise ModelError(
                f"the {family.name} reference VAE's config.json has scaling_factor={value!r}: re-download it"
            )
        return float(value)

    if rule == "scaling_factor":
        return None, torch.full((1, 1, channels, 1, 1), 1.0 / scale())
    if rule == "latents_mean_std":
        values = [cfg.get("latents_mean"), cfg.get("latents_std")]
    else:  # buffers_mean_std: LTX-2 keeps them in its weights
        values = [getattr(model, name, None) for name in ("latents_mean", "latents_std")]
    try:
        mean, std = (torch.as_tensor(v, dtype=torch.float32).detach().cpu().reshape(-1) for v in values)
    except (TypeError, ValueError, RuntimeError):
        mean = std = torch.zeros(0)
    if mean.numel() != channels or std.numel() != channels or not bool((std > 0).all()):
        raise ModelError(
            f"the {family.name} reference VAE has no usable latents_mean/latents_std for its {channels} channels "
            f"({NORMS[rule]}): re-download it, or give ref_latent_mean and ref_latent_std"
        )
    if rule == "buffers_mean_std":
        std = std / scale()
    return mean.view(1, 1, channels, 1, 1), std.view(1, 1, channels, 1, 1)


def _per_channel(values: Sequence[float], channels: int, name: str) -> torch.Tensor | None:
    """Optional mean/std as a (1, 1, C, 1, 1) float32 tensor, checked against the channel count."""
    if not values:
        return None
    if len(values) != channels:
        raise ConfigError(
            f"{name} has {len(values)} values but the reference VAE has {channels} latent "
            f"channels: give {channels} values or ()"
        )
    if name.endswith("std") and min(float(v) for v in values) <= 0:
        raise ConfigError(f"{name} must be positive, got {tuple(values)}")
    return torch.tensor([float(v) for v in values], dtype=torch.float32).view(1, 1, channels, 1, 1)


@dataclass
class ReferenceVAE:
    """A frozen diffusers video VAE with TAEHV's layouts. Build it with `load_reference_vae`."""

    kind: str
    model: torch.nn.Module = field(repr=False)
    dtype: torch.dtype
    device: torch.device
    chunk_size: int = 1
    latent_mean: torch.Tensor | None = None  # z -> (z - latent_mean) / latent_std: the family's, or ref_latent_*
    latent_std: torch.Tensor | None = None
    latent_space: str = ""  # in words, for the log
    channels_last: bool = False  # feed the encoder NDHWC (set by speed.compile_reference)

    @property
    def family(self) -> Family:
        return get_family(self.kind)

    @property
    def latent_channels(self) -> int:
        return int(self.model.config[self.family.channels_key])

    def latent_frames(self, n_frames: int) -> int:
        return self.family.latent_frames(n_frames)

    def decoded_frames(self, n_latents: int) -> int:
        return self.family.decoded_frames(n_latents)

    @torch.no_grad()
    def encode(self, frames: torch.Tensor) -> torch.Tensor:
        """NTCHW RGB frames in [0, 1] (float) or [0, 255] (uint8) -> normalized latents NTCHW float32.

        Uses the family's ref_frames only (see the module docstring: alignment), the
        posterior's mode (its mean, so targets are deterministic), chunk_size samples
        per VAE call to bound memory, the VAE's own dtype and no autocast.
        """
        assert frames.ndim == 5 and frames.shape[2] == 3, f"expected NTCHW RGB, got {tuple(frames.shape)}"
        n, t, _, h, w = frames.shape
        s = self.family.space_stride
        assert h % s == 0 and w % s == 0, f"H, W must be multiples of {s}, got {h}x{w}"
        frames = frames[:, : self.family.ref_frames(t)]
        chunks = [self._encode_chunk(c) for c in frames.split(self._chunk(n))]
        latents = torch.cat(chunks)
        assert latents.shape == (n, self.latent_frames(t), self.latent_channels, h // s, w // s), latents.shape
        return self._normalise(latents)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalized latents NTCHW (as encode gives them) -> frames NTCHW RGB in [0, 1] float32."""
        assert latents.ndim == 5 and latents.shape[2] == self.latent_channels, f"bad latents {tuple(latents.shape)}"
        latents = self._denormalise(latents.float())
        frames = torch.cat([self._decode_chunk(c) for c in latents.split(self._chunk(len(latents)))])
        assert frames.shape[1] == self.decoded_frames(latents.shape[1]), frames.shape
        return frames

    def _chunk(self, n: int) -> int:
        chunk = self.chunk_size if self.chunk_size > 0 else max(n, 1)
        return min(chunk, self.family.encode_batch_limit or chunk)

    def _encode_chunk(self, frames: torch.Tensor) -> torch.Tensor:
        """NTCHW [0, 1] or uint8 -> NTCHW float32 latents, one VAE call."""
        work = torch.promote_types(self.dtype, torch.float32)  # scale in >= fp32, then cast
        x = frames.to(self.device)
        x = x.to(work) / 255.0 if x.dtype == torch.uint8 else x.to(work)
        x = self._pixels_in(x).to(self.dtype).permute(0, 2, 1, 3, 4)  # NCTHW in the VAE's pixel space
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last_3d)
        with torch.autocast(self.device.type, enabled=False):
            z = self.model.encode(x).latent_dist.mode()
        return z.permute(0, 2, 1, 3, 4).float()

    def _decode_chunk(self, latents: torch.Tensor) -> torch.Tensor:
        """NTCHW float32 latents -> NTCHW float32 frames in [0, 1], one VAE call."""
        z = latents.to(self.device, self.dtype).permute(0, 2, 1, 3, 4)
        with torch.autocast(self.device.type, enabled=False):
            x = self.model.decode(z).sample
        return self._pixels_out(x.float().permute(0, 2, 1, 3, 4)).clamp(0, 1)

    def _pixel_stats(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.family.pixel_space == "imagenet":
            shape = (1, 1, 3, 1, 1)
            return (
                torch.tensor(IMAGENET_MEAN, device=x.device).view(shape).to(x.dtype),
                torch.tensor(IMAGENET_STD, device=x.device).view(shape).to(x.dtype),
            )
        return torch.full((), 0.5, device=x.device, dtype=x.dtype), torch.full((), 0.5, device=x.device, dtype=x.dtype)

    def _pixels_in(self, x: torch.Tensor) -> torch.Tensor:
        """[0, 1] -> the VAE's input: [-1, 1], or ImageNet-normalized (MiniMax-H3)."""
        mean, std = self._pixel_stats(x)
        return (x - mean) / std

    def _pixels_out(self, x: torch.Tensor) -> torch.Tensor:
        mean, std = self._pixel_stats(x)
        return x * std + mean

    def _normalise(self, z: torch.Tensor) -> torch.Tensor:
        if self.latent_mean is not None:
            z = z - self.latent_mean.to(z.device)
        if self.latent_std is not None:
            z = z / self.latent_std.to(z.device)
        return z

    def _denormalise(self, z: torch.Tensor) -> torch.Tensor:
        if self.latent_std is not None:
            z = z * self.latent_std.to(z.device)
        if self.latent_mean is not None:
            z = z + self.latent_mean.to(z.device)
        return z


def load_reference_vae(
    kind: str,
    path: str,
    dtype: torch.dtype | str = torch.float32,
    device: torch.device | str = "cpu",
    chunk_size: int = 1,
    latent_mean: Sequence[float] = (),
    latent_std: Sequence[float] = (),
    expect_channels: int | None = None,
) -> ReferenceVAE:
    """Load a frozen reference VAE from a local diffusers folder (path/vae or path itself).

    Raises ModelError for a missing folder or config, another family's folder, missing
    weights or weights that do not fit; never returns a randomly initialised model.
    """
    family = get_family(kind)
    kind = family.name  # an alias (taew2_2) loads as its family
    folder, subfolder = model_dir(path)
    _check_folder(folder, kind)
    torch_dtype = _as_dtype(dtype)
    device = torch.device(device)
    model = freeze(_from_pretrained(kind, path, subfolder, torch_dtype).to(device), family)
    vae = ReferenceVAE(kind=kind, model=model, dtype=torch_dtype, device=device, chunk_size=int(chunk_size))
    if expect_channels is not None and vae.latent_channels != expect_channels:  # the config's latent_channels
        raise ChannelMismatch(
            f"the reference VAE at {path} has {vae.latent_channels} latent channels but "
            f"latent_channels={expect_channels}: set --set latent_channels={vae.latent_channels}",
            vae.latent_channels,
        )
    if latent_mean or latent_std:  # the user's statistics replace the family's normalization
        vae.latent_mean = _per_channel(latent_mean, vae.latent_channels, "ref_latent_mean")
        vae.latent_std = _per_channel(latent_std, vae.latent_channels, "ref_latent_std")
        vae.latent_space = "(z - ref_latent_mean) / ref_latent_std as given"
    else:
        vae.latent_mean, vae.latent_std = family_norm(family, model)
        vae.latent_space = family.latent_space()
    return vae
