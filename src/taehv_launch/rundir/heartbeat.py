"""The heartbeat files every trainer rank keeps in <run>/heartbeat/ (written by
train/durability/watchdog.py, read by the peers' watchdogs and by `taehv-launch status`).

rank<r>       JSON, rewritten every few seconds by a background thread:
              {"rank", "node", "host", "pid", "step", "phase", "progress_age_s", "collectives",
               "warmup", "time"}
              `step` is the last finished optimizer step, `phase` what the rank does now (data,
              forward, backward, collective, checkpoint, validation, compile, setup, ...),
              `progress_age_s` how long ago the step or phase last changed, `collectives` how many
              collectives the rank has issued (those the trainer counts: a rank with fewer than its
              peers has not reached the one they wait in), `warmup` true during the first steps of
              the process (compile warm-up), `time` the writer's clock.
              The file's mtime (the shared filesystem's clock) says whether the rank is alive.
rank<r>.dead  one line: why the rank failed (an exception in that rank)
rank<r>.done  the rank finished cleanly
rank<r>.hang  the watchdog's hang report (JSON, see HangReport keys below): written by the rank that
              found the hang; every other rank reads it, dumps its stacks and stops
stacks/       taken on a hang: rank<r>.txt (the rank's Python stacks, every thread), and where torch
              has one, its flight recorder (a pickle, named as torch names it so that PyTorch's
              `torchfrtrace DIR -p nccl_trace_rank_` reads the folder): nccl_trace_rank_<r> (NCCL),
              fr_trace_rank_<r> (gloo). At the NCCL timeout (the backstop) torch writes its own dump
              under the same name (TORCH_FR_DUMP_TEMP_FILE, set by the launcher)

A hang report holds: "line" (the one line the launcher prints), "by" (the rank that wrote it),
"culprits" (the stuck ranks), "why", "limit_s", "ranks" (each rank's step, phase and ages as the
deciding rank saw them), "dumps" (the files in stacks/ once every live rank dumped), "missing"
(live ranks that left no stack dump), "time".
"""

from __future__ import annotations

import json
from pathlib import Path

HEARTBEAT_DIR = "heartbeat"
STACKS_DIR = "stacks"
HANG_SUFFIX = ".hang"
TIMEOUT_DUMP_PREFIX = "nccl_trace_rank_"  # torch appends the global rank


def heartbeat_dir(run_dir: Path) -> Path:
    return Path(run_dir) / HEARTBEAT_DIR


def heartbeat_path(run_dir: Path, rank: int, suffix: str = "") -> Path:
    """rank<r> (suffix ""), or its .dead / .done / .hang marker."""
    return heartbeat_dir(run_dir) / f"rank{rank}{suffix}"


def stacks_dir(run_dir: Path) -> Path:
    return heartbeat_dir(run_dir) / STACKS_DIR


def stack_path(run_dir: Path, rank: int) -> Path:
    """The rank's Python stack dump, taken on a hang."""
    return stacks_dir(run_dir) / f"rank{rank}.txt"


def trace_path(run_dir: Path, rank: int, kind: str) -> Path:
    """The rank's flight-recorder dump: kind "nccl" (NCCL) or "fr" (torch's generic recorder: gloo)."""
    return stacks_dir(run_dir) / f"{kind}_trace_rank_{rank}"


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


def read_hang_reports(run_dir: Path, since: float = 0.0) -> dict[int, dict]:
    """rank -> hang report (with `mtime` added) of every rank<r>.hang written at or after `since`
    (the filesystem's clock; 0: all, including an earlier launch's)."""
    out: dict[int, dict] = {}
    folder = heartbeat_dir(run_dir)
    if not folder.is_dir():
        return out
    for path in folder.glob(f"rank*{HANG_SUFFIX}"):
        rank = path.name[4 : -len(HANG_SUFFIX)]
        if rank.isdigit() and (report := read_heartbeat(path)) is not None and report["mtime"] >= since:
            out[int(rank)] = report
    return out
