"""(gpus, profile, topology, overrides) -> Plan. Pure: no I/O, no heavy imports.

Precedence, written once: `--set` > `--config` file > environment (NCCL_TIMEOUT) > profile row > profile >
schema defaults.
Everything derived (global batch, NCCL timeout, frames after trimming) is computed here and
carried in the Plan, so `--dry-run`, the rendered files and the trainer all see one truth.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .families import get_family
from .memory import MemoryPlan, max_clip_pixels, plan_memory, step_floor_gib
from .profiles import PROFILES, STRATEGY_SPEED, STRATEGY_TABLE, Profile, Row, get_profile, nccl_timeout_for, row_for
from .schema import DEFAULTS, global_batch
from .topology import Topology
from .trainable import check_trains_something


def taehv_strides(c: dict[str, Any]) -> tuple[int, int]:
    """TAEHV's (time, space) compression as configured: 2 per downscaling stage, 8 x patch_size in space."""
    return 2 ** sum(c["encoder_time_downscale"]), 8 * c["patch_size"]


def frame_multiple(c: dict[str, Any]) -> int:
    """n_frames must be a multiple of this: TAEHV's temporal stride x Seraena's frames per group
    (4 x 3 = 12 with the defaults, SPEC.md)."""
    return taehv_strides(c)[0] * c["n_seraena_frames"]


@dataclass(frozen=True, kw_only=True)
class Options:
    """Launch options that are not training-config keys."""

    resume: str | None = None  # None, "auto" or a checkpoint path (passed to the trainer)
    debug: bool = False
    profile_run: bool = False  # --profile (torch.profiler); named so it is not the hardware profile
    run_name: str | None = None
    task: str = "train"  # "train", or "cache": write the latent cache (taehv-launch cache)


@dataclass(frozen=True, kw_only=True)
class Plan:
    gpus: int
    profile: Profile
    row: Row
    row_source: str
    topology: Topology
    config: dict[str, Any]
    options: Options
    notes: tuple[str, ...] = field(default_factory=tuple)
    # Decided after resolve() by commands.settle (they read the disk): the run directory and where its
    # name came from ("--run-name", "scheduler job id", "timestamp", "resumed run").
    run_dir: Path | None = None
    run_id_source: str = ""
    demo_assets: tuple[str, str] = ("", "")  # (data_root, ref_vae_path) of the cpu demo; empty elsewhere

    @property
    def world_size(self) -> int:
        return self.topology.world_size

    @property
    def global_batch_size(self) -> int:
        return global_batch(self.config, self.world_size)

    @property
    def latent_space(self) -> str:
        """What TAEHV learns to encode and decode, in one line (the dry run's `latents` line)."""
        if not self.config["use_ref_vae"]:
            return "TAEHV's own encodings (use_ref_vae=False)"
        if self.config["ref_latent_mean"]:
            return "(z - ref_latent_mean) / ref_latent_std as given (they replace the family's normalization)"
        return get_family(self.config["ref_vae_type"]).latent_space()

    @property
    def uses_deepspeed(self) -> bool:
        return self.config["zero_stage"] > 0

    @cached_property
    def memory(self) -> MemoryPlan:
        """Predicted GPU memory per process for this plan (memory.py)."""
        return plan_memory(self.profile.gpu_gib, self.config, self.world_size)

    @property
    def strategy(self) -> str:
        """Which data-parallel strategy, and why, in one line (GPU profiles; '' on the cpu profile)."""
        if self.profile.device == "cpu":
            return ""
        zero, ours = self.config["zero_stage"], self.row.zero_stage
        name = f"ZeRO-{zero}" if zero else "plain DDP (zero_stage=0)"
        if zero == ours:
            others = "/".join(f"{STRATEGY_SPEED[z] * 100:.1f}" for z in (1, 2, 3))
            return (
                f"{name}: the fastest per GPU measured for this model (ZeRO-1/2/3 ran at {others}% of its "
                f"speed; {STRATEGY_TABLE})"
            )
        return (
            f"{name}, as asked: measured at {STRATEGY_SPEED[zero] / STRATEGY_SPEED[ours] * 100:.1f}% of the "
            f"row's {'plain DDP' if ours == 0 else f'ZeRO-{ours}'} speed per GPU for this model ({STRATEGY_TABLE})"
        )

    def batch_arithmetic(self) -> str:
        c = self.config
        return (
            f"global batch {self.global_batch_size} = micro {c['micro_batch_size']} x "
            f"{self.world_size} {'processes' if self.profile.device == 'cpu' else 'GPUs'} x "
            f"accumulation {c['gradient_accumulation_steps']}; "
            f"{self.global_batch_size * c['n_frames']} frames of {c['height']}x{c['width']} per optimizer step"
        )


def row_config(row: Row, topology: Topology) -> dict[str, Any]:
    """The training keys a profile row sets (its fields are named after them), and the NCCL timeout."""
    keys = [f.name for f in fields(Row) if f.name in DEFAULTS]
    return {**{k: getattr(row, k) for k in keys}, "nccl_timeout": nccl_timeout_for(topology.num_machines, row.gpus)}


def resolve(
    gpus: int,
    profile_name: str,
    topology: Topology,
    *,
    file_values: dict[str, Any] | None = None,
    set_values: dict[str, Any] | None = None,
    env_values: dict[str, Any] | None = None,
    options: Options = Options(),
    notes: tuple[str, ...] = (),
) -> Plan:
    """env_values: keys set by the environment (NCCL_TIMEOUT), above the profile, below files and --set."""
    profile = get_profile(profile_name)
    chosen = {**(env_values or {}), **(file_values or {}), **(set_values or {})}
    family = get_family({**profile.config, **chosen}.get("ref_vae_type", DEFAULTS["ref_vae_type"]))
    cap = 0 if "micro_batch_size" in chosen else family.max_micro  # a micro-batch the user gives is not capped
    row, how = row_for(profile, gpus, cap)
    # the family's keys (TAEHV's shape, n_frames) sit just above the schema: everything else overrides them
    above = {**profile.config, **row_config(row, topology), **chosen}
    config = {**DEFAULTS, **family.defaults(), **above, "ref_vae_type": family.name}
    given = frozenset({**(file_values or {}), **(set_values or {})})
    space = 8 * config["patch_size"] if isinstance(config["patch_size"], int) and config["patch_size"] > 0 else 0
    for k in [k for k in ("height", "width") if space and k not in given and config[k] % space]:
        was, config[k] = config[k], config[k] - config[k] % space  # a profile's size on a coarser grid (ltx2)
        notes += (f"{k} {was} -> {config[k]}: TAEHV for {family.name} takes multiples of {space} pixels",)
    if options.debug:
        config = {
            **config,
            "max_train_steps": min(config["max_train_steps"], 20),
            "log_every": 1,
            "dataloader_num_workers": 0,
        }
    check_config(config, profile, topology, given=given)
    if options.task == "train":  # a cache job trains nothing: its loss weights do not matter
        check_trains_something(config)
    return Plan(
        gpus=gpus,
        profile=profile,
        row=row,
        row_source=how,
        topology=topology,
        config=config,
        options=options,
        notes=tuple(notes),
    )


TRACKERS = ("tensorboard", "wandb", "mlflow", "swanlab")  # the `trackers` key's names (train/loop/trackers.py)


HANG_TIMEOUT_FLOOR = 10  # seconds: twice the heartbeat period (train/durability/watchdog.py period_s=5)

# Upper bounds (#35): a value past these is a typo or brings the machine down, never a setting.
# DataLoader workers are processes, per rank: the profiles run 1-12; a node of 8 GPUs with 256 cores
# has 32 per GPU, so 64 is twice what any node can keep busy (100000 forks the machine to a halt).
MAX_WORKERS = 64
# Batches queued per worker: the queue only hides decode jitter (the workers set the rate) and each
# queued batch holds memory in /dev/shm (memory.shm_bytes); the profiles use 2.
MAX_PREFETCH = 16
# The process-group timeout becomes a datetime.timedelta in the trainer, which overflows far above
# this; a collective waiting a week is hung (hang_timeout finds it much sooner).
MAX_NCCL_TIMEOUT = 7 * 24 * 3600


def tracker_names(value: Any) -> list[str]:
    """The `trackers` key as names, in the order given, each once ("tensorboard, mlflow" -> two names);
    ConfigError naming the valid ones for an unknown or empty one."""
    names = list(dict.fromkeys(n.strip().lower() for n in str(value).split(",") if n.strip()))
    unknown = [n for n in names if n not in TRACKERS]
    if unknown or not names:
        what = f"unknown tracker {unknown[0]!r}" if unknown else "no tracker named"
        raise ConfigError(
            f"trackers={value!r}: {what}; choose from {', '.join(TRACKERS)}, comma-separated "
            f"(e.g. --set trackers=tensorboard,wandb)"
        )
    return names


def check_seraena_crop(c: dict[str, Any], space: int, given: bool) -> None:
    """train/model/seraena.py's seraena_crop: a square window on TAEHV's latent grid (`space` pixels a
    cell), so 0 (off: the whole frame) or a positive multiple of `space`; a crop not smaller than both
    sides is the whole frame, which a profile's default may be on small clips but a user's value is
    refused as a mistake (10000)."""
    crop, side = c["seraena_crop"], max(c["height"], c["width"])
    if crop == 0 or (crop > 0 and crop % space == 0 and (crop <= side or not given)):
        return
    largest = side - side % space
    raise ConfigError(
        f"seraena_crop={crop} must be 0 (off: the whole frame) or a multiple of {space} (TAEHV's latent grid, "
        f"8 x patch_size) from {space} to {largest} (the {c['height']}x{c['width']} clips' larger side), "
        f"e.g. --set seraena_crop={min(largest, max(space, abs(crop) // space * space))}"
    )


def check_clip_size(c: dict[str, Any], profile: Profile) -> None:
    """Clips far beyond what any profile can hold (#35: a 100000x100000 crop passed): the least memory
    one clip's training step can take (memory.step_floor_gib: micro 1, gradient checkpointing, no
    reference encode; for a TAEHV shape never measured, the clip's own bytes) above the largest GPU of
    any profile is refused everywhere. On the cpu profile, where no GPU memory model applies, the same
    floor at its micro-batch is refused too (a GPU profile's memory plan refuses that one with a
    micro-batch that fits)."""
    biggest = max((p for p in PROFILES.values() if p.gpu_gib), key=lambda p: p.gpu_gib)
    largest, holds = biggest.gpu_gib, f"more than the largest profile holds ({biggest.name}, {biggest.gpu_gib:g} GiB)"
    micro = c["micro_batch_size"] if profile.gpu_gib is None else 1
    floor = step_floor_gib(c, micro)
    if floor <= largest:
        return
    pixels = c["n_frames"] * c["height"] * c["width"]
    limit = max_clip_pixels(c, largest, micro)
    if micro > 1 and pixels <= max_clip_pixels(c, largest):
        raise ConfigError(
            f"micro_batch_size={micro} of {c['n_frames']}x{c['height']}x{c['width']} clips needs at least "
            f"{floor:.0f} GiB per process, {holds}: use micro_batch_size "
            f"{'1' if (most := max_clip_pixels(c, largest) // pixels) <= 1 else f'1-{most}'} "
            f"(raise gradient_accumulation_steps instead)"
        )
    raise ConfigError(
        f"clips of {c['n_frames']}x{c['height']}x{c['width']} (n_frames x height x width = {pixels:,} pixels) "
        f"need at least {floor:.0f} GiB per process{f' at micro {micro}' if micro > 1 else ''}, {holds}: keep "
        f"n_frames x height x width at most {limit:,} "
        f"(e.g. 12x480x720 = 4,147,200)"
    )


def tracker_library_line(name: str) -> str:
    """The one line for a chosen tracker whose library is not installed (the launch and the trainer)."""
    return f"trackers={name} needs the {name} library: pip install 'taehv-launch[{name}]'"


def check_config(c: dict[str, Any], profile: Profile, topology: Topology, given: frozenset[str] = frozenset()) -> None:
    """Cross-field checks; each error names the key to change. given: the keys the user set (--set, --config)."""

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(msg)

    for k in ("encoder_time_downscale", "decoder_time_upscale", "decoder_space_upscale"):
        need(
            len(c[k]) == 3 and all(isinstance(v, bool) for v in c[k]),
            f"{k}={c[k]!r} must be three booleans, e.g. (True, True, False)",
        )
    need(c["n_seraena_frames"] >= 1, f"n_seraena_frames={c['n_seraena_frames']} must be at least 1")
    need(c["patch_size"] >= 1, f"patch_size={c['patch_size']} must be at least 1")
    family = get_family(c["ref_vae_type"])
    time, space = taehv_strides(c)
    if c["use_ref_vae"]:
        need(
            (time, space) == (family.time_stride, family.space_stride),
            f"TAEHV compresses {time}x in time and {space}x in space (encoder_time_downscale, patch_size) but "
            f"the {family.name} reference VAE compresses {family.time_stride}x and {family.space_stride}x: "
            f"set them to match the reference VAE",
        )
    if (time, space) == (family.time_stride, family.space_stride):  # the family's frame rule (families.py)
        family.check_n_frames(c["n_frames"], c["n_seraena_frames"])
    multiple = frame_multiple(c)  # use_ref_vae=False with other strides: whole groups of TAEHV's stride
    need(
        (time, space) == (family.time_stride, family.space_stride)
        or (c["n_frames"] >= multiple and c["n_frames"] % multiple == 0),
        f"n_frames={c['n_frames']} must be a multiple of {multiple} (TAEHV's temporal stride {time} x "
        f"Seraena's {c['n_seraena_frames']}-frame groups): use --set n_frames={multiple} or {2 * multiple}",
    )
    for k in ("height", "width"):
        need(
            c[k] >= space and c[k] % space == 0,
            f"{k}={c[k]} must be a positive multiple of {space} (TAEHV downsamples 8x x patch_size)",
        )
    check_seraena_crop(c, space, "seraena_crop" in given)
    check_clip_size(c, profile)
    need(str(c["output_dir"]).strip() != "", "output_dir is empty: give a folder, e.g. --set output_dir=output")
    need(
        1 <= c["min_frame_delta"] <= c["max_frame_delta"],
        f"need 1 <= min_frame_delta ({c['min_frame_delta']}) <= max_frame_delta ({c['max_frame_delta']})",
    )
    for k in (
        "micro_batch_size",
        "gradient_accumulation_steps",
        "max_train_steps",
        "checkpointing_steps",
        "validation_steps",
        "log_every",
        "checkpoints_total_limit",
        "validation_batch_size",
        "ref_vae_chunk_size",
        "nccl_timeout",
        "latent_channels",
        "cache_views",
        "cache_shard_size",
        "max_consecutive_bad_steps",
        "loss_spike_window",
        "rollback_window",
    ):
        need(c[k] >= 1, f"{k}={c[k]} must be at least 1")
    for k in (
        "dataloader_num_workers",
        "lr_warmup_steps",
        "max_validation_batches",
        "num_sample_clips",
        "rollback_lr_steps",
        "hang_timeout",
        "hang_timeout_slow",
        "max_restarts",
        "max_restarts_without_progress",
    ):
        need(c[k] >= 0, f"{k}={c[k]} must not be negative")
    need(c["bucket_size_mb"] >= 0, f"bucket_size_mb={c['bucket_size_mb']} must not be negative (0 = the profile's)")
    need(
        c["dataloader_num_workers"] <= MAX_WORKERS,
        f"dataloader_num_workers={c['dataloader_num_workers']} is out of range: use 0-{MAX_WORKERS} worker "
        f"processes per rank (the profiles use 1-12)",
    )
    need(
        1 <= c["prefetch_factor"] <= MAX_PREFETCH,
        f"prefetch_factor={c['prefetch_factor']} is out of range: use 1-{MAX_PREFETCH} batches per worker (default 2)",
    )
    need(
        c["nccl_timeout"] <= MAX_NCCL_TIMEOUT,
        f"nccl_timeout={c['nccl_timeout']} is out of range: use 1-{MAX_NCCL_TIMEOUT} seconds (a week; default 1800)",
    )
    need(0.0 < c["learning_rate"] < 1.0, f"learning_rate={c['learning_rate']} is out of range (0, 1)")
    need(0.0 <= c["ema_decay"] < 1.0, f"ema_decay={c['ema_decay']} must be in [0, 1)")
    need(0.0 <= c["validation_fraction"] < 1.0, f"validation_fraction={c['validation_fraction']} must be in [0, 1)")
    need(c["max_grad_norm"] > 0, f"max_grad_norm={c['max_grad_norm']} must be positive")
    need(
        len(c["ref_latent_mean"]) == len(c["ref_latent_std"]),
        "ref_latent_mean and ref_latent_std must have the same length (one value per latent channel)",
    )
    need(
        c["loss_spike_factor"] == 0 or c["loss_spike_factor"] > 1,
        f"loss_spike_factor={c['loss_spike_factor']} must be above 1 (a loss this many times its median), or 0 = off",
    )
    need(
        c["max_requeues_without_progress"] >= 0,
        f"max_requeues_without_progress={c['max_requeues_without_progress']}: use 0 (requeue without limit) or more",
    )
    need(0 < c["rollback_lr_factor"] <= 1, f"rollback_lr_factor={c['rollback_lr_factor']} must be in (0, 1]")
    need(
        c["straggler_threshold"] >= 0,
        f"straggler_threshold={c['straggler_threshold']} must not be negative (0.2 = 20%; 0 = no line)",
    )
    need(
        not c["hang_timeout"] or c["hang_timeout"] >= HANG_TIMEOUT_FLOOR,
        f"hang_timeout={c['hang_timeout']} is below {HANG_TIMEOUT_FLOOR} s: ranks write their heartbeat every "
        f"{HANG_TIMEOUT_FLOOR // 2} s, so a shorter limit reports healthy ranks as hung; use {HANG_TIMEOUT_FLOOR} "
        f"or more (default 300), or 0 = off",
    )
    need(
        not c["hang_timeout"] or c["hang_timeout_slow"] >= c["hang_timeout"],
        f"hang_timeout_slow={c['hang_timeout_slow']} is below hang_timeout={c['hang_timeout']}: the slow phases' "
        "limit must be at least the normal one",
    )
    need(
        0 <= c["video_decode_threads"] <= 32,
        f"video_decode_threads={c['video_decode_threads']} must be 0 (chosen from the sources) or 1-32",
    )
    tracker_names(c["trackers"])
    if profile.device == "cpu":
        need(c["mixed_precision"] in ("no", "bf16"), "mixed_precision=fp16 is not supported on the cpu profile")
        need(
            c["video_decoder"] != "nvdec",
            "video_decoder=nvdec decodes on a GPU's NVDEC; the cpu profile has "
            "none: use --set video_decoder=opencv (or auto)",
        )
    if c["latent_cache"] and not c["use_ref_vae"]:
        raise ConfigError(
            "latent_cache holds reference latents but use_ref_vae=False trains without them: drop one of the two"
        )
    if not c["use_ref_vae"] and c["encoder_loss_weight"] > 0:
        raise ConfigError(
            "use_ref_vae=False leaves the encoder without a target: "
            "set --set encoder_loss_weight=0 or keep use_ref_vae=True"
        )
