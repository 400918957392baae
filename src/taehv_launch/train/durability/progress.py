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

It also measures this rank's times, for the hang limits derived from them (rundir/hanglimits.py): each
step's, from one set_step to the next, after the warm-up and without the slow phases run inside it,
for MEASURE_STEPS steps; and the first checkpoint's and validation's (their `phase` blocks). The
heartbeat carries them ("times"). With `watch_compiles`, a torch.compile run mid-step (a recompile)
is a "compile" phase: judged against hang_timeout_slow and left out of the step's time.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Callable

# Phases whose normal duration can exceed hang_timeout: they are judged against hang_timeout_slow, or
# their own limit once measured (defined with the hang limits' file, where the launcher and
# `taehv-launch status` read them too).
from ...rundir.hanglimits import MEASURE_STEPS, MEASURED, p99
from ...rundir.hanglimits import SLOW_PHASES as SLOW_PHASES

# The first steps of a process are judged against hang_timeout_slow too, and their times are not
# measured: torch.compile builds its kernels in the first forward and backward, DDP rebuilds its gradient
# buckets after the first iteration, the DataLoader workers start, the first validation runs.
WARMUP_STEPS = 3


class Progress:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock  # seconds, monotonic
        self.step = 0
        self.phase_name = "setup"
        self.collectives = 0
        self.steps_seen = 0  # set_step calls with a new step: warm-up until WARMUP_STEPS
        self.since = self.clock()  # when the step, the phase or the collective count last changed
        self.step_times: list[float] = []  # seconds of each measured step (MEASURE_STEPS at most)
        self.phase_times: dict[str, float] = {}  # the first checkpoint's and validation's seconds
        self._step_at: float | None = None  # when set_step last ran
        self._slow_s = 0.0  # seconds spent in slow phases since then
        self._compiling: tuple[str, float] | None = None  # (the phase before, when) while torch.compile runs
        self._watching = False

    def set_step(self, step: int) -> None:
        now = self.clock()
        if step == self.step + 1 and self._step_at is not None and not self.warmup:
            if len(self.step_times) < MEASURE_STEPS:
                self.step_times.append(max(0.0, now - self._step_at - self._slow_s))
        if step != self.step:
            self.steps_seen += 1
        self._step_at, self._slow_s = now, 0.0
        self.step, self.since = step, now

    def set_phase(self, name: str) -> None:
        self.phase_name, self.since = name, self.clock()

    def count_collective(self) -> None:
        """Call right before issuing a collective that every rank issues (progress, and its number)."""
        self.collectives, self.since = self.collectives + 1, self.clock()

    @contextlib.contextmanager
    def phase(self, name: str):
        """Inside: `name`; after: back to the phase that was current before."""
        before, start = self.phase_name, self.clock()
        self.set_phase(name)
        try:
            yield
        finally:
            self.set_phase(before)
            self._ended(name, before, self.clock() - start)

    def _ended(self, name: str, before: str, took: float) -> None:
        """A phase block ended after `took` seconds: a slow one (not inside another) is no step time; the
        first checkpoint and validation are measured."""
        if name in SLOW_PHASES and before not in SLOW_PHASES:
            self._slow_s += took
            if name in MEASURED and name not in self.phase_times:
                self.phase_times[name] = took

    def compile_started(self, *_args: object) -> None:
        """torch.compile's start callback (dynamo may also call it for a backward compiled lazily)."""
        if self._compiling is None:
            self._compiling = (self.phase_name, self.clock())
            self.set_phase("compile")

    def compile_ended(self, *_args: object) -> None:
        if self._compiling is not None:
            before, start = self._compiling
            self._compiling = None
            self.set_phase(before)
            self._ended("compile", before, self.clock() - start)

    def watch_compiles(self) -> bool:
        """Make each torch.compile a "compile" phase (torch's dynamo callbacks), when the process uses
        torch.compile already (torch._dynamo imported: importing it only for this costs seconds). Once."""
        dynamo = sys.modules.get("torch._dynamo")
        if self._watching or dynamo is None:
            return self._watching
        from ...compat import on_compile

        if not on_compile(self.compile_started, self.compile_ended):  # an older torch: compiles are step time
            return False
        self._watching = True
        return True

    def times(self) -> dict:
        """What this rank measured ({"step_s" (the 99th percentile), "steps", "checkpoint_s",
        "validation_s"}; None: not yet), for the heartbeat."""
        out = {"step_s": p99(self.step_times), "steps": len(self.step_times)}
        return out | {f"{k}_s": self.phase_times.get(k) for k in MEASURED}

    def age_s(self) -> float:
        return self.clock() - self.since

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
            "times": self.times(),
        }


PROGRESS = Progress()
