"""What this rank is doing now, for the hang detector: the last finished step and the current phase.

Setting a phase or a step is two attribute writes (no I/O, no device sync); the watchdog's thread
reads them every few seconds and writes them on the heartbeat (rundir/heartbeat.py).

    from ..durability.progress import PROGRESS
    with PROGRESS.phase("checkpoint"):
        save(...)
    PROGRESS.set_step(step)
    with PROGRESS.phase("collective"):
        PROGRESS.count_collective()   # right before issuing it
        dist.all_reduce(...)

`count_collective` numbers the collectives this rank has issued: every rank issues the same ones in
the same order, so when the ranks are stuck, one with a lower count has not reached the collective
the others wait in (train/durability/hang.py names it).
"""

from __future__ import annotations

import contextlib
import time

# Phases whose normal duration can exceed hang_timeout: they are judged against hang_timeout_slow (defined
# with the heartbeat format, where the launcher and `taehv-launch status` read them too).
from ...rundir.heartbeat import SLOW_PHASES as SLOW_PHASES

# The first steps of a process are judged against hang_timeout_slow too: torch.compile builds its
# kernels in the first forward and backward, the DataLoader workers start, the first validation runs.
WARMUP_STEPS = 3


class Progress:
    def __init__(self) -> None:
        self.step = 0
        self.phase_name = "setup"
        self.collectives = 0
        self.steps_seen = 0  # set_step calls with a new step: warm-up until WARMUP_STEPS
        self.since = time.monotonic()  # when the step, the phase or the collective count last changed

    def set_step(self, step: int) -> None:
        if step != self.step:
            self.steps_seen += 1
        self.step, self.since = step, time.monotonic()

    def set_phase(self, name: str) -> None:
        self.phase_name, self.since = name, time.monotonic()

    def count_collective(self) -> None:
        """Call right before issuing a collective that every rank issues (progress, and its number)."""
        self.collectives, self.since = self.collectives + 1, time.monotonic()

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

    @property
    def warmup(self) -> bool:
        return self.steps_seen < WARMUP_STEPS

    def snapshot(self) -> dict:
        """What the heartbeat carries (rundir/heartbeat.py)."""
        return {
            "step": self.step,
            "phase": self.phase_name,
            "progress_age_s": round(self.age_s(), 3),
            "collectives": self.collectives,
            "warmup": self.warmup,
        }


PROGRESS = Progress()
