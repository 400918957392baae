"""The record of one reference-VAE family (plan/families.py holds the records): its facts and the rules
derived from them (the frame rule, TAEHV's shape, how its latents are normalized). Pure: no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import ConfigError

# How the reference VAE's output z becomes the latent TAEHV encodes and decodes (docs/families.md):
NORMS = {
    "raw": "z as the VAE encodes it (no scale or shift)",
    "scaling_factor": "z * scaling_factor (the VAE's config.json)",
    "latents_mean_std": "(z - latents_mean) / latents_std (the VAE's config.json)",
    "buffers_mean_std": "(z - latents_mean) * scaling_factor / latents_std (latents_mean/std: buffers in the "
    "VAE's weights; scaling_factor: its config.json)",
}
# How frames in [0, 1] become the VAE's input: [-1, 1], or ImageNet-normalized RGB (MiniMax-H3).
PIXEL_SPACES = ("minus_one_one", "imagenet")


@dataclass(frozen=True, kw_only=True)
class Family:
    name: str  # the value of ref_vae_type
    upstream: str  # upstream's file stem of the base decoder's weights ("taecvx"); also an accepted name
    aliases: tuple[str, ...]  # other accepted names for ref_vae_type (upstream's stems)
    models: str  # the diffusion models whose VAE this is (docs)
    class_name: str  # the diffusers class (config.json's _class_name)
    channels_key: str  # config.json key that holds the latent channel count
    latent_channels: int  # of the released model
    time_stride: int  # 1 + stride*k frames -> 1 + k latents (a causal encoder)
    space_stride: int  # pixels per latent along H and W
    # TAEHV's shape for this family (upstream taehv.py's settings for its file)
    patch_size: int
    encoder_time_downscale: tuple[bool, bool, bool]
    decoder_time_upscale: tuple[bool, bool, bool]
    # Decoding an even number of latents returns time_stride * L frames instead of 1 + stride*(L-1)
    # (CogVideoX's regrouping); TAEHV's decode is then left untrimmed so its frames line up.
    even_latents_decode_all: bool
    latent_norm: str  # a key of NORMS: the latent space of upstream's file (see docs/families.md)
    norm_source: str  # the evidence for latent_norm (docs)
    default_n_frames: int  # n_frames when the user sets none (a valid one: check_n_frames)
    # Peak GiB of one clip's encode at the step's measured size (12x480x720 for the first three families, bf16,
    # H200; the others at step_frames() on one H100 by scripts/gpu_families.sh); None: not measured yet
    encode_gib: float | None
    demo_config: Callable[[int], dict[str, Any]]  # latent channels -> tiny constructor kwargs, real strides
    # Chunked encode (MiniMax-H3): clip_length frames per chunk (0 = none), token_drop trailing latents
    # dropped after the whole encode, decode in decode_chunk_latents-latent chunks trimmed one by one.
    clip_length: int = 0
    token_drop: int = 0
    decode_chunk_latents: int = 0
    pixel_space: str = "minus_one_one"  # one of PIXEL_SPACES
    keeps_tiling: bool = False  # the VAE's own spatial tiling stays on (released that way: MiniMax-H3)
    encode_batch_limit: int = 0  # clips per encode call at most (0 = ref_vae_chunk_size decides)
    # The base decoder's training step at step_frames() (plan/memory.py): gradient_checkpointing -> (fixed GiB,
    # GiB per clip), fitted to `bench step` peaks at micro 1-8 (scripts/gpu_families.sh); empty: the
    # step of a patch-1, 4x TAEHV is memory.STEP_FIT's, any other shape is not predicted
    step_fit: dict[bool, tuple[float, float]] = field(default_factory=dict)
    # The largest micro-batch a GPU profile's row gives this family (0: no cap): a row above it runs this
    # micro-batch with accumulation raised to keep its global batch (profiles.row_for; the plan says so).
    # A --set micro_batch_size is the user's and is not capped.
    max_micro: int = 0
    real_config: dict[str, Any] = field(default_factory=dict)  # over the class defaults: the released shape
    # config.json values that tell this family from another of the same class (Wan 2.1 / 2.2: patch_size)
    config_marks: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert self.latent_norm in NORMS, f"{self.name}: latent_norm {self.latent_norm!r} not in {list(NORMS)}"
        assert self.pixel_space in PIXEL_SPACES, f"{self.name}: pixel_space {self.pixel_space!r}"
        assert 2 ** sum(self.encoder_time_downscale) == self.time_stride, f"{self.name}: TAEHV's time stride"
        assert 8 * self.patch_size == self.space_stride, f"{self.name}: TAEHV's space stride is 8 x patch_size"

    # --- names -------------------------------------------------------------------------

    def export_stem(self, decoder_arch: str = "base") -> str:
        """The exported weights' file name without suffix, as upstream names its files: taew2_2, taew2_2_super."""
        return self.upstream if decoder_arch == "base" else f"{self.upstream}_{decoder_arch}"

    def defaults(self) -> dict[str, Any]:
        """The config keys this family sets unless a profile, a config file or --set does (plan/resolve.py)."""
        return {
            "n_frames": self.default_n_frames,
            "patch_size": self.patch_size,
            "latent_channels": self.latent_channels,
            "encoder_time_downscale": self.encoder_time_downscale,
            "decoder_time_upscale": self.decoder_time_upscale,
        }

    def step_frames(self) -> tuple[int, int, int]:
        """n_frames, height, width at which step_fit and encode_gib are measured: the h100 profile's clip
        (480x720; 480x704 where the VAE downsamples 32x) of default_n_frames."""
        return self.default_n_frames, 480, 704 if self.space_stride > 16 else 720

    # --- frames ------------------------------------------------------------------------

    @property
    def chunk_tail(self) -> int:
        """Chunked families: the frames of the last chunk that its kept latents stand for (H3: 5)."""
        return 1 + self.time_stride * (math.ceil(self.clip_length / self.time_stride) - self.token_drop - 1)

    def causal_frames(self, n_frames: int) -> int:
        """The largest 1 + stride*k <= n_frames: the frames a causal encoder turns into latents."""
        assert n_frames >= 1, f"need at least one frame, got {n_frames}"
        return 1 + self.time_stride * ((n_frames - 1) // self.time_stride)

    def ref_frames(self, n_frames: int) -> int:
        """How many of a clip's first frames the reference VAE encodes: all of them for a chunked family
        (it pads the last chunk itself), else the causal 1 + stride*k (see train/reference/refvae.py)."""
        return n_frames if self.clip_length else self.causal_frames(n_frames)

    def latent_frames(self, n_frames: int) -> int:
        if self.clip_length and n_frames > 1:
            per_chunk = math.ceil(self.clip_length / self.time_stride)
            return math.ceil(n_frames / self.clip_length) * per_chunk - self.token_drop
        return 1 + (n_frames - 1) // self.time_stride

    def decoded_frames(self, n_latents: int) -> int:
        """Frames the family's own decode returns for n_latents latents (TAEHV's trimmed decode matches)."""
        if self.decode_chunk_latents:  # chunks of decode_chunk_latents, each trimmed, then the tail dropped
            chunk = self.decode_chunk_latents * self.time_stride
            chunks = math.ceil(n_latents * self.time_stride / chunk)
            return chunks * (chunk - (self.time_stride - 1)) - self.token_drop * self.time_stride
        if self.even_latents_decode_all and n_latents % 2 == 0:
            return self.time_stride * n_latents
        return 1 + self.time_stride * (n_latents - 1)

    def trims(self, n_latents: int) -> bool:
        """Whether TAEHV's decode of these latents drops its first frames to line up with the input."""
        return not (self.even_latents_decode_all and n_latents % 2 == 0)

    def encodes_whole(self, n_frames: int) -> bool:
        """TAEHV and the reference VAE both take exactly n_frames: a multiple of the time stride (TAEHV pads
        nothing), or for a chunked family whole chunks plus the tail its kept latents stand for."""
        if self.clip_length:
            return n_frames >= self.chunk_tail and n_frames % self.clip_length == self.chunk_tail
        return n_frames >= self.time_stride and n_frames % self.time_stride == 0

    def valid_n_frames(self, n_frames: int, group: int = 3) -> bool:
        """The frame rule: the clip encodes whole and its decoded frames split into Seraena's `group`-frame
        groups (n_seraena_frames), so no group is padded."""
        if not self.encodes_whole(n_frames):
            return False
        decoded = self.decoded_frames(self.latent_frames(n_frames))
        return 0 < decoded <= n_frames and decoded % group == 0

    def first_valid(self, count: int = 3, group: int = 3, start: int = 1) -> list[int]:
        """The first `count` valid n_frames at or above `start`."""
        found, n = [], max(1, start)
        while len(found) < count and n < 100_000:
            if self.valid_n_frames(n, group):
                found.append(n)
            n += 1
        return found

    @property
    def frame_multiple(self) -> int:
        """The spacing of valid n_frames with Seraena's 3-frame groups: 12 for the 4x families (whose valid
        values are its multiples), 24 for the LTX families (16, 40, 64, ...), 51 for H3 (39, 90, ...)."""
        return self.spacing(3)

    def spacing(self, group: int) -> int:
        a, b = self.first_valid(2, group)
        return b - a

    def frame_rule(self) -> str:
        """The rule in words, for messages and docs."""
        if self.clip_length:
            return f"{self.clip_length}k + {self.chunk_tail} frames (it encodes {self.clip_length}-frame chunks)"
        return f"a multiple of {self.time_stride} (its {self.time_stride}x time stride)"

    def check_n_frames(self, n_frames: int, group: int = 3) -> None:
        """None when n_frames fits this family's frame rule, else ConfigError naming valid values."""
        if self.valid_n_frames(n_frames, group):
            return
        near = self.first_valid(3, group, start=n_frames - 2 * self.spacing(group))
        raise ConfigError(
            f"n_frames={n_frames} does not fit ref_vae_type={self.name}: it takes {self.frame_rule()} whose "
            f"decoded frames fill Seraena's {group}-frame groups (n_seraena_frames): use "
            f"{', '.join(map(str, near[:-1]))} or {near[-1]}, e.g. --set n_frames={min(near, key=lambda v: abs(v - n_frames))}"
        )

    # --- the reference's latents -----------------------------------------------------------

    def latent_space(self) -> str:
        """One line for the plan: what TAEHV learns for this family."""
        return f"{NORMS[self.latent_norm]}: the latent space of upstream's {self.upstream}"
