"""Reference-VAE families: every fact the launcher and the trainer need about one, in one record.

Every TAE upstream (madebyollin/taehv) ships has a row here: the diffusers class of its reference VAE,
TAEHV's shape for it (patch size, latent channels, time strides), the frame rule (which n_frames its
encode and decode line up on), how its latents are normalized into the space the upstream file
decodes, and a tiny demo VAE with the real strides. `ref_vae_type` takes our name or upstream's file
stem (`taew2_2`). Adding a family is one `Family(...)` in FAMILIES: the config key accepts it, the
plan gives TAEHV its shape and n_frames default, the trainer loads, normalizes, aligns and trims by
it, and the demo builds a tiny one (tests/test_families.py adds a fake and checks those paths).
Pure: no torch, no diffusers (the CLI's fast path imports this).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator
from typing import Any

from ..errors import ConfigError
from .family import NORMS, PIXEL_SPACES, Family

__all__ = [
    "CHOICES",
    "FAMILIES",
    "NORMS",
    "PIXEL_SPACES",
    "Family",
    "family_of_class",
    "family_of_config",
    "get_family",
]


class _Choices(Collection):
    """ref_vae_type's valid values: `in` takes a name or an alias, iteration gives the names (docs, keys)."""

    def __contains__(self, value: object) -> bool:
        return isinstance(value, str) and _lookup(value) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(FAMILIES)

    def __len__(self) -> int:
        return len(FAMILIES)


CHOICES = _Choices()


def _wan_demo(channels: int, **extra: Any) -> dict[str, Any]:
    return dict(
        base_dim=8,
        z_dim=channels,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=1,
        latents_mean=[0.0] * channels,
        latents_std=[1.0] * channels,
        **extra,
    )


def _cogvideox_demo(channels: int) -> dict[str, Any]:
    return dict(block_out_channels=(8, 8, 8, 8), latent_channels=channels, layers_per_block=1, norm_num_groups=4)


def _hunyuan_demo(channels: int) -> dict[str, Any]:
    return _cogvideox_demo(channels) | {"mid_block_add_attention": True}


def _wan22_demo(channels: int) -> dict[str, Any]:
    # Wan 2.2's VAE patchifies 2x2 inside (12 input channels) and compresses 16x in space: is_residual
    return _wan_demo(
        channels,
        decoder_base_dim=8,
        in_channels=12,
        out_channels=12,
        patch_size=2,
        scale_factor_spatial=16,
        scale_factor_temporal=4,
        is_residual=True,
    )


def _hunyuan15_demo(channels: int) -> dict[str, Any]:
    # its shortcuts group channels by 2 x latent_channels: every block as wide as a multiple of that
    width = math.lcm(8, 2 * channels)
    return dict(block_out_channels=(width,) * 5, latent_channels=channels, layers_per_block=1)


def _ltx2_demo(channels: int) -> dict[str, Any]:
    return dict(
        latent_channels=channels,
        block_out_channels=(8, 16, 32, 64),
        decoder_block_out_channels=(8, 16, 32),
        layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1),
    )


def _h3_demo(channels: int) -> dict[str, Any]:
    return dict(
        latent_channels=channels,
        block_out_channels=(8, 8, 8, 8, 8, 8),
        layers_per_block=1,
        norm_num_groups=4,
        decoder_num_layers=1,
        decoder_num_attention_heads=1,
        decoder_attention_head_dim=8,
        decoder_num_register_tokens=1,
        latents_mean=[0.0] * channels,
        latents_std=[1.0] * channels,
    )


FOUR_X = dict(time_stride=4, encoder_time_downscale=(True, True, False), decoder_time_upscale=(False, True, True))
EIGHT_X = dict(time_stride=8, encoder_time_downscale=(True, True, True), decoder_time_upscale=(True, True, True))
_TAECVX = "upstream's examples/TAECVX_T2I_Demo.ipynb divides the pipeline's latents by scaling_factor before taecvx"
_WAN = "diffusers' WanPipeline and upstream's taehv issue #22; examples/test_latents_wan.pth has RMS 0.94, mean 0.03"
_LTX = "diffusers' LTX2Pipeline _normalize_latents; upstream's examples/TAELTX2_Encoding_Decoding_Demo.ipynb"

# Frame alignment measured in tests/test_refvae.py; encode GiB measured with `taehv-launch bench`. The last five
# families' encode_gib and step_fit ({checkpointing off: (fixed, per clip)}, from the micro 1 and largest measured
# micro's peaks) come from scripts/gpu_families.sh on one H100, 2026-11-26 (docs/benchmarks.md 'Families on one
# H100', docs/evidence/families/); the step with gradient checkpointing was not measured for them.
FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            name="cogvideox",
            upstream="taecvx",
            aliases=("taecvx",),
            models="CogVideoX 2B/5B, CogVideoX 1.5",
            class_name="AutoencoderKLCogVideoX",
            channels_key="latent_channels",
            latent_channels=16,
            space_stride=8,
            patch_size=1,
            **FOUR_X,
            even_latents_decode_all=True,
            latent_norm="raw",
            norm_source=_TAECVX,
            default_n_frames=12,
            encode_gib=7.32,
            demo_config=_cogvideox_demo,
        ),
        Family(
            name="hunyuan",
            upstream="taehv",
            aliases=("taehv",),
            models="HunyuanVideo",
            class_name="AutoencoderKLHunyuanVideo",
            channels_key="latent_channels",
            latent_channels=16,
            space_stride=8,
            patch_size=1,
            **FOUR_X,
            even_latents_decode_all=False,
            latent_norm="scaling_factor",
            norm_source="diffusers' HunyuanVideoPipeline; ComfyUI feeds taehv the latent format's process_in",
            default_n_frames=12,
            encode_gib=6.09,
            demo_config=_hunyuan_demo,
        ),
        Family(
            name="wan",
            upstream="taew2_1",
            aliases=("taew2_1",),
            models="Wan 2.1, Wan 2.2 14B, Qwen-Image",
            class_name="AutoencoderKLWan",
            channels_key="z_dim",
            latent_channels=16,
            space_stride=8,
            patch_size=1,
            **FOUR_X,
            even_latents_decode_all=False,
            latent_norm="latents_mean_std",
            norm_source=_WAN,
            default_n_frames=12,
            encode_gib=3.07,
            demo_config=_wan_demo,
            config_marks={"patch_size": None},
        ),
        Family(
            name="wan22",
            upstream="taew2_2",
            aliases=("taew2_2",),
            models="Wan 2.2 5B (TI2V)",
            class_name="AutoencoderKLWan",
            channels_key="z_dim",
            latent_channels=48,
            space_stride=16,
            patch_size=2,
            **FOUR_X,
            even_latents_decode_all=False,
            latent_norm="latents_mean_std",
            norm_source=_WAN,
            default_n_frames=12,
            encode_gib=2.77,
            step_fit={False: (0.242, 2.218)},
            demo_config=_wan22_demo,
            config_marks={"patch_size": 2},
            real_config=dict(  # Wan-AI/Wan2.2-TI2V-5B-Diffusers vae/config.json's architecture
                base_dim=160,
                decoder_base_dim=256,
                z_dim=48,
                in_channels=12,
                out_channels=12,
                patch_size=2,
                scale_factor_spatial=16,
                is_residual=True,
                latents_mean=[0.0] * 48,  # random-weight timing models: identity statistics
                latents_std=[1.0] * 48,
            ),
        ),
        Family(
            name="hunyuan15",
            upstream="taehv1_5",
            aliases=("taehv1_5",),
            models="HunyuanVideo 1.5",
            class_name="AutoencoderKLHunyuanVideo15",
            channels_key="latent_channels",
            latent_channels=32,
            space_stride=16,
            patch_size=2,
            **FOUR_X,
            even_latents_decode_all=False,
            latent_norm="scaling_factor",
            norm_source="diffusers' HunyuanVideo15Pipeline",
            default_n_frames=12,
            encode_gib=7.95,
            step_fit={False: (0.242, 2.185)},
            demo_config=_hunyuan15_demo,
            # diffusers 0.42.1's AutoencoderKLHunyuanVideo15 attention fails for a batch of 2 or more (its
            # causal mask (B, S, S) broadcasts against the heads axis): one clip per encode call
            encode_batch_limit=1,
        ),
        Family(
            name="ltx2",
            upstream="taeltx_2",
            aliases=("taeltx_2",),
            models="LTX-2",
            class_name="AutoencoderKLLTX2Video",
            channels_key="latent_channels",
            latent_channels=128,
            space_stride=32,
            patch_size=4,
            **EIGHT_X,
            even_latents_decode_all=False,
            latent_norm="buffers_mean_std",
            norm_source=_LTX,
            default_n_frames=16,
            encode_gib=2.72,
            step_fit={False: (0.238, 2.005)},
            demo_config=_ltx2_demo,
        ),
        Family(
            name="ltx23",
            upstream="taeltx2_3",
            aliases=("taeltx2_3",),
            models="LTX-2.3",
            class_name="AutoencoderKLLTX2Video",
            channels_key="latent_channels",
            latent_channels=128,
            space_stride=32,
            patch_size=4,
            **EIGHT_X,
            even_latents_decode_all=False,
            latent_norm="buffers_mean_std",
            norm_source=_LTX,
            default_n_frames=16,
            encode_gib=2.72,  # this and step_fit: ltx2's measurement (the same architecture, not run apart)
            step_fit={False: (0.238, 2.005)},
            demo_config=_ltx2_demo,
        ),
        Family(
            name="h3",
            upstream="taeh3",
            aliases=("taeh3",),
            models="MiniMax-H3",
            class_name="AutoencoderKLMiniMaxH3",
            channels_key="latent_channels",
            latent_channels=24,
            space_stride=16,
            patch_size=2,
            **FOUR_X,
            even_latents_decode_all=False,
            latent_norm="latents_mean_std",
            norm_source="diffusers' AutoencoderKLMiniMaxH3 docstring (a pipeline encodes (z - mean) / std)",
            default_n_frames=39,
            encode_gib=7.14,
            step_fit={False: (0.358, 9.192)},
            max_micro=4,  # micro 8's step ran out of the H100's 80 GB (37.1 GiB at micro 4)
            demo_config=_h3_demo,
            clip_length=17,
            token_drop=3,
            decode_chunk_latents=5,
            pixel_space="imagenet",
            keeps_tiling=True,
        ),
    )
}


def _lookup(name: str) -> Family | None:
    if name in FAMILIES:
        return FAMILIES[name]
    return next((f for f in FAMILIES.values() if name in f.aliases), None)


def get_family(name: str) -> Family:
    """The family of a name or an alias (upstream's file stem); ConfigError naming the valid ones."""
    family = _lookup(name) if isinstance(name, str) else None
    if family is None:
        names = ", ".join(f"{f.name} ({'/'.join(f.aliases)})" if f.aliases else f.name for f in FAMILIES.values())
        raise ConfigError(f"ref_vae_type={name!r} is not supported: use one of {names}")
    return family


def family_of_class(class_name: str) -> Family | None:
    return next((f for f in FAMILIES.values() if f.class_name == class_name), None)


def family_of_config(config: dict[str, Any]) -> Family | None:
    """The family a reference VAE's config.json is of: its class, and its marks where two families share a
    class (Wan 2.1 and 2.2). LTX-2 and LTX-2.3 share class and layout: this names the first (ltx2)."""
    name = config.get("_class_name")
    return next(
        (
            f
            for f in FAMILIES.values()
            if f.class_name == name and all(config.get(k) == v for k, v in f.config_marks.items())
        ),
        None,
    )
