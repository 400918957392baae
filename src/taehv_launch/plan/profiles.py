"""Hardware profiles and the seed tables, as data, plus the one rule for other GPU counts.

The H100 rows are the seeds' table (SPEC.md) verbatim. A800 keeps every column but runs
micro-batch 2 and raises accumulation to keep the H100 global batch. H200 starts from the
H100 rows (the GPU is larger; its micro-batch is to be raised only from measurement).
`cpu` is the built-in demo. Nothing here does I/O or imports anything heavy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..errors import ConfigError
from .schema import global_batch

BASE_GLOBAL_BATCH = 128  # the global batch every derived count aims for
BASE_LEARNING_RATE = 1e-4  # at BASE_GLOBAL_BATCH; scaled linearly with the real global batch


@dataclass(frozen=True, kw_only=True)
class Row:
    """One line of a profile table: everything that varies with the GPU count."""

    gpus: int
    # the training-config keys a row sets, under their config names (resolve.row_config)
    micro_batch_size: int
    gradient_accumulation_steps: int
    learning_rate: float
    lr_warmup_steps: int
    zero_stage: int
    checkpointing_steps: int
    validation_steps: int
    log_every: int
    dataloader_num_workers: int
    prefetch_factor: int
    bucket: float = 5e8  # DeepSpeed reduce/allgather bucket size (rendered into deepspeed.json)

    @property
    def global_batch(self) -> int:
        return global_batch(self, self.gpus)


# Strategy per row by measurement (docs/benchmarks.md "Strategy per row"): TAEHV has ~11M parameters,
# so ZeRO has at most ~0.17 GiB per GPU to partition and only costs speed. On one H100 (2026-11-24,
# compile 'all', micro 8) per-GPU clips/s relative to plain DDP (zero_stage=0): ZeRO-1 96.5%, ZeRO-2
# 96.7%, ZeRO-3 90.0% (TAEHV compiled inside ZeRO-3 did not pay: 89.6-90.9%); on 2 x H200 DDP and ZeRO-2
# ran equal within 0.1%. Every row runs plain DDP; the seeds asked for ZeRO-2 (8 GPUs) and ZeRO-3
# (16-64 GPUs) without measuring. `--set zero_stage=N` still gets exactly ZeRO-N, with a note of its cost.
STRATEGY_SPEED = {0: 1.0, 1: 0.965, 2: 0.967, 3: 0.900}  # per-GPU speed vs DDP, measured as above
STRATEGY_TABLE = 'docs/benchmarks.md "Strategy per row"'
# fmt: off
H100_ROWS = (
    Row(gpus=1, micro_batch_size=8, gradient_accumulation_steps=16, learning_rate=1e-4, lr_warmup_steps=2000, zero_stage=0,
        checkpointing_steps=2000, validation_steps=1000, log_every=50, dataloader_num_workers=4, prefetch_factor=2),
    Row(gpus=8, micro_batch_size=8, gradient_accumulation_steps=2, learning_rate=1e-4, lr_warmup_steps=2000, zero_stage=0,
        checkpointing_steps=2000, validation_steps=1000, log_every=25, dataloader_num_workers=8, prefetch_factor=2),
    Row(gpus=16, micro_batch_size=8, gradient_accumulation_steps=1, learning_rate=1e-4, lr_warmup_steps=1500, zero_stage=0,
        checkpointing_steps=1000, validation_steps=500, log_every=20, dataloader_num_workers=12, prefetch_factor=3),
    Row(gpus=48, micro_batch_size=5, gradient_accumulation_steps=1, learning_rate=1.8e-4, lr_warmup_steps=1200, zero_stage=0,
        checkpointing_steps=750, validation_steps=500, log_every=15, dataloader_num_workers=11, prefetch_factor=3, bucket=7.5e8),
    Row(gpus=64, micro_batch_size=4, gradient_accumulation_steps=1, learning_rate=2e-4, lr_warmup_steps=1000, zero_stage=0,
        checkpointing_steps=500, validation_steps=500, log_every=10, dataloader_num_workers=12, prefetch_factor=4, bucket=1e9),
)
# fmt: on

# Training-config keys shared by every GPU row of the GPU profiles (SPEC.md "Shared").
GPU_SHARED = {
    "height": 480,
    "width": 720,
    # n_frames: the reference family's default (plan/families.py: 12 for the 4x families)
    "min_frame_delta": 1,
    "max_frame_delta": 2,
    "adam_beta1": 0.9,
    "adam_beta2": 0.95,
    "adam_weight_decay": 1e-2,
    "max_grad_norm": 1.0,
    "lr_scheduler": "cosine",
    "mixed_precision": "bf16",
    "ref_vae_dtype": "bfloat16",
    "max_train_steps": 100_000,
    # Speed levers, each measured on its own row in docs/benchmarks.md (H100, 2026-11-23/24): compiling
    # the reference encoder, a 256-pixel Seraena crop, and compiling TAEHV channels-last pay (the real
    # trainer: 6.8 -> 7.1 -> 7.2 clips/s for `reference` -> `all` -> `all` channels-last, peak 53.7 -> 52.6 GiB).
    "compile": "all",
    "seraena_crop": 256,
}

# H100/H200: PyTorch's default allocator. The seeds' "expandable_segments:True,max_split_size_mb:128"
# measured 14% slower on a real H100 run (5.88 vs 6.81 clips/s, same peak 54 GiB, docs/benchmarks.md).
H100_ALLOC_CONF = "expandable_segments:False"
A800_ALLOC_CONF = "expandable_segments:True,max_split_size_mb:64,roundup_power2_divisions:16"


@dataclass(frozen=True, kw_only=True)
class Profile:
    name: str
    description: str
    table: str  # where the rows come from, for the plan's "rows" line
    rows: tuple[Row, ...]
    config: dict  # training-config keys this profile sets beyond the rows
    alloc_conf: str | None  # PYTORCH_CUDA_ALLOC_CONF, None on CPU
    device: str  # "cuda" or "cpu"
    gpu_gib: float | None  # memory of one GPU as torch reports it (GiB); None on CPU
    micro_override: int | None = None  # A800: fixed micro-batch, accumulation raised to compensate
    micro_max: int | None = None  # H200: raise the micro-batch up to this, keeping the global batch
    max_gpus: int = 64


SEED_TABLE = "the seeds' H100 table"  # a800 and h200 start from its rows too


def _cpu_rows() -> tuple[Row, ...]:
    row = dict(
        micro_batch_size=1,
        gradient_accumulation_steps=1,
        learning_rate=5e-4,
        lr_warmup_steps=5,
        zero_stage=0,
        checkpointing_steps=20,
        validation_steps=20,
        log_every=5,
        dataloader_num_workers=1,
        prefetch_factor=2,
    )
    return (Row(gpus=1, **row), Row(gpus=2, **row))


PROFILES: dict[str, Profile] = {
    # ref_vae_chunk_size 2: the compiled CogVideoX encode of 8 clips took 1280 ms per micro-batch step at
    # chunk 2 vs 1423 ms at chunk 4 (H100), peak 12.8 GiB, far below the step's own (docs/benchmarks.md).
    "h100": Profile(
        name="h100",
        description="NVIDIA H100 80GB (the seeds' table)",
        table=SEED_TABLE,
        rows=H100_ROWS,
        config=GPU_SHARED | {"ref_vae_chunk_size": 2},
        alloc_conf=H100_ALLOC_CONF,
        device="cuda",
        gpu_gib=80.0,
    ),
    "a800": Profile(
        name="a800",
        description="NVIDIA A800 80GB: micro-batch 2, accumulation keeps the global batch",
        table=SEED_TABLE,
        rows=H100_ROWS,
        config=GPU_SHARED,
        alloc_conf=A800_ALLOC_CONF,
        device="cuda",
        gpu_gib=80.0,
        micro_override=2,
    ),
    # H200: micro-batch raised to 16 where the global batch allows: measured peak at 12x480x720 is
    # 0.28 + 6.31 GiB per clip (+3.3 GiB trainer overhead), ~105 GiB at 16 (memory.py).
    "h200": Profile(
        name="h200",
        description="NVIDIA H200 141GB: the H100 table, micro-batch up to 16 (measured to fit)",
        table=SEED_TABLE,
        rows=H100_ROWS,
        config=GPU_SHARED | {"ref_vae_chunk_size": 2},
        alloc_conf=H100_ALLOC_CONF,
        device="cuda",
        gpu_gib=140.4,
        micro_max=16,
    ),
    "cpu": Profile(
        name="cpu",
        description="built-in CPU demo: synthetic videos, tiny reference VAE, a few dozen steps",
        table="the cpu demo's table",
        rows=_cpu_rows(),
        alloc_conf=None,
        device="cpu",
        gpu_gib=None,
        max_gpus=2,
        config={
            "height": 64,
            "width": 64,
            "min_frame_delta": 1,
            "max_frame_delta": 2,
            "latent_channels": 4,
            "ref_vae_type": "cogvideox",
            "ref_vae_dtype": "float32",
            "mixed_precision": "no",
            "max_train_steps": 40,
            "lr_scheduler": "cosine",
            "adam_beta1": 0.9,
            "adam_beta2": 0.95,
            "adam_weight_decay": 1e-2,
            "max_grad_norm": 1.0,
            "seraena_buffer_mb": 64,
            "max_validation_batches": 2,
            "validation_fraction": 0.2,
            "num_sample_clips": 1,
            "checkpoints_total_limit": 2,
        },
    ),
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name.lower()]
    except KeyError:
        pass
    # the seeds named configs by GPU count and hardware: taehv_config_16gpu_h100.py, 1gpu_h100
    m = re.fullmatch(r"(?:taehv_config_)?(?:(\d+)gpus?_([a-z0-9]+)|([a-z0-9]+)_(\d+)gpus?)(?:\.py)?", name.lower())
    if m and (m.group(2) or m.group(3)) in PROFILES:
        gpus, hw = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
        raise ConfigError(
            f"unknown profile {name!r}: a profile names the hardware only, the GPU count comes first: "
            f"taehv-launch {gpus} {hw}"
        )
    raise ConfigError(f"unknown profile {name!r}: choose one of {', '.join(PROFILES)}")


def nccl_timeout_for(num_nodes: int, gpus: int) -> int:
    """Seconds; longer for more nodes (SPEC.md). Reaches init_process_group through the config."""
    if num_nodes <= 1:
        return 1800 if gpus == 1 else 3600
    if num_nodes <= 5:
        return 7200
    if num_nodes <= 7:
        return 10800
    return 14400


def nccl_buffsize_for(num_nodes: int) -> int:
    """NCCL_BUFFSIZE in bytes: 16 MiB up to 5 nodes, 24 MiB for 6-7, 32 MiB for 8+."""
    mib = 16 if num_nodes <= 5 else 24 if num_nodes <= 7 else 32
    return mib * 1024 * 1024


def check_gpu_count(profile: Profile, gpus: int) -> None:
    """1 to the profile's max_gpus: checked before the topology, which would suggest counts past it."""
    if gpus < 1:
        raise ConfigError(gpu_count_line(str(gpus)))
    if gpus > profile.max_gpus:
        raise ConfigError(
            f"profile {profile.name!r} supports at most {profile.max_gpus} "
            f"{'processes' if profile.device == 'cpu' else 'GPUs'}, got {gpus}"
        )


def gpu_count_line(text: str) -> str:
    """The one line for a GPU count below 1 (0 reaches the plan, -1 the command line: the same words)."""
    return f"GPU count must be at least 1, got {text} (usage: taehv-launch GPUS PROFILE)"


def row_for(profile: Profile, gpus: int, max_micro: int = 0) -> tuple[Row, str]:
    """The row for `gpus` and how it was obtained (a table row, or the derivation rule).

    Rule for counts not in the table: take the nearest table row with fewer GPUs (its
    micro-batch, ZeRO stage, intervals, workers), choose the accumulation that brings the
    global batch closest to 128 (at least 1; ties go to the larger batch), and scale the
    learning rate linearly with the resulting global batch (1e-4 at 128).
    A800 (micro_override) then replaces the micro-batch with 2 and re-derives accumulation
    to keep that row's global batch, scaling the LR if the batch cannot be kept exactly.
    """
    # max_micro (the family record's, 0: none) caps the micro-batch last, the same way (docs/families.md)
    check_gpu_count(profile, gpus)
    exact = [r for r in profile.rows if r.gpus == gpus]
    unit = "process" if profile.device == "cpu" else "GPU"
    if exact:
        plural = "" if gpus == 1 else "es" if unit == "process" else "s"
        row, how = exact[0], f"table row: {profile.table}, {gpus} {unit}{plural}"
    else:
        base = max((r for r in profile.rows if r.gpus < gpus), key=lambda r: r.gpus)
        accum = _closest_accum(BASE_GLOBAL_BATCH, base.micro_batch_size * gpus)
        batch = base.micro_batch_size * gpus * accum
        row = replace(
            base,
            gpus=gpus,
            gradient_accumulation_steps=accum,
            learning_rate=_round_lr(BASE_LEARNING_RATE * batch / BASE_GLOBAL_BATCH),
        )
        how = (
            f"derived from the {base.gpus}-{unit} row of {profile.table} by the rule in docs/profiles.md: "
            f"micro {base.micro_batch_size}, accumulation {accum} for a global batch near {BASE_GLOBAL_BATCH} "
            f"({batch}), LR {row.learning_rate:g} scaled linearly from {BASE_LEARNING_RATE:g} at "
            f"{BASE_GLOBAL_BATCH}"
        )
    if profile.micro_max is not None:
        per_gpu = row.global_batch // gpus
        micro = max(
            (m for m in range(row.micro_batch_size, profile.micro_max + 1) if per_gpu % m == 0),
            default=row.micro_batch_size,
        )
        if micro != row.micro_batch_size:
            accum = row.global_batch // (micro * gpus)
            how += f"; {profile.name}: micro {micro}, accumulation {accum} keeps the global batch {row.global_batch}"
            row = replace(row, micro_batch_size=micro, gradient_accumulation_steps=accum)
    if profile.micro_override is not None and row.micro_batch_size != profile.micro_override:
        row, how = _with_micro(row, gpus, profile.micro_override, how + f"; {profile.name}")
    if max_micro and row.micro_batch_size > max_micro:
        row, how = _with_micro(row, gpus, max_micro, how + f"; the family's max_micro {max_micro}")
    return row, how


def _with_micro(row: Row, gpus: int, micro: int, how: str) -> tuple[Row, str]:
    """The row at `micro`, accumulation re-derived to keep its global batch (the LR scaled where it cannot)."""
    target = row.global_batch
    accum = _closest_accum(target, micro * gpus)
    batch = micro * gpus * accum
    lr = row.learning_rate if batch == target else _round_lr(row.learning_rate * batch / target)
    how += (
        f": micro {micro}, accumulation {accum} "
        + ("keeps" if batch == target else f"gives {batch} instead of")
        + f" the global batch {target}"
        + ("" if batch == target else f", LR scaled to {lr:g}")
    )
    return replace(row, micro_batch_size=micro, gradient_accumulation_steps=accum, learning_rate=lr), how


def _closest_accum(target_global: int, per_step: int) -> int:
    lo = max(1, target_global // per_step)
    candidates = (lo, lo + 1)
    return min(candidates, key=lambda a: (abs(a * per_step - target_global), -a))


def _round_lr(lr: float) -> float:
    return float(f"{lr:.4g}")
