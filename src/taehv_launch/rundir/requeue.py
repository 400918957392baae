"""<run>/requeue.json: how often a scheduler (sbatch, k8s) requeued this run and whether each
requeue made progress. Written by the requeue check the rendered job files run
(`taehv-launch requeue-check`, cluster/requeue.py), read by `taehv-launch status`.

{"count": requeues so far (SLURM: attempts that ended with exit 75 and asked for a requeue;
           Kubernetes: restarts of pod 0), the refused one included,
 "without_progress": those in a row that found no complete checkpoint newer than the one recorded
           at the previous requeue (the first requeue of a run: no complete checkpoint at all),
 "last_checkpoint": the newest complete checkpoint's name at the last requeue (or null),
 "stopped": null, or the one line saying why requeueing stopped,
 "job": the scheduler's job id at the last check (SLURM_JOB_ID; Kubernetes <job>-<uid>)}

The file is the truth, not the scheduler's own count (SLURM_RESTART_COUNT, a pod's restarts): a job
submitted again with --run-name continues the run and its count, which the scheduler restarts at
0, and requeues SLURM makes itself (preemption with PreemptMode=REQUEUE) never pass the check. A
resubmitted job keeps the count: if it too ends without a new checkpoint it stops at once; delete
requeue.json to give it max_requeues_without_progress attempts again.

decide() is pure (the previous record and the newest complete checkpoint in, the verdict out);
after_stop() (SLURM, on exit 75) and at_start() (Kubernetes, pod 0's init container) read the run
directory, decide, write the record and return the one line for the job log.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import one_line
from ..files import read_json_or_none, write_atomic
from .checkpoint import CKPT_RE, newest_complete
from .launchid import stamped
from .records import Field, OrNull, Record, Text, Whole

REQUEUE_FILE = "requeue.json"
KEY = "max_requeues_without_progress"  # the config key that sets the limit


REQUEUES = Record(
    REQUEUE_FILE,
    (
        Field("count", Whole(), required=True, default=0),
        Field("without_progress", Whole(), required=True, default=0),
        Field("last_checkpoint", OrNull(Text())),
        Field("stopped", OrNull(Text())),
        Field("job", OrNull(Text())),
    ),
    strict=True,  # the count decides whether a job goes on: only a record this module wrote counts
)


def read_requeues(run_dir: Path) -> dict | None:
    """The record, for reading only (status): every field checked, one of another type reads as its
    default (counts 0, texts None); None when there is none or it is no JSON object."""
    return REQUEUES.loose().parse(read_json_or_none(Path(run_dir) / REQUEUE_FILE)).record


def load_requeues(run_dir: Path) -> tuple[dict | None, str]:
    """(the record, or None when there is none; '' or one note). A requeue.json that is unreadable or
    no record of ours (empty, not JSON, a folder, a symlink to a device, too large, fields of another
    type) is renamed to requeue.json.corrupt-<n>, kept for a look, and the count starts afresh: the
    note says so. Never raises: a count that cannot be kept must not stop a run."""
    path = Path(run_dir) / REQUEUE_FILE
    rec, why = REQUEUES.read(path)
    if rec is not None or not why:
        return rec, ""
    return None, one_line(
        f"taehv-launch: note: the requeue count is unreadable ({why}); {_keep_aside(path)}; the count starts "
        f"afresh with this check"
    )


def _keep_aside(path: Path) -> str:
    for n in range(1, 1000):
        aside = path.with_name(f"{path.name}.corrupt-{n}")
        if os.path.lexists(aside):
            continue
        try:
            os.rename(path, aside)  # the entry itself: a symlink is moved, not followed
            return f"kept as {aside.name}"
        except OSError as exc:
            return f"it could not be moved aside ({exc.strerror or exc}) and is replaced"
    return "it is replaced (requeue.json.corrupt-1 to -999 exist already)"


def write_requeues(run_dir: Path, record: dict) -> None:
    """Replace requeue.json atomically (a reader sees the old record or the new one); OSError is the caller's."""
    write_atomic(Path(run_dir) / REQUEUE_FILE, json.dumps(stamped(record), indent=1) + "\n")


@dataclass(frozen=True)
class Decision:
    go: bool  # requeue (let the restart run), or stop
    count: int  # this run's requeues, this one included
    without_progress: int  # requeues in a row without a newer complete checkpoint, this one included
    progress: bool  # a complete checkpoint newer than the one recorded at the previous requeue
    newest: str | None  # the newest complete checkpoint now
    previous: str | None  # the one recorded at the previous requeue
    limit: int  # max_requeues_without_progress (0: no limit)

    def record(self, stopped: str | None, job: str | None) -> dict:
        return {
            "count": self.count,
            "without_progress": self.without_progress,
            "last_checkpoint": self.newest,
            "stopped": stopped,
            "job": job,
        }


def step_of(name: str | None) -> int | None:
    m = CKPT_RE.match(name) if isinstance(name, str) else None
    return int(m.group(1)) if m else None


def _count(rec: dict, key: str) -> int:
    value = rec.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def decide(prev: dict | None, newest: str | None, limit: int) -> Decision:
    """The verdict on one more requeue. Progress: a complete checkpoint (`newest`, a checkpoint-<step>
    name) whose step is above the one recorded at the previous requeue; with none recorded, any
    complete checkpoint. `limit` requeues in a row without progress stop it (limit 0: never)."""
    prev = prev or {}
    previous = prev.get("last_checkpoint") if step_of(prev.get("last_checkpoint")) is not None else None
    now, before = step_of(newest), step_of(previous)
    progress = now is not None and (before is None or now > before)
    without = 0 if progress else _count(prev, "without_progress") + 1
    return Decision(
        go=limit <= 0 or without < limit,
        count=_count(prev, "count") + 1,
        without_progress=without,
        progress=progress,
        newest=newest if now is not None else None,
        previous=previous,
        limit=limit,
    )


def _ckpt(name: str | None) -> str:
    return f"{name} (step {step_of(name)})" if name else "none"


def _progress_words(d: Decision, since: str, verb: str) -> str:
    """since: 'last requeue' or 'last start'; verb: 'requeueing' or 'restarting'."""
    if d.progress:
        if d.previous:
            return f"{_ckpt(d.newest)} is newer than {_ckpt(d.previous)}, the newest at the {since}"
        return f"newest checkpoint {_ckpt(d.newest)}"
    what = f"no checkpoint newer than {_ckpt(d.previous)} since the {since}" if d.previous else "no checkpoint yet"
    limit = f"; {verb} stops at {d.limit}: {KEY}" if d.limit > 0 else f"; {KEY}=0: no limit"
    return f"{what} ({d.without_progress} in a row{limit})"


def _stop_words(d: Decision, run_dir: Path, again: str, lead: str, nth: str) -> str:
    """lead: what happened, with {n} and {newer} to fill in; nth: 'requeue' or 'restart'."""
    newer = f"a checkpoint newer than {_ckpt(d.previous)}" if d.previous else "a complete checkpoint"
    found = f"the newest is {_ckpt(d.newest)}" if d.newest else "the run has none"
    return (
        lead.format(n=d.without_progress, newer=newer)
        + f" ({KEY}={d.limit}; {found}; {nth} {d.count} of this run). See in {run_dir / 'launch.log'} what "
        f"each attempt did before it stopped, fix that, then {again} (the count goes on: delete "
        f"{run_dir / REQUEUE_FILE} to reset it)"
    )


def _write(run_dir: Path, record: dict) -> str:
    """'' when the record is written, else a note (the requeue goes ahead: a count that cannot be
    kept must not stop a run)."""
    try:
        write_requeues(run_dir, record)
        return ""
    except OSError as exc:
        return f" (could not record it in {run_dir / REQUEUE_FILE}: {exc.strerror or exc})"


def after_stop(run_dir: Path, limit: int, *, job: str, again: str) -> tuple[bool, str]:
    """SLURM: the job's attempt ended with exit 75. (requeue?, one line for the job log)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():  # exit 75 comes from a run that has a directory: a stand-in, or another path
        return True, one_line(f"taehv-launch: requeueing job {job} (no run directory {run_dir} to count it in)")
    prev, unreadable = load_requeues(run_dir)
    d = decide(prev, _newest(run_dir), limit)
    if d.go:
        note = _write(run_dir, d.record(None, job))
        words = _progress_words(d, "last requeue", "requeueing")
        line = one_line(f"taehv-launch: requeueing job {job} (requeue {d.count} of this run): {words}{note}")
        return True, _lines(unreadable, line)
    line = one_line(
        f"taehv-launch: not requeueing job {job}: "
        + _stop_words(d, run_dir, again, "{n} attempts in a row ended (exit 75) without {newer}", "requeue")
    )
    note = _write(run_dir, d.record(line, job))
    return False, _lines(unreadable, line + one_line(note))


def _lines(note: str, line: str) -> str:
    """The note about an unreadable record (if any) on a line of its own before the check's line."""
    return f"{note}\n{line}" if note else line


def at_start(run_dir: Path, limit: int, *, job: str, again: str) -> tuple[bool, str]:
    """Kubernetes, pod 0 starting (its init container). The first start of the run records the newest
    checkpoint; a start of another Job (--run-name continues a run across Jobs) is a user's resubmit,
    not a restart: recorded, not counted; any other start is a restart and decided like a requeue.
    (start?, one line for the pod's log)."""
    run_dir = Path(run_dir)
    prev, unreadable = load_requeues(run_dir)
    newest = _newest(run_dir)
    if prev is None or prev.get("job") != job:
        record = {
            "count": _count(prev or {}, "count"),
            "without_progress": _count(prev or {}, "without_progress"),
            "last_checkpoint": newest,
            "stopped": None,
            "job": job,
        }
        try:
            # The first start of a run on a fresh volume: pod 0's launcher makes the same folders a
            # moment later (output_dir is the Job's own, from the same render): made here to count.
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass  # _write says why
        note = _write(run_dir, record)
        what = (
            f"a new Job ({job}) continues this run: not a restart"
            if prev is not None
            else "start of this run, counted afresh"
            if unreadable
            else "first start of this run"
        )
        return True, _lines(
            unreadable,
            one_line(
                f"taehv-launch: {what}; newest checkpoint: {_ckpt(newest)}; restarts of pod 0 are counted in "
                f"{run_dir / REQUEUE_FILE} ({record['count']} so far, {record['without_progress']} in a row "
                f"without a new checkpoint; {KEY}={limit}){note}"
            ),
        )
    d = decide(prev, newest, limit)
    if d.go:
        note = _write(run_dir, d.record(None, job))
        words = _progress_words(d, "last start", "restarting")
        return True, _lines(unreadable, one_line(f"taehv-launch: restart {d.count} of this run (pod 0): {words}{note}"))
    line = one_line(
        "taehv-launch: not restarting: the Job fails here (podFailurePolicy FailJob): "
        + _stop_words(
            d, run_dir, again, "pod 0 restarted {n} times in a row without {newer} saved in between", "restart"
        )
    )
    note = _write(run_dir, d.record(line, job))
    return False, _lines(unreadable, line + one_line(note))


def _newest(run_dir: Path) -> str | None:
    found, _skipped = newest_complete(run_dir)  # sizes only: no checkpoint is read
    return found.name if found is not None else None
