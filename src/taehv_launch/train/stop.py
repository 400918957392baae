"""Preemption: a signal becomes a flag; all ranks agree on it at the same optimizer step.

First SIGTERM/SIGINT/SIGUSR1 (SLURM's `--signal=USR1@120` pre-timeout warning): set the flag;
the loop all-reduces it at each optimizer step, so every rank stops after the same step,
saves a checkpoint and exits with EXIT_RESUMABLE. A second signal exits at once.
"""

from __future__ import annotations

import os
import signal
import sys

import torch
import torch.distributed as dist

from ..errors import EXIT_ABORTED


class StopFlag:
    def __init__(self) -> None:
        self.signals: list[int] = []
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(s, self._handle)

    def _handle(self, signum, _frame) -> None:
        self.signals.append(signum)
        if len(self.signals) > 1:
            sys.stderr.write(f"[rank {os.environ.get('RANK', '0')}] second signal: exiting without a checkpoint\n")
            sys.stderr.flush()
            os._exit(EXIT_ABORTED)

    @property
    def local(self) -> bool:
        return bool(self.signals)

    def agreed(self, device: torch.device) -> bool:
        """Collective: True on every rank when any rank was signalled."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return self.local
        flag = torch.tensor([1.0 if self.local else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
