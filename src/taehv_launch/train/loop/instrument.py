"""What watches a training step, kept out of the step's maths (trainer.py's train_step and fit).

The watchers: the hang watchdog (the phase in durability/progress.py's PROGRESS, on the heartbeat),
--profile (timing.py's PhaseTimer: a row of the table, a torch.profiler range of the same name, the
TAEHV_MEMORY_LOG lines; and the torch.profiler trace), speed.json's steady window (timing.py's
SpeedLog) and the stragglers' clock (stragglers.py's StepClock: this rank's data wait and forward).
`Marks` tells them all; `@timed(row)` runs a Trainer method that is one part of the step under its row.
One micro-batch, in order:

    phase "data"      row "data (loader wait)"            Marks.fetch: the next batch
    phase "forward"   row "data (to device)"              the forward clock starts; Trainer.to_device
                      row "reference VAE encode"          Trainer.reference_latents
    phase "forward"   row "TAEHV forward"                 inside accelerate's accumulate; Trainer.taehv_forward
                      row "Seraena (disc + correction)"   Trainer.seraena_targets
    phase "backward"  row "backward + optimizer"          backward, gradient clipping, optimizer step

Users and tests read these names (the hang report, the --profile table, speed.json's "phases", the
profiler trace): renaming one changes what the run reports.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from ...plan.schema import Config
from ..durability.progress import PROGRESS
from .stragglers import StepClock
from .timing import PhaseTimer, SpeedLog, profiler

Method = TypeVar("Method", bound=Callable)


class Marks:
    """The watchdog's phases, --profile's rows and trace, speed.json's window and the stragglers' clock of
    the training loop's steps (module docstring)."""

    def __init__(self, timer: PhaseTimer, clock: StepClock, speed: SpeedLog):
        self.timer, self.clock, self.speed = timer, clock, speed
        self.trace = None  # the torch.profiler of --profile, while the loop runs
        self.first = 0  # the step the loop started from

    def fetch(self, batches: Iterator[dict[str, Any]]) -> dict[str, Any]:
        """The next micro-batch: the watchdog's phase "data", --profile's loader-wait row, the clock's data wait."""
        with PROGRESS.phase("data"), self.timer("data (loader wait)"):
            return self.clock.fetch(batches)

    @contextlib.contextmanager
    def forward(self):
        """A micro-batch's forward starts: the watchdog's phase "forward", and the stragglers' forward clock."""
        with PROGRESS.phase("forward"):
            self.clock.forward()
            yield

    @contextlib.contextmanager
    def phase(self, name: str, row: str | None = None):
        """The watchdog's phase `name` and, given `row`, --profile's row inside it."""
        with PROGRESS.phase(name), self.timer(row) if row is not None else contextlib.nullcontext():
            yield

    def row(self, name: str):
        """--profile's row `name`: its wall time and torch.profiler range (nothing timed without --profile)."""
        return self.timer(name)

    @contextlib.contextmanager
    def loop(self, run_dir: Path, cfg: Config, step: int):
        """The training loop from `step`, traced by torch.profiler with --profile (timing.py's profiler)."""
        self.first = step
        if not self.timer.enabled:
            yield
            return
        with profiler(run_dir, cfg, self.timer.device) as self.trace:
            yield
        self.trace = None

    def stepped(self, step: int, last: int) -> None:
        """Optimizer step `step` is done: the profiler's schedule, speed.json's window, the table's window."""
        if self.trace is not None:
            self.trace.step()
        self.speed.step(step)
        self.timer.at_step(step, self.speed.begin_step, last)

    def restart(self, step: int) -> None:
        """Training starts again at `step` (a rollback): the watchdog's step, the clock, speed.json's window."""
        self.clock.reset()
        self.speed.restart(step)
        PROGRESS.set_step(step)

    def table(self, last: int, log: Callable[[str], None]) -> str | None:
        """--profile's table of where the steps' time went, up to step `last` (also said in the log); None
        without --profile."""
        if not self.timer.enabled:
            return None
        table = self.timer.table(last - self.first)
        log(table)
        return table


def timed(row: str) -> Callable[[Method], Method]:
    """A Trainer method that is one part of the step, run under --profile's row `row` (the Trainer's `marks`)."""

    def wrap(method: Method) -> Method:
        @functools.wraps(method)
        def run(self, *args, **kwargs):
            with self.marks.row(row):
                return method(self, *args, **kwargs)

        return run  # type: ignore[return-value]

    return wrap
