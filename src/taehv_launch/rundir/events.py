"""<run>/events.jsonl: the run's divergence events, one JSON object per line, oldest first.

The trainer's rank 0 appends (train/loop/guard.py):
- a rollback: {"event": "rollback", "time", "step" (where it diverged), "to_step", "checkpoint",
  "reason", "rollback" (its number), "data_seed", "lr_factor", "lr_until"};
- a stop: {"event": "stop", "time", "step", "reason"} when it diverged again within rollback_window.
A resume reads the rollbacks back (the lowered LR and the window survive it); `taehv-launch status`
shows how many there were and the newest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..files import disk_errors

EVENTS_FILE = "events.jsonl"


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """The events, oldest first; unreadable lines (a torn write, hand edits) are left out."""
    out = []
    try:
        lines = (Path(run_dir) / EVENTS_FILE).read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def append_event(run_dir: Path, record: dict[str, Any]) -> None:
    with (
        disk_errors(EVENTS_FILE, run_dir, "then continue with --resume auto"),
        open(Path(run_dir) / EVENTS_FILE, "a") as f,
    ):
        f.write(json.dumps(record) + "\n")
