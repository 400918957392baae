"""Every training-config key, its default, its type and what it is for.

One table, read by the launcher (to type-check `--set` and config files and to render
`config.py`) and by the trainer (to read the rendered file back). Key names follow the
seed configs (`args.learning_rate = 1e-4` ...), so seed-style files load unchanged; the seeds'
names for a concept that has another name here are accepted as ALIASES.
Profiles (profiles.py) override a subset of these per hardware and GPU count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, make_dataclass
from typing import Any, Collection

from .families import CHOICES as FAMILY_NAMES


@dataclass(frozen=True)
class Key:
    default: Any
    type: type
    help: str
    choices: Collection = ()  # a live collection (families.CHOICES) is fine: `in` and iteration


# (name -> Key). Types: int, float, bool, str, tuple. An int is accepted where a float
# is expected; nothing else is coerced.
KEYS: dict[str, Key] = {
    # --- data -------------------------------------------------------------------------
    "data_root": Key("", str, "folder of videos; empty on the cpu profile = built-in synthetic demo set"),
    "annotation_file": Key(
        "",
        str,
        'optional list of the videos instead of a scan: .json ({"list": [{"path": ...}]}), .jsonl, .csv or '
        ".txt (one path per line), as `taehv-launch index` writes; paths relative to data_root",
    ),
    "height": Key(480, int, "training crop height (pixels, multiple of 8)"),
    "width": Key(720, int, "training crop width (pixels, multiple of 8)"),
    "n_frames": Key(
        12,
        int,
        "frames per clip; the default and the valid values follow ref_vae_type (12, 24, ... for the 4x "
        "families; 16, 40, ... for ltx2/ltx23; 39, 90, ... for h3: docs/families.md)",
    ),
    "min_frame_delta": Key(1, int, "smallest frame stride when sampling a clip"),
    "max_frame_delta": Key(2, int, "largest frame stride when sampling a clip"),
    "random_flip": Key(True, bool, "random horizontal flip"),
    "validation_fraction": Key(0.05, float, "share of videos held out for validation"),
    "max_validation_videos": Key(64, int, "cap on held-out videos"),
    "validation_batch_size": Key(1, int, "clips per rank per validation batch"),
    "dataloader_num_workers": Key(4, int, "DataLoader worker processes per rank"),
    "prefetch_factor": Key(2, int, "batches prefetched per worker"),
    "video_decoder": Key(
        "auto",
        str,
        "where training clips are decoded: nvdec (the GPU's hardware decoder, in the "
        "training process; needs the [nvdec] extra), opencv (CPU, in the DataLoader "
        "workers), auto (nvdec on GPUs when installed, else opencv)",
        ("auto", "nvdec", "opencv"),
    ),
    "video_decode_threads": Key(
        0,
        int,
        "with nvdec: decoding threads per rank, each with its own NVDEC session and CUDA stream; 0 = chosen "
        "from the sources' size and keyframe interval and the GPU (docs/guide.md)",
    ),
    "index_cache_dir": Key("", str, "where the dataset index is cached (default: <output_dir>/.index)"),
    # --- reference VAE ----------------------------------------------------------------
    "use_ref_vae": Key(
        True,
        bool,
        "distil from a reference VAE (False: the decoder trains on TAEHV's own encodings, with "
        "encoder_loss_weight=0; the encoder, which then has no target, is frozen)",
    ),
    "ref_vae_type": Key(
        "cogvideox",
        str,
        "reference VAE family (docs/families.md); upstream's file stems (taecvx, taehv, taew2_1, taew2_2, "
        "taehv1_5, taeltx_2, taeltx2_3, taeh3) are accepted too and stored as the family's name",
        FAMILY_NAMES,
    ),
    "ref_vae_path": Key(
        "", str, "local diffusers folder (with or without a vae/ subfolder); empty on cpu = built-in tiny VAE"
    ),
    "ref_vae_dtype": Key("bfloat16", str, "dtype of the frozen reference VAE", ("float32", "bfloat16", "float16")),
    "allow_family_change": Key(
        False,
        bool,
        "let a resume distil from another reference VAE family than its "
        "checkpoint's (refused otherwise); the change is noted in the run",
    ),
    "ref_vae_chunk_size": Key(1, int, "samples per reference encode call (memory/speed trade-off)"),
    "ref_latent_mean": Key((), tuple, "optional per-channel mean subtracted from reference latents"),
    "ref_latent_std": Key((), tuple, "optional per-channel std dividing reference latents"),
    # --- latent cache (taehv-launch cache) ----------------------------------------------
    "latent_cache": Key(
        "",
        str,
        "folder of a latent cache: `taehv-launch cache` writes it, training reads its views' "
        "reference latents instead of running the reference VAE",
    ),
    "latent_cache_encode": Key(
        "never",
        str,
        "with latent_cache, what the reference VAE encodes online: never (it is "
        "not loaded; unusable views are skipped), missing (views whose stored "
        "latents fail their check, and fresh clips of videos without cached "
        "views), always (every view: checks a cache)",
        ("never", "missing", "always"),
    ),
    "latent_cache_dtype": Key(
        "bfloat16", str, "dtype of the latents `taehv-launch cache` stores", ("bfloat16", "float16", "float32")
    ),
    "cache_views": Key(4, int, "views per video that `taehv-launch cache` encodes (a view: fixed frames, crop, flip)"),
    "cache_shard_size": Key(64, int, "clips per cache shard file (a shard is written whole, or not at all)"),
    # --- model ------------------------------------------------------------------------
    "pretrained_model_path": Key("", str, "TAEHV weights to start from (.pth or .safetensors); empty = from scratch"),
    "patch_size": Key(1, int, "TAEHV pixel-shuffle patch size"),
    "latent_channels": Key(16, int, "TAEHV latent channels; must equal the reference VAE's"),
    "encoder_time_downscale": Key((True, True, False), tuple, "temporal downscale per encoder stage"),
    "decoder_time_upscale": Key((False, True, True), tuple, "temporal upscale per decoder stage"),
    "decoder_space_upscale": Key((True, True, True), tuple, "spatial upscale per decoder stage"),
    "gradient_checkpointing": Key(False, bool, "recompute TAEHV blocks in backward (first memory lever)"),
    "decoder_arch": Key(
        "base",
        str,
        "TAEHV decoder: base (upstream's) or super (upstream's Super decoder: widths 512/256/128/64, ~2x "
        "the decoder's parameters, e.g. taehv1_5_super); exports are named <upstream name>[_super]",
        ("base", "super"),
    ),
    # --- losses -----------------------------------------------------------------------
    "reconstruction_loss_weight": Key(
        1.0, float, "weight of reconstruction_loss(decoded reference latents, frames) (0 = off)"
    ),
    "reconstruction_loss": Key(
        "mse", str, "the reconstruction loss: mse (mean squared error) or l1 (mean absolute error)", ("mse", "l1")
    ),
    "encoder_loss_weight": Key(
        1.0, float, "weight of MSE(encoder(frames), reference latents) (0 = the encoder is frozen)"
    ),
    "seraena_loss_weight": Key(0.3, float, "weight of MSE(decoded, Seraena-corrected target) (0 = off)"),
    "freeze_encoder": Key(
        False,
        bool,
        "train the decoder only: the encoder keeps its starting weights (pretrained_model_path, or the seeded "
        "init) bit for bit; it is left out of the optimizer and of DDP, and not run when use_ref_vae",
    ),
    "use_seraena": Key(True, bool, "adversarial corrections for the decoder"),
    "n_seraena_frames": Key(3, int, "frames grouped into one discriminator image"),
    "seraena_lr": Key(3e-4, float, "discriminator AdamW learning rate"),
    "seraena_buffer_mb": Key(1024, int, "replay buffer bound, MiB per rank"),
    "seraena_checkpoint_buffer_mb": Key(256, int, "save the replay buffer in checkpoints when it is at most this size"),
    "seraena_crop": Key(
        0,
        int,
        "Seraena trains and corrects on one random square crop of this many pixels per "
        "micro-batch (0 = the whole frame; else a multiple of 8 x patch_size, at most the clips' larger side)",
    ),
    # --- optimisation -----------------------------------------------------------------
    "micro_batch_size": Key(
        8,
        int,
        "clips per GPU per forward pass (DeepSpeed's train_micro_batch_size_per_gpu; the seeds' train_batch_size)",
    ),
    "gradient_accumulation_steps": Key(1, int, "micro-batches per optimizer step"),
    "learning_rate": Key(1e-4, float, "peak AdamW learning rate"),
    "lr_scheduler": Key("cosine", str, "schedule after warmup", ("cosine", "constant", "linear")),
    "lr_warmup_steps": Key(2000, int, "linear warmup, in optimizer steps"),
    "min_lr_ratio": Key(0.0, float, "final LR as a fraction of the peak"),
    "max_train_steps": Key(100_000, int, "optimizer steps"),
    "adam_beta1": Key(0.9, float, "AdamW beta1"),
    "adam_beta2": Key(0.95, float, "AdamW beta2"),
    "adam_weight_decay": Key(1e-2, float, "AdamW weight decay"),
    "max_grad_norm": Key(1.0, float, "gradient clipping (DeepSpeed gradient_clipping)"),
    "ema_decay": Key(0.999, float, "EMA of TAEHV weights (the exported model)"),
    "mixed_precision": Key("bf16", str, "autocast dtype", ("bf16", "fp16", "no")),
    "zero_stage": Key(2, int, "DeepSpeed ZeRO stage (0 = plain DDP)", (0, 1, 2, 3)),
    "bucket_size_mb": Key(0, int, "DeepSpeed reduce/allgather bucket in MB (0 = the profile row's: 500-1000 MB)"),
    "seed": Key(42, int, "global seed (each rank offsets it)"),
    "max_consecutive_bad_steps": Key(
        20,
        int,
        "bad micro-batches (non-finite, or a loss spike) skipped in a row before the run rolls back to its "
        "last complete checkpoint (or stops, when there is none)",
    ),
    # --- surviving a long run (docs/troubleshooting.md) ---------------------------------
    "loss_spike_factor": Key(
        10.0, float, "a micro-batch whose loss is above this many times the running median is skipped (0 = off)"
    ),
    "loss_spike_window": Key(200, int, "micro-batches in the loss's running median (the spike check starts once full)"),
    "rollback_lr_factor": Key(
        0.5, float, "after a rollback the learning rate is multiplied by this for rollback_lr_steps (1.0 = unchanged)"
    ),
    "rollback_lr_steps": Key(1000, int, "optimizer steps the lowered learning rate lasts after a rollback"),
    "rollback_window": Key(
        2000, int, "a second rollback within this many optimizer steps of the previous one stops the run"
    ),
    "hang_timeout": Key(
        300,
        int,
        "seconds a rank may make no progress (step or phase) before the job is stopped as hung, every rank "
        "dumping its stacks into <run>/heartbeat/stacks (0 = off; the NCCL timeout stays the backstop; at least "
        "10 s, twice the heartbeat period)",
    ),
    "hang_timeout_slow": Key(
        1800, int, "the same limit during phases known to be long: set-up, compile warm-up, checkpoint, validation"
    ),
    "straggler_threshold": Key(
        0.2,
        float,
        "a rank whose step time is this fraction above the other ranks' median is named at each log line (0 = no line)",
    ),
    "max_requeues_without_progress": Key(
        3,
        int,
        "sbatch/k8s: the job stops requeueing when this many attempts in a row ended with no newer complete "
        "checkpoint (0 = no limit)",
    ),
    "max_restarts": Key(
        3,
        int,
        "after a rank failure or a hang, the launcher restarts the ranks in place from the newest complete "
        "checkpoint up to this many times per launch (0 = off: the job ends, the scheduler requeues)",
    ),
    "max_restarts_without_progress": Key(
        2,
        int,
        "restarts in a row that get past no checkpoint newer than the one they started from before the job "
        "ends (0 = no limit)",
    ),
    # --- speed (docs/benchmarks.md measures each) --------------------------------------
    "compile": Key(
        "none",
        str,
        "torch.compile on GPU: the reference VAE encoder, or it and TAEHV (1-2 min warm-up, cached)",
        ("none", "reference", "all"),
    ),
    "compile_mode": Key(
        "default",
        str,
        "torch.compile's mode for TAEHV (with compile='all'): default; max-autotune-no-cudagraphs (Triton "
        "autotuning, minutes more warm-up); reduce-overhead and max-autotune add CUDA graphs (docs/guide.md). "
        "The reference encoder keeps the default",
        ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
    ),
    "step_stream_priority": Key(
        "high",
        str,
        "CUDA stream of the training step when NVDEC cuts the clips: high runs it on the highest-priority "
        "stream, so the decode threads' colour conversion and resize take only the SMs it leaves (+8% at "
        "long-GOP 1080p from the cache on one H100, docs/benchmarks.md); default keeps the default stream "
        "(as do runs decoding on the CPU and ZeRO-3 with fp16)",
        ("high", "default"),
    ),
    "compile_cache_dir": Key("", str, "Inductor cache kept across restarts (default: <output_dir>/.compile-cache)"),
    "fused_optimizer": Key(True, bool, "AdamW's fused CUDA kernel (ignored on CPU)"),
    "channels_last": Key(
        True,
        bool,
        "compiled TAEHV runs its frames channels-last (NHWC): no cuDNN layout "
        "transposes (only with compile='all' on GPU)",
    ),
    "compile_layout": Key(
        "force",
        str,
        "compiled TAEHV's activation layout between kernels: force keeps channels-last through the whole "
        "graph (Inductor's layout optimisation forced: no cuDNN layout transposes around each convolution); "
        "auto leaves it to Inductor, whose heuristic declines it for TAEHV's 128->64-channel convolutions",
        ("auto", "force"),
    ),
    "ref_channels_last": Key(
        True,
        bool,
        "the compiled reference encoder keeps its activations channels-last "
        "(NDHWC, 8-18% faster encode measured for all three families; "
        "only with compile on GPU)",
    ),
    # --- logging, validation, checkpoints ---------------------------------------------
    "output_dir": Key("output", str, "parent of run directories"),
    "trackers": Key(
        "tensorboard",
        str,
        "where scalars and validation clips go, comma-separated: tensorboard, wandb, mlflow, swanlab "
        "(all but tensorboard need their extra: pip install 'taehv-launch[wandb]')",
    ),
    "log_every": Key(50, int, "steps between log lines / scalars"),
    "validation_steps": Key(1000, int, "steps between validations"),
    "validation_at_start": Key(
        False, bool, "also validate before the first step of a fresh run: the untrained baseline in val/psnr"
    ),
    "max_validation_batches": Key(8, int, "batches per validation pass"),
    "checkpointing_steps": Key(2000, int, "steps between checkpoints"),
    "checkpoints_total_limit": Key(3, int, "checkpoints kept (newest complete and best are never deleted)"),
    "num_sample_clips": Key(2, int, "reconstructed clips written to TensorBoard at validation"),
    "nccl_timeout": Key(1800, int, "process-group timeout in seconds (reaches init_process_group)"),
    "profile_steps": Key(5, int, "steps traced by --profile"),
}

DEFAULTS: dict[str, Any] = {name: key.default for name, key in KEYS.items()}

# The seeds' name -> ours. `train_batch_size` meant the micro-batch in the seed configs, beside
# DeepSpeed's key of the same name that means the global batch: here it is micro_batch_size.
ALIASES: dict[str, str] = {"train_batch_size": "micro_batch_size"}


# The trainer's config: one typed, frozen attribute per key above (`cfg.n_frames`), generated from
# KEYS so that a key is declared once. The launcher's Plan holds the same values as a dict.
Config = make_dataclass(
    "Config", [(name, key.type, field(default=key.default)) for name, key in KEYS.items()], frozen=True
)


def make_config(values: Mapping[str, Any]) -> Any:
    """A Config from a mapping of keys (missing keys take their defaults); unknown keys are a bug here:
    config files are checked by configfile.py before they reach this point."""
    unknown = sorted(set(values) - set(KEYS))
    assert not unknown, f"not config keys: {unknown}"
    return Config(**{k: tuple(v) if KEYS[k].type is tuple else v for k, v in values.items()})


def config_dict(cfg: Any) -> dict[str, Any]:
    """A Config (or a mapping) as a plain JSON-able dict (tuples as lists)."""
    items = cfg.items() if isinstance(cfg, Mapping) else asdict(cfg).items()
    return {k: list(v) if isinstance(v, tuple) else v for k, v in items}


def global_batch(cfg: Any, world_size: int) -> int:
    """Clips per optimizer step: micro-batch x processes x accumulation (the one formula).
    `cfg`: a Config or the Plan's dict."""
    if isinstance(cfg, Mapping):  # a checkpoint's config from before the rename says train_batch_size
        micro = cfg["micro_batch_size"] if "micro_batch_size" in cfg else cfg["train_batch_size"]
        return int(micro) * int(world_size) * int(cfg["gradient_accumulation_steps"])
    return int(cfg.micro_batch_size) * int(world_size) * int(cfg.gradient_accumulation_steps)
