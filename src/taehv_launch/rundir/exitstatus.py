"""The exit-status file: the trainer's local rank 0 of each node records its exit code and one line
in it; the launcher reports that code instead of accelerate's (which turns every failure into 1).
{"code", "message", "repeats" (only when true), "launch_id" (the launch that wrote it, rundir/launchid.py)}"""

from __future__ import annotations

import json
from pathlib import Path

from ..files import write_atomic
from .layout import node_suffix
from .launchid import LAUNCH, LAUNCH_ID, stamped
from .records import TRUE, Field, Record, Text, Whole


def exit_status_path(run_dir: Path, node: int) -> Path:
    """Where the trainer's local rank 0 of `node` records its exit code for the launcher."""
    return run_dir / f"exit_status{node_suffix(node)}.json"


def write_exit_status(path: Path, code: int, message: str, repeats: bool = False) -> None:
    """Record {"code", "message"} atomically, and "repeats": true when the trainer stopped on a problem a
    restart would meet again (a user error such as diverging again or a full disk, not a dead peer): the
    launcher's restart in place (run/restart.py) leaves it. An OSError is the caller's to report."""
    rec = {"code": code, "message": message} | ({"repeats": True} if repeats else {})
    write_atomic(path, json.dumps(stamped(rec)))


EXIT_STATUS = Record(
    "exit status",
    (
        Field("code", Whole(None), required=True),
        Field("message", Text()),
        Field("repeats", TRUE, default=False),
        LAUNCH,
    ),
)


def read_exit_status(path: Path, launch: bool = False) -> dict | None:
    """The recorded {"code": int, "message": str or None} (and "repeats": True where recorded; with
    `launch`, "launch_id": the launch that wrote it, or None), or None when there is none (yet) or it is
    unusable (unreadable, not an object, no whole-number code)."""
    rec = EXIT_STATUS.read(path).record
    if rec is None:
        return None
    repeats, lid = rec.pop("repeats"), rec.pop(LAUNCH_ID)
    return rec | ({"repeats": True} if repeats else {}) | ({LAUNCH_ID: lid} if launch else {})
