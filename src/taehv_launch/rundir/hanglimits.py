"""<run>/hang_limits.json: the hang limits derived from this run's own times (#39 item 4), and the one
rule every judge of a hang applies (the trainer's detector, the launcher's freeze watch, `status`).

The configured `hang_timeout` (a step) and `hang_timeout_slow` (a slow phase) are upper bounds. Once the
run has measured itself, three limits come from its times (`derive`):

  step        STEP_FACTOR x the 99th percentile (nearest rank) of the first MEASURE_STEPS step times
              after the process's warm-up (its first WARMUP_STEPS steps, judged against
              hang_timeout_slow: compile, DDP's bucket rebuild after the first iteration); a step's time
              leaves out the slow phases run inside it (validation, checkpoint, compile, rollback)
  checkpoint  ONCE_FACTOR x the first checkpoint's time
  validation  ONCE_FACTOR x the first validation's time

each at least FLOOR_S (a step) or ONCE_FLOOR_S (300 s: the first checkpoint and validation are the
smallest of the run) and at most its configured value (hang_timeout for a step, hang_timeout_slow for
the others). The log step's work (its all-reduce, the trackers, progress.json) is the slow phase "log". Why these numbers: MEASURE_STEPS = 20, whose 99th percentile is the slowest step, covers
each DataLoader worker's batch at least once with the profiles' 1-12 workers and takes a minute at 3 s a
step; STEP_FACTOR = 5 leaves room for what 20 steps may not show (a slow file, an epoch's start, a busier
node); ONCE_FACTOR = 10, as a checkpoint and a validation are measured once, a checkpoint's time follows
the shared storage's load, and it grows as the Seraena buffer fills and rotation starts deleting;
FLOOR_S = 30 is six heartbeat periods, twice the silence that makes a rank late, so a heartbeat held
back by a slow filesystem or a pause of a few seconds never fires it (and the value the GPU restart
measurement used, docs/benchmarks.md). Set-up, compile, warm-up, rollback, export and a rank without a
heartbeat yet keep hang_timeout_slow.

Every rank measures its own times (train/durability/progress.py) and carries them on its heartbeat
("times"); the trainer's rank 0 takes the longest of all ranks' once every rank has one (`combine`),
writes this file and prints the limits (`derived_line`). The readers compute the limits from the file's
measured times with the same function and their own configured bounds, so a hand-edited file cannot
set a limit outside them. A launch's rank 0 removes the file when it starts, and readers ignore one of
an earlier launch (`status`: another launch id; a watchdog: older than its own start; the launcher's
freeze watch: another attempt's or launch's ids, run/freeze.py):
a restarted or resumed run is judged by the configured values until it has measured itself again.

Format: {"measured": {"step_s", "steps", "checkpoint_s", "validation_s"} (seconds; null: not measured
yet), "limits": {"step_s", "checkpoint_s", "validation_s"} (for people: readers recompute them),
"configured": {"hang_timeout", "hang_timeout_slow"}, "floor_s", "time", "launch_id" (rundir/launchid.py)}
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from ..files import read_json_or_none, write_atomic
from .launches import ThisLaunch, since_ok
from .launchid import stamped
from .records import LONGEST_S, Field, Number, Record, Whole, count, number

HANG_LIMITS_FILE = "hang_limits.json"
# Phases whose normal duration can exceed hang_timeout: judged against hang_timeout_slow, or for the
# MEASURED ones, once measured, against their own limit (rundir/heartbeat.py re-exports it).
SLOW_PHASES = frozenset({"setup", "checkpoint", "validation", "compile", "rollback", "export", "log"})
MEASURED = ("checkpoint", "validation")  # slow phases with a limit of their own from this run's times
KINDS = ("step", *MEASURED)

MEASURE_STEPS = 20  # step times after warm-up whose 99th percentile makes the step limit
STEP_FACTOR = 5.0
ONCE_FACTOR = 10.0  # checkpoint, validation: one measurement each
FLOOR_S = 30.0  # no step limit from the run's times goes below this (the configured value may)
# A checkpoint or a validation is measured once, and the first is the smallest: the Seraena buffer the
# checkpoint saves grows to seraena_buffer_mb per rank and rotation starts deleting old checkpoints later,
# so their limits from the run's times stay at least hang_timeout's default.
ONCE_FLOOR_S = 300.0


def hang_limits_path(run_dir: Path) -> Path:
    return Path(run_dir) / HANG_LIMITS_FILE


def p99(values: Iterable[float]) -> float | None:
    """The 99th percentile, nearest rank (of fewer than 100 values: the largest); None for none."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)] if ordered else None


def bounded(measured: float, factor: float, configured: float, floor: float = FLOOR_S) -> float:
    """factor x measured, at least `floor`, at most the configured value (which wins over the floor)."""
    return min(configured, max(floor, factor * measured))


@dataclass(frozen=True)
class HangLimits:
    """The configured values and, once known, the run's measured times ({"step_s", "steps",
    "checkpoint_s", "validation_s"}, the longest of all ranks'). 0 hang_timeout: no hang detection."""

    hang_timeout: float
    hang_timeout_slow: float
    measured: Mapping[str, float | None] = field(default_factory=dict)

    @property
    def slow(self) -> float:
        return max(self.hang_timeout_slow, self.hang_timeout)  # never below the step's

    def bound(self, kind: str) -> float:
        return self.hang_timeout if kind == "step" else self.slow

    def limit(self, kind: str) -> tuple[float, bool]:
        """(seconds, whether from this run's times) for "step", "checkpoint" or "validation": from the
        times only when they were measured and give less than the configured bound."""
        got, bound = self.measured.get(f"{kind}_s"), self.bound(kind)
        if got is None or not self.hang_timeout:
            return bound, False
        step = kind == "step"
        value = bounded(got, STEP_FACTOR if step else ONCE_FACTOR, bound, FLOOR_S if step else ONCE_FLOOR_S)
        return value, value < bound

    def for_phase(self, phase: str, warmup: bool) -> tuple[float, str]:
        """(seconds, name) a rank in `phase` may go without progress: name "hang_timeout",
        "hang_timeout_slow", or the kind ("step", "checkpoint", "validation") of a limit from this run's times."""
        if warmup or (phase in SLOW_PHASES and phase not in MEASURED):
            return self.slow, "hang_timeout_slow"
        kind = phase if phase in MEASURED else "step"
        value, derived = self.limit(kind)
        return value, kind if derived else ("hang_timeout" if kind == "step" else "hang_timeout_slow")


def job_limit(ranks: Iterable[tuple[object, object]], unstarted: bool, limits: HangLimits) -> tuple[float, str]:
    """(seconds, name) the job's ranks may go without progress: the longest of the step's limit and the
    limits of the phases its ranks are in, `ranks` being (phase, warmup) of each rank whose last phase still
    runs (leave out a stopped process: its phase no longer runs); hang_timeout_slow while a rank has not
    started its heartbeat (`unstarted`): the others may be waiting for it. A field of another type reads as
    a step's phase."""
    cands = [limits.for_phase("step", False)]
    if unstarted:
        cands.append(limits.for_phase("setup", False))
    for phase, warmup in ranks:
        cands.append(limits.for_phase(phase if isinstance(phase, str) else "?", warmup is True))
    return max(enumerate(cands), key=lambda ic: (ic[1][0], ic[0] > 0))[1]  # a phase's own limit wins a tie


def limit_text(limit: tuple[float, str]) -> str:
    """How a hang line names its limit: "hang_timeout 300 s", "step limit 30 s, from this run's step times"."""
    seconds, name = limit
    if name in KINDS:
        return f"{name} limit {seconds:.0f} s, from this run's {name} times"
    return f"{name} {seconds:.0f} s"


def combine(times: Iterable[object], world: int) -> dict[str, float | None]:
    """The job's measured times from the ranks' heartbeats' "times" ({"step_s", "steps",
    "checkpoint_s", "validation_s"}): for each kind the longest, once all `world` ranks have it
    (a step time once measured over MEASURE_STEPS steps); else None."""
    rows = [t for t in times if isinstance(t, dict)]
    out: dict[str, float | None] = {}
    for kind in KINDS:
        got = [number(t.get(f"{kind}_s"), LONGEST_S) for t in rows]
        if kind == "step":
            got = [g if (count(t.get("steps")) or 0) >= MEASURE_STEPS else None for g, t in zip(got, rows)]
        known = [g for g in got if g is not None]
        out[f"{kind}_s"] = max(known) if world > 0 and len(known) == len(got) >= world else None
    out["steps"] = MEASURE_STEPS if out["step_s"] is not None else None
    return out


TIMES = Number(high=LONGEST_S, what="seconds")
MEASURED_TIMES = Record(
    "measured",
    (*(Field(f"{k}_s", TIMES) for k in KINDS), Field("steps", Whole())),
)


def clean_measured(record: object) -> dict[str, float | None]:
    """A record's "measured" times with every field checked (another type, NaN, negative: None)."""
    return MEASURED_TIMES.parse(record if isinstance(record, dict) else {}).record or {}


def write_hang_limits(run_dir: Path, limits: HangLimits) -> None:
    record = {
        "measured": dict(limits.measured),
        "limits": {f"{k}_s": round(limits.limit(k)[0], 1) for k in KINDS},
        "configured": {"hang_timeout": limits.hang_timeout, "hang_timeout_slow": limits.hang_timeout_slow},
        "floor_s": FLOOR_S,
        "time": round(time.time(), 3),
    }
    write_atomic(hang_limits_path(run_dir), json.dumps(stamped(record)))


def read_hang_limits(run_dir: Path, since: ThisLaunch | float | None, hang_timeout: float, slow: float) -> HangLimits:
    """The limits a judge of this launch applies: the configured values, with the measured times of
    <run>/hang_limits.json when it is this launch's (`since`: ThisLaunch, or the judge's own start by the
    filesystem's clock, or None: any; rundir/launches.since_ok)."""
    path = hang_limits_path(run_dir)
    configured = HangLimits(float(hang_timeout or 0), float(slow or 0))
    if not hang_timeout:
        return configured
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return configured
    record = read_json_or_none(path)
    if record is None or not since_ok(since, record, mtime):
        return configured  # none, or an earlier launch's
    return HangLimits(configured.hang_timeout, configured.hang_timeout_slow, clean_measured(record.get("measured")))


def _kind_text(limits: HangLimits, kind: str) -> str:
    value, _ = limits.limit(kind)
    got = limits.measured.get(f"{kind}_s")
    if got is None:
        return f"{kind} {value:.0f} s (not measured yet)"
    what = f"p99 {got:.2g} s of {MEASURE_STEPS} steps" if kind == "step" else f"{got:.2g} s"
    return f"{kind} {value:.0f} s (measured {what})"


def limits_summary(limits: HangLimits) -> str:
    """ "step 32 s (measured p99 6.4 s of 20 steps), checkpoint 1800 s (not measured yet), validation 1800 s
    (not measured yet); configured bounds hang_timeout 300 s, hang_timeout_slow 1800 s, floors 30 s / 300 s"."""
    kinds = ", ".join(_kind_text(limits, k) for k in KINDS)
    return (
        f"{kinds}; configured bounds hang_timeout {limits.hang_timeout:.0f} s, hang_timeout_slow "
        f"{limits.slow:.0f} s, floors {FLOOR_S:.0f} s / {ONCE_FLOOR_S:.0f} s"
    )


def derived_line(limits: HangLimits, run_dir: Path) -> str:
    """The line the trainer's rank 0 prints each time a limit is derived (at most once per kind)."""
    return f"hang limits from this run's times: {limits_summary(limits)} (kept in {hang_limits_path(run_dir)})"
