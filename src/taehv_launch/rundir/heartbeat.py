"""The heartbeat files every trainer rank keeps in <run>/heartbeat/ (written by
train/durability/watchdog.py, read by the peers' watchdogs and by `taehv-launch status`).

rank<r>       JSON, rewritten every few seconds by a background thread:
              {"rank", "node", "host", "pid", "step", "phase", "progress_age_s", "time"}
              `step` is the last finished optimizer step, `phase` what the rank does now (data,
              forward, backward, collective, checkpoint, validation, compile, setup, ...),
              `progress_age_s` how long ago the step or phase last changed, `time` the writer's clock.
              The file's mtime (the shared filesystem's clock) says whether the rank is alive.
rank<r>.dead  one line: why the rank failed (an exception in that rank)
rank<r>.done  the rank finished cleanly
rank<r>.hang  the watchdog's hang report: the stuck ranks, their phase, where the stack dumps are
stacks/       per-rank Python stack dumps (and NCCL flight-recorder dumps on GPUs) taken on a hang
"""

from __future__ import annotations

import json
from pathlib import Path

HEARTBEAT_DIR = "heartbeat"
STACKS_DIR = "stacks"


def heartbeat_dir(run_dir: Path) -> Path:
    return Path(run_dir) / HEARTBEAT_DIR


def heartbeat_path(run_dir: Path, rank: int, suffix: str = "") -> Path:
    """rank<r> (suffix ""), or its .dead / .done / .hang marker."""
    return heartbeat_dir(run_dir) / f"rank{rank}{suffix}"


def stacks_dir(run_dir: Path) -> Path:
    return heartbeat_dir(run_dir) / STACKS_DIR


def read_heartbeat(path: Path) -> dict | None:
    """One rank's heartbeat with `mtime` added (the filesystem's clock), or None when absent/mid-write."""
    try:
        info = json.loads(path.read_text())
        info["mtime"] = path.stat().st_mtime
        return info if isinstance(info, dict) else None
    except (OSError, ValueError):
        return None


def read_heartbeats(run_dir: Path) -> dict[int, dict]:
    """rank -> heartbeat (see read_heartbeat) for every rank<r> file in the run's heartbeat folder."""
    out: dict[int, dict] = {}
    folder = heartbeat_dir(run_dir)
    if not folder.is_dir():
        return out
    for path in folder.glob("rank*"):
        if path.name[4:].isdigit() and (info := read_heartbeat(path)) is not None:
            out[int(path.name[4:])] = info
    return out
