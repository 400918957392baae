"""What this rank is doing now, for the hang detector: the last finished step and the current phase.

Setting a phase or a step is two attribute writes (no I/O, no device sync); the watchdog's thread
reads them every few seconds and writes them on the heartbeat (rundir/heartbeat.py).

    from ..durability.progress import PROGRESS
    with PROGRESS.phase("checkpoint"):
        save(...)
    PROGRESS.set_step(step)
"""

from __future__ import annotations

import contextlib
import time

# Phases whose normal duration can exceed hang_timeout: they are judged against hang_timeout_slow.
SLOW_PHASES = frozenset({"setup", "checkpoint", "validation", "compile", "rollback", "export"})


class Progress:
    def __init__(self) -> None:
        self.step = 0
        self.phase_name = "setup"
        self.since = time.monotonic()  # when the step or the phase last changed

    def set_step(self, step: int) -> None:
        self.step, self.since = step, time.monotonic()

    def set_phase(self, name: str) -> None:
        self.phase_name, self.since = name, time.monotonic()

    @contextlib.contextmanager
    def phase(self, name: str):
        """Inside: `name`; after: back to the phase that was current before."""
        before = self.phase_name
        self.set_phase(name)
        try:
            yield
        finally:
            self.set_phase(before)

    def age_s(self) -> float:
        return time.monotonic() - self.since


PROGRESS = Progress()
