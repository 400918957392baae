"""Measuring a piece of GPU/CPU work for the benchmarks: peak memory, FLOPs, time per step."""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from .step import _peak_reset, _sync


class Meter:
    """Peak memory (allocator and device-wide) and FLOPs of a piece of work."""

    def __init__(self, device: torch.device):
        self.device = device

    def reset(self) -> None:
        _peak_reset(self.device)

    def peaks(self) -> dict[str, float | None]:
        if self.device.type != "cuda":
            return {"peak_allocated_gib": None, "used_gib": None}
        free, total = torch.cuda.mem_get_info(self.device)
        return {
            "peak_allocated_gib": torch.cuda.max_memory_allocated(self.device) / 2**30,
            "used_gib": (total - free) / 2**30,
        }


def count_flops(fn: Callable[[], Any]) -> int:
    """Model FLOPs (convolutions, matmuls; forward and backward) of one call, counted by torch."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def time_steps(step: Callable[[], Any], device: torch.device, steps: int, warmup: int = 2) -> float:
    """Mean seconds per call after `warmup` untimed calls."""
    for _ in range(warmup):
        step()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    return (time.perf_counter() - t0) / steps


# ----------------------------------------------------------------------------- shared pieces
