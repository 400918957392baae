"""Reference-VAE families: every fact the launcher and the trainer need about one, in one record.

Adding a family (say LTX-Video) is one `Family(...)` in FAMILIES plus its measurements:
the config key `ref_vae_type` accepts it, the memory model predicts its encode, the trainer
loads it, aligns its frames and trims TAEHV's decode by its rule, and the demo builds a tiny
one. tests/test_families.py adds a fake family and checks each of those paths.
Pure: no torch, no diffusers (the CLI's fast path imports this).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Family:
    name: str  # the value of ref_vae_type
    class_name: str  # the diffusers class (config.json's _class_name)
    channels_key: str  # config.json key that holds the latent channel count
    latent_channels: int  # of the released model (16 for all three below)
    time_stride: int  # 1 + stride*k frames -> 1 + k latents (a causal encoder)
    space_stride: int  # pixels per latent along H and W
    # Decoding an even number of latents returns time_stride * L frames instead of 1 + stride*(L-1)
    # (CogVideoX's regrouping); TAEHV's decode is then left untrimmed so its frames line up.
    even_latents_decode_all: bool
    encode_gib: float  # peak GiB of one 12x480x720 clip's encode (bf16, H200; plan/memory.py)
    demo_config: Callable[[int], dict[str, Any]]  # latent channels -> tiny constructor kwargs, real strides

    def causal_frames(self, n_frames: int) -> int:
        """The largest 1 + stride*k <= n_frames: the frames a causal encoder turns into latents."""
        assert n_frames >= 1, f"need at least one frame, got {n_frames}"
        return 1 + self.time_stride * ((n_frames - 1) // self.time_stride)

    def latent_frames(self, n_frames: int) -> int:
        return 1 + (n_frames - 1) // self.time_stride

    def decoded_frames(self, n_latents: int) -> int:
        """Frames the family's own decode returns for n_latents latents."""
        if self.even_latents_decode_all and n_latents % 2 == 0:
            return self.time_stride * n_latents
        return 1 + self.time_stride * (n_latents - 1)

    def trims(self, n_latents: int) -> bool:
        """Whether TAEHV's decode of these latents drops its first frames to line up with the input."""
        return not (self.even_latents_decode_all and n_latents % 2 == 0)


def _cogvideox_demo(channels: int) -> dict[str, Any]:
    return dict(block_out_channels=(8, 8, 8, 8), latent_channels=channels, layers_per_block=1, norm_num_groups=4)


def _hunyuan_demo(channels: int) -> dict[str, Any]:
    return _cogvideox_demo(channels) | {"mid_block_add_attention": True}


def _wan_demo(channels: int) -> dict[str, Any]:
    return dict(
        base_dim=8,
        z_dim=channels,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=1,
        latents_mean=[0.0] * channels,
        latents_std=[1.0] * channels,
    )


# Frame alignment measured in tests/test_refvae.py; encode GiB measured with `taehv-launch bench`.
FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            name="cogvideox",
            class_name="AutoencoderKLCogVideoX",
            channels_key="latent_channels",
            latent_channels=16,
            time_stride=4,
            space_stride=8,
            even_latents_decode_all=True,
            encode_gib=7.32,
            demo_config=_cogvideox_demo,
        ),
        Family(
            name="hunyuan",
            class_name="AutoencoderKLHunyuanVideo",
            channels_key="latent_channels",
            latent_channels=16,
            time_stride=4,
            space_stride=8,
            even_latents_decode_all=False,
            encode_gib=6.09,
            demo_config=_hunyuan_demo,
        ),
        Family(
            name="wan",
            class_name="AutoencoderKLWan",
            channels_key="z_dim",
            latent_channels=16,
            time_stride=4,
            space_stride=8,
            even_latents_decode_all=False,
            encode_gib=3.07,
            demo_config=_wan_demo,
        ),
    )
}


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ConfigError(f"ref_vae_type={name!r} is not supported: use one of {', '.join(FAMILIES)}") from None


def family_of_class(class_name: str) -> Family | None:
    return next((f for f in FAMILIES.values() if f.class_name == class_name), None)
