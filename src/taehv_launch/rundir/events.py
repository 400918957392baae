"""<run>/events.jsonl: the run's divergence events, one JSON object per line, oldest first.

The trainer's rank 0 appends (train/loop/guard.py):
- a rollback: {"event": "rollback", "time", "step" (where it diverged), "to_step", "checkpoint",
  "reason", "rollback" (its number), "data_seed", "lr_factor", "lr_until"};
- a stop: {"event": "stop", "time", "step", "reason"} when it diverged again within rollback_window.
The launcher's restart in place appends (run/supervise.py, run/restart.py): {"event": "restart"},
{"event": "restarted"} once the ranks step again, {"event": "restart_stop"}; restarts_summary()
reads them for `taehv-launch status`. Every line also carries "launch_id", the launch that wrote it
(rundir/launchid.py).
A resume reads the rollbacks back (the lowered LR and the window survive it); `taehv-launch status`
shows how many there were and the newest.

A rollback record a resume cannot use (a hand edit: a field missing, of another type, not finite, an
LR factor outside (0, 1]) is left out with one note naming its line (rollbacks()); the launcher
says the same before a launch (run/inputs.py), the trainer again when it starts. A run never stops
for it: the records are bookkeeping, the checkpoints are the state.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..files import RECORD_LIMIT, disk_errors, read_json_lines
from .launchid import stamped
from .records import BAD, TIME, Field, Number, Record, Text, Whole

EVENTS_FILE = "events.jsonl"
SEED_LIMIT = 2**40  # |data_seed| below this: the sampler multiplies it by ~1e6 into torch's 64-bit seed


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """The events, oldest first; unreadable lines (a torn write, hand edits) are left out, and an
    unusable file (a folder, a FIFO, unreadable) reads as none."""
    try:
        return read_json_lines(Path(run_dir) / EVENTS_FILE)[0]
    except (OSError, ValueError):
        return []


STEP = Whole(what="a step number (a whole number >= 0)")
ROLLBACK = Record(  # what a resume needs of a rollback record (the other fields are for people)
    "rollback record",
    (
        Field("to_step", STEP, required=True),
        Field("lr_until", STEP, required=True),
        Field("data_seed", Whole(-SEED_LIMIT, SEED_LIMIT, "a whole number of magnitude below 2**40"), required=True),
        Field("lr_factor", Number(0.0, 1.0, "a number in (0, 1]", above=True), required=True),
        Field("checkpoint", Text(what="a checkpoint name"), required=True),
    ),
)


def rollback_problem(rec: dict[str, Any]) -> str | None:
    """Why a resume cannot use this rollback record (None: it can)."""
    return ROLLBACK.parse(rec).why or None


def rollbacks(run_dir: Path) -> tuple[list[dict[str, Any]], int, str]:
    """(the rollback records a resume can use, oldest first; how many rollback records were left out;
    '' or one note saying which were left out and why, naming events.jsonl and their lines).
    Unreadable lines are left out as read_events does (a torn last write is what a crash leaves)."""
    path = Path(run_dir) / EVENTS_FILE
    try:
        records, _ = read_json_lines(path)
    except (OSError, ValueError) as exc:
        why = str(exc) if isinstance(exc, ValueError) else (exc.strerror or str(exc))
        return [], 0, f"{path} cannot be read ({why}): no rollback of this run applies to the resume"
    good, bad = [], []
    for index, rec in enumerate(records):
        if rec.get("event") != "rollback":
            continue
        why = rollback_problem(rec)
        if why is None:
            good.append(rec)
        else:
            bad.append((index, why))
    if not bad:
        return good, 0, ""
    lines = _line_numbers(path)
    where = [f"line {lines[i]}" if i < len(lines) else f"record {i + 1}" for i, _ in bad]
    shown = "; ".join(f"{w}: {why}" for w, (_, why) in zip(where[:3], bad[:3]))
    more = f"; and {len(bad) - 3} more" if len(bad) > 3 else ""
    note = (
        f"{len(bad)} rollback record{'s' if len(bad) > 1 else ''} in {path} cannot be used and "
        f"{'are' if len(bad) > 1 else 'is'} left out ({shown}{more}): the run goes on with the learning rate "
        f"and data order of the rollbacks before {'them' if len(bad) > 1 else 'it'}; fix or delete "
        f"{'those lines' if len(bad) > 1 else 'that line'} to use {'them' if len(bad) > 1 else 'it'}"
    )
    return good, len(bad), note


def _line_numbers(path: Path) -> list[int]:
    """The line number (from 1) of each record read_json_lines returns, by the same rules; [] when it
    cannot tell (the file is gone, or too large to read whole). Read only to name a bad record's line."""
    try:
        with open(path, "rb") as f:
            data = f.read(RECORD_LIMIT)
            if f.read(1):
                return []
    except OSError:
        return []
    out = []
    for number, line in enumerate(data.decode(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(rec, dict):
            out.append(number)
    return out


def append_event(run_dir: Path, record: dict[str, Any]) -> None:
    with (
        disk_errors(EVENTS_FILE, run_dir, "then continue with --resume auto"),
        open(Path(run_dir) / EVENTS_FILE, "a") as f,
    ):
        f.write(json.dumps(stamped(record)) + "\n")


RESTART = Record("restart record", (Field("reason", Text(), default="?"), Field("time", TIME)))
SECONDS = Number()  # a "restarted" record's recovery_s: failure to first new step


def restarts_summary(events: list[dict]) -> dict | None:
    """For `status`: {"count", "last_reason", "last_time", "lost_s" (sum of failure-to-first-new-step
    times measured, None when none was), "running"} from events.jsonl's restart records; None: none."""
    starts = [e for e in events if e.get("event") == "restart"]
    if not starts:
        return None
    lost = [SECONDS.check(e.get("recovery_s")) for e in events if e.get("event") == "restarted"]
    lost = [x for x in lost if x is not BAD]
    last = RESTART.parse(starts[-1]).record or {}
    return {
        "count": len(starts),
        "last_reason": last["reason"],
        "last_time": last["time"],
        "lost_s": round(sum(lost), 1) if lost else None,
        "ended": next((e.get("reason") for e in reversed(events) if e.get("event") == "restart_stop"), None),
    }
