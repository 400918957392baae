"""Exponential moving average of TAEHV's weights: the model we validate and export.

Every rank keeps a full fp32 copy (TAEHV is ~11M parameters, ~45 MB). Under ZeRO-3 the
live parameters are partitioned, so each update gathers them on all ranks first.
"""

from __future__ import annotations

import contextlib
import copy

import torch
import torch.nn as nn


def gathered(params: list[nn.Parameter], zero_stage: int, modifier_rank: int | None = None):
    """Context in which ZeRO-3 partitioned parameters hold their full values (on every rank).

    With a modifier_rank, that rank's changes are broadcast and re-partitioned on exit."""
    if zero_stage == 3:
        import deepspeed

        return deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank)
    return contextlib.nullcontext()


class EMA:
    def __init__(self, model: nn.Module, decay: float, zero_stage: int):
        self.decay, self.zero_stage = decay, zero_stage
        params = list(model.parameters())
        with gathered(params, zero_stage):
            self.model = copy.deepcopy(model).float().eval()
        self.model.requires_grad_(False)

    def effective_decay(self, step: int) -> float:
        """Ramp the decay up early on, so the EMA is not stuck on the random initial weights."""
        return min(self.decay, (1 + step) / (10 + step))

    @torch.no_grad()
    def update(self, model: nn.Module, step: int) -> None:
        d = self.effective_decay(step)
        live = list(model.parameters())
        with gathered(live, self.zero_stage):
            for ema_p, p in zip(self.model.parameters(), live):
                if p.requires_grad:  # a frozen part (plan/trainable.py) keeps its exact fp32 start
                    ema_p.lerp_(p.detach().float(), 1.0 - d)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().contiguous() for k, v in self.model.state_dict().items()}

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(sd)
