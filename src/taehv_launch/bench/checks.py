"""The bench commands' arguments, checked before anything is imported, built or timed: a bad value
is one `error:` line and exit 2, never a traceback or a failure after minutes of measuring.
Stdlib and plan/ only (no torch)."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import ConfigError, UserError
from ..plan.families import get_family
from ..plan.resolve import frame_multiple, taehv_strides
from ..plan.schema import DEFAULTS, KEYS

LOADER_DECODERS = ("opencv", "opencv-1thread", "pyav", "pyav-1thread")
DECODER_CHOICES = (*LOADER_DECODERS, "nvdec")
SPEED_WINDOW_STEPS = 2  # train/loop/timing.py: speed.json needs a step after its warm-up step


def at_least(option: str, values: int | float | Iterable[int | float], low: int, what: str) -> None:
    for value in [values] if isinstance(values, (int, float)) else values:
        if value < low:
            raise ConfigError(f"{option} {value}: {what}")


def clip_shape(height: int, width: int, n_frames: int | None, ref_vae_type: str | None = None) -> None:
    """The trainer's rule for TAEHV of the family (cogvideox's shape when none is named): height and width
    positive multiples of its space stride, n_frames by the family's frame rule (plan/family.py)."""
    family = get_family(ref_vae_type) if ref_vae_type else None
    space = family.space_stride if family else taehv_strides(DEFAULTS)[1]
    for option, value in (("--height", height), ("--width", width)):
        if value < space or value % space:
            example = 480 if option == "--height" else (720 if space <= 16 else 704)
            raise ConfigError(
                f"{option} {value}: give a positive multiple of {space} "
                f"({family.name + ' downsamples' if family else 'TAEHV downsamples'} {space}x), e.g. {option} {example}"
            )
    if n_frames is None:
        return
    if family is None:
        multiple = frame_multiple(DEFAULTS)
        if n_frames < multiple or n_frames % multiple:
            raise ConfigError(
                f"--n-frames {n_frames}: give a positive multiple of {multiple} (TAEHV's temporal stride x "
                f"Seraena's frame groups), e.g. --n-frames {multiple}"
            )
        return
    if not family.valid_n_frames(n_frames):
        near = family.first_valid(3, start=n_frames - 2 * family.frame_multiple)
        raise ConfigError(
            f"--n-frames {n_frames} does not fit --ref-vae-type {family.name}: it takes {family.frame_rule()} "
            f"whose decoded frames fill Seraena's 3-frame groups: use {', '.join(map(str, near))}, "
            f"e.g. --n-frames {min(near, key=lambda v: abs(v - n_frames))}"
        )


def step_frames(n_frames: int | None, ref_vae_type: str | None) -> int:
    """bench step's --n-frames: as given, else the family's default clip length (12 without a family)."""
    if n_frames is not None:
        return n_frames
    if ref_vae_type is None:
        return 12
    try:
        return get_family(ref_vae_type).default_n_frames
    except ConfigError as err:
        raise ConfigError(f"--ref-vae-type: {err}") from None


def step_args(
    micros: list[int],
    height: int,
    width: int,
    n_frames: int | None,
    ref_vae_type: str | None,
    chunks: list[int],
    decoder_arch: str = "base",
) -> None:
    at_least("--micro", micros, 1, "give micro-batch sizes of at least 1, e.g. --micro 1 --micro 2")
    if ref_vae_type is not None:
        try:
            get_family(ref_vae_type)
        except ConfigError as err:
            raise ConfigError(f"--ref-vae-type: {err}") from None
    clip_shape(height, width, n_frames, ref_vae_type)
    archs = KEYS["decoder_arch"].choices
    if decoder_arch not in archs:
        raise ConfigError(f"--decoder-arch {decoder_arch!r}: use one of {', '.join(archs)}")
    at_least("--chunk", chunks, 1, "give reference encode chunk sizes of at least 1, e.g. --chunk 1")


def loader_args(
    height: int,
    width: int,
    n_frames: int,
    micro: int,
    workers: list[int],
    decoders: list[str],
    seconds: float,
    clips: int,
    resolutions: list[int] | None,
) -> None:
    clip_shape(height, width, None)
    at_least("--n-frames", n_frames, 1, "give at least 1 frame per clip")
    at_least("--micro", micro, 1, "give a micro-batch size of at least 1")
    at_least("--workers", workers, 0, "give DataLoader worker counts of 0 (in this process) or more")
    for name in decoders:
        if name not in DECODER_CHOICES:
            raise ConfigError(f"--decoder {name!r} is not a decoder: use one of {', '.join(DECODER_CHOICES)}")
    if not seconds > 0:  # nan too
        raise ConfigError(f"--seconds {seconds}: give a positive time per DataLoader row, e.g. --seconds 10")
    at_least("--clips", clips, 1, "give at least 1 clip per decode row")
    at_least("--resolution", resolutions or [], 1, "give source video heights in pixels, e.g. --resolution 720")


def compare_args(
    steps: int, trainer_steps: int, chunks: list[int], crop: int, data_root: str | None, cached: int, cached_sets
) -> None:
    from ..plan.configfile import parse_sets

    at_least("--steps", steps, 1, "give at least 1 timed step per row")
    at_least(
        "--trainer-steps",
        trainer_steps,
        SPEED_WINDOW_STEPS,
        f"the trainer run needs at least {SPEED_WINDOW_STEPS} steps to measure its speed (its first 10 are "
        f"warm-up from 20 steps on): give e.g. --trainer-steps 40",
    )
    at_least("--chunk", chunks, 1, "give reference encode chunk sizes of at least 1")
    _, space = taehv_strides(DEFAULTS)
    if crop < 0 or crop % space:
        raise ConfigError(f"--crop {crop}: give 0 (no Seraena crop) or a positive multiple of {space}, e.g. --crop 256")
    at_least("--cached", cached, 0, "give 0 (no latent cache row) or a number of views per video, e.g. --cached 1")
    parse_sets(list(cached_sets or []))
    if data_root:
        from ..run.inputs import check_data_root

        try:
            check_data_root(data_root)
        except UserError as err:
            raise type(err)(f"--data-root: {err}") from None
