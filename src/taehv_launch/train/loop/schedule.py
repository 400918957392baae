"""The learning-rate schedule: a pure function of the optimizer step, so it resumes exactly."""

from __future__ import annotations

import math

from ...plan.schema import Config


def lr_at(step: int, cfg: Config) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warmup, then the schedule."""
    peak, warm, total = cfg.learning_rate, cfg.lr_warmup_steps, cfg.max_train_steps
    if step < warm:
        return peak * (step + 1) / warm
    if cfg.lr_scheduler == "constant":
        return peak
    progress = min(1.0, (step - warm) / max(1, total - warm))
    floor = peak * cfg.min_lr_ratio
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.lr_scheduler == "cosine" else 1 - progress
    return floor + (peak - floor) * shape
