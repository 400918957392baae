"""`taehv-launch status`: where runs stand, from their run directories alone (pure reads: nothing is
written, not even `latest`), on a live run (its ranks' heartbeats on the shared filesystem) and after
it ended (exit_status*.json, launch*.log). watchtext.py prints what collect() gathers.

Where each fact comes from: progress.json (step, total, clips/s now and average, ETA; the trainer's rank
0 rewrites it at each log line), else the last `step N/T` line of launch.log; heartbeat/rank<r> (each
rank's host, node, step, phase; the file's mtime says whether it lives); checkpoint-<step>/COMPLETE;
exit_status[.node<k>].json and the last `error:` line of launch[.node<k>].log; requeue.json;
env[.node<k>].json (nodes and processes); manifest.jsonl (launches); events.jsonl (divergence rollbacks).
"""

from __future__ import annotations

import glob
import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..rundir.checkpoint import COMPLETE, list_checkpoints
from ..rundir.events import read_events
from ..rundir.heartbeat import heartbeat_path, read_hang_reports, read_heartbeats
from ..rundir.layout import REQUEUE
from ..rundir.manifest import read_manifest
from ..rundir.progress import read_progress
from ..rundir.requeue import read_requeues
from ..rundir.status import read_exit_status, status_path
from .runs import runs_newest_first

LIVE_S = 60.0  # a heartbeat younger than this is a live rank (ranks rewrite theirs every 5 s; stale at 30 s)
RUN_FILES = ("config.py", "env.json", "launch.log", "manifest.jsonl", "exit_status.json")
LOG_TAIL = 256 * 1024  # bytes of a launch log read for its last step and error lines
STEP_LINE = re.compile(
    r"^step (\d+)/(\d+) \|.*\| ([\d.]+) samples/s \|.*ETA (?:(\d+) days?, )?(\d+):(\d\d):(\d\d)", re.M
)
ERROR_LINE = re.compile(r"^(?:\[rank \d+\] )?error: .*$", re.M)
GLOB_CHARS = set("*?[")


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and any((path / name).exists() for name in RUN_FILES)


def targets(args: list[str], output_dir: str = "output") -> list[Path]:
    """The run directories that `status RUN ...` names: a run dir, `latest` or a run id (under
    output_dir), an output dir (every run in it, newest first) or a glob. Bad input: ConfigError."""
    found: list[Path] = []
    for arg in args or [f"{output_dir}/latest"]:
        found += _target(arg, output_dir)
    seen, out = set(), []
    for p in found:
        if (r := p.resolve()) not in seen:
            seen.add(r)
            out.append(r)
    return out


def _target(arg: str, output_dir: str) -> list[Path]:
    path = Path(arg).expanduser()
    if GLOB_CHARS & set(arg) and not path.exists():
        matches = [Path(m) for m in sorted(glob.glob(os.path.expanduser(arg)))]
        runs = [m for m in matches if is_run_dir(m)]
        if not runs:
            what = "nothing" if not matches else f"{len(matches)} path(s), none of them a run directory"
            raise ConfigError(f"{arg} matches {what}: give a run directory, an output directory or a glob of runs")
        return runs
    if not path.exists() and "/" not in arg and (Path(output_dir) / arg).exists():
        path = Path(output_dir) / arg  # `latest` or a run id
    if not path.exists():
        hint = f" (nor {Path(output_dir) / arg})" if "/" not in arg else ""
        raise ConfigError(
            f"no run directory {arg}{hint}: give a run directory, an output directory or a glob "
            f"(default: {output_dir}/latest, from the folder you launched in)"
        )
    if is_run_dir(path):
        return [path]
    runs = [p for p in runs_newest_first(path) if is_run_dir(p)] if path.is_dir() else []
    if not runs:
        raise ConfigError(
            f"{arg} is not a run directory (no {', '.join(RUN_FILES[:3])}) and holds none: give a run "
            f"directory, an output directory or a glob"
        )
    return runs


def _json(path: Path) -> dict | None:
    try:
        rec = json.loads(path.read_text())
        return rec if isinstance(rec, dict) else None
    except (OSError, ValueError):
        return None


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_TAIL))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _node_files(run_dir: Path, stem: str, ext: str) -> dict[int, Path]:
    """node -> <stem>[.node<k>].<ext> for every node that has one."""
    out = {0: run_dir / f"{stem}.{ext}"} if (run_dir / f"{stem}.{ext}").exists() else {}
    for p in run_dir.glob(f"{stem}.node*.{ext}"):
        k = p.name[len(stem) + 5 : -len(ext) - 1]
        if k.isdigit():
            out[int(k)] = p
    return dict(sorted(out.items()))


def _progress(run_dir: Path, logs: dict[int, Path]) -> dict[str, Any]:
    """step, total, clips/s now and average, ETA at the record's time: progress.json, else the log."""
    rec = read_progress(run_dir)
    if rec and isinstance(rec.get("step"), int):
        return {
            "step": rec.get("step"),
            "total": rec.get("total"),
            "clips_per_s": rec.get("samples_per_s"),
            "clips_per_s_avg": rec.get("samples_per_s_avg"),
            "global_batch": rec.get("global_batch"),
            "eta_s": rec.get("eta_s"),
            "progress_time": rec.get("time"),
            "launch_started": rec.get("started"),
            "progress_from": "progress.json",
        }
    log = logs.get(0)
    found = list(STEP_LINE.finditer(_tail(log))) if log else []
    if not found:
        return {}
    m = found[-1]
    days, h, mi, s = (int(x or 0) for x in m.group(4, 5, 6, 7))
    return {
        "step": int(m.group(1)),
        "total": int(m.group(2)),
        "clips_per_s": float(m.group(3)),
        "clips_per_s_avg": None,
        "global_batch": None,
        "eta_s": float(days * 86400 + h * 3600 + mi * 60 + s),
        "progress_time": _mtime(log),
        "launch_started": None,
        "progress_from": log.name,
    }


def _heartbeats(run_dir: Path, now: float) -> tuple[list[dict], list[dict]]:
    """(per-rank rows, per-node rows) from heartbeat/."""
    ranks = []
    for rank, hb in sorted(read_heartbeats(run_dir).items()):
        dead = heartbeat_path(run_dir, rank, ".dead")
        try:
            why = dead.read_text().strip().splitlines()[0] if dead.exists() else None
        except (OSError, IndexError):
            why = "?"
        ranks.append(
            {
                "rank": rank,
                "node": hb.get("node"),
                "host": hb.get("host"),
                "step": hb.get("step"),
                "phase": hb.get("phase"),
                "age_s": now - hb["mtime"],
                "stale": now - hb["mtime"] > LIVE_S,
                "progress_age_s": hb.get("progress_age_s"),
                "done": heartbeat_path(run_dir, rank, ".done").exists(),
                "dead": why,
            }
        )
    nodes: dict[Any, dict] = {}
    for r in ranks:
        n = nodes.setdefault(r["node"], {"node": r["node"], "hosts": [], "ranks": [], "ages": []})
        n["ranks"].append(r["rank"])
        n["ages"].append(r["age_s"])
        if r["host"] not in n["hosts"]:
            n["hosts"].append(r["host"])
    rows = [
        {
            "node": n["node"],
            "host": ", ".join(str(h) for h in n["hosts"]),
            "ranks": n["ranks"],
            "newest_age_s": min(n["ages"]),
            "oldest_age_s": max(n["ages"]),
        }
        for n in sorted(nodes.values(), key=lambda n: (n["node"] is None, n["node"] if n["node"] is not None else 0))
    ]
    return ranks, rows


def _launcher_alive(run_dir: Path) -> bool:
    """Node 0's launcher holds .lock (run/lock.py); on this host its pid says whether it still runs."""
    holder = _json(run_dir / ".lock") or {}
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _checkpoint(run_dir: Path, now: float) -> dict | None:
    listed = list_checkpoints(run_dir)  # sizes only: no checkpoint file is read
    complete = [(s, p) for s, p, why in listed if why is None]
    if not complete:
        return None
    step, path = complete[-1]
    at = _mtime(path / COMPLETE)
    return {"name": path.name, "step": step, "time": at, "age_s": now - at if at else None}


def _rollbacks(run_dir: Path) -> dict[str, Any]:
    """How many divergence rollbacks the run made, the newest one, and a stop for diverging again."""
    events = read_events(run_dir)
    rollbacks = [e for e in events if e.get("event") == "rollback"]
    stop = next((e for e in reversed(events) if e.get("event") == "stop"), None)
    keys = ("time", "step", "to_step", "checkpoint", "reason")
    return {
        "count": len(rollbacks),
        "last": {k: rollbacks[-1].get(k) for k in keys} if rollbacks else None,
        "stopped": {k: stop.get(k) for k in ("time", "step", "reason")} if stop else None,
    }


def _topology(run_dir: Path, manifest: list[dict], beat_nodes: list[dict], beat_ranks: list[dict]) -> dict:
    """Nodes and processes: the rendered env files, else the manifest, else the heartbeats."""
    for _node, path in _node_files(run_dir, "env", "json").items():
        topo = (_json(path) or {}).get("topology") or {}
        if isinstance(topo.get("num_machines"), int) and isinstance(topo.get("gpus_per_machine"), int):
            return {"nodes": topo["num_machines"], "processes": topo["num_machines"] * topo["gpus_per_machine"]}
    plan = (manifest[-1].get("plan") if manifest else None) or {}
    if plan.get("num_machines") is not None:
        return {"nodes": plan.get("num_machines"), "processes": plan.get("world_size")}
    return {"nodes": len(beat_nodes) or None, "processes": len(beat_ranks) or None}


def collect(run_dir: Path, now: float | None = None) -> dict[str, Any]:
    """Everything status shows about one run (the JSON that `status --json` prints for it)."""
    now = time.time() if now is None else now
    run_dir = Path(run_dir)
    logs = _node_files(run_dir, "launch", "log")
    manifest = read_manifest(run_dir)
    progress = _progress(run_dir, logs)
    ranks, nodes = _heartbeats(run_dir, now)
    exits = []
    for node in sorted({0, *logs, *_node_files(run_dir, "exit_status", "json")}):
        rec = read_exit_status(status_path(run_dir, node))
        if rec is not None:
            exits.append({"node": node, "code": rec.get("code"), "message": rec.get("message")})
    errors = [(n, m[-1]) for n, log in logs.items() if (m := ERROR_LINE.findall(_tail(log)))]
    last_error = (
        f"node {errors[0][0]}: {errors[0][1]}" if len(logs) > 1 and errors else (errors[0][1] if errors else None)
    )
    newest_hb = min((r["age_s"] for r in ranks), default=None)
    log_age = now - m if (m := max((_mtime(p) or 0 for p in logs.values()), default=0)) else None
    node0 = next((e for e in exits if e["node"] == 0), None)
    if node0 is not None:
        state = {0: "ended", 75: "stopped", 130: "stopped"}.get(node0["code"], "failed")
    elif newest_hb is not None and newest_hb < LIVE_S:
        state = "running"
    elif _launcher_alive(run_dir) or (log_age is not None and log_age < LIVE_S):
        state = "starting" if newest_hb is None or (log_age is not None and log_age < newest_hb) else "running"
    elif logs:
        state = "lost"  # no exit status and nothing alive: killed, or its node was lost
    else:
        state = "not started"
    live = state in ("running", "starting")
    if progress.get("eta_s") is not None and progress.get("progress_time") and live:
        left = max(0.0, progress["eta_s"] - (now - progress["progress_time"]))
        progress["eta_now_s"], progress["ends_at"] = left, now + left
    else:
        progress["eta_now_s"] = progress["ends_at"] = None
    step = progress.get("step")  # as of the last log line; the live ranks' heartbeats may know a later one
    beats = [r["step"] for r in ranks if not r["stale"] and isinstance(r["step"], int)]
    if live and beats and (step is None or min(beats) > step):
        step = min(beats)
    requeues = read_requeues(run_dir)
    hang = read_hang_reports(run_dir, since=manifest[-1].get("time", 0) if manifest else 0)
    return {
        "run": run_dir.name,
        "run_dir": str(run_dir),
        "state": state,
        "exit_code": node0["code"] if node0 else None,
        "now": now,
        "step": step,
        "logged_step": progress.get("step"),
        "total": progress.get("total"),
        "clips_per_s": progress.get("clips_per_s"),
        "clips_per_s_avg": progress.get("clips_per_s_avg"),
        "global_batch": progress.get("global_batch"),
        "eta_s": progress["eta_now_s"],
        "ends_at": progress["ends_at"],
        "progress_time": progress.get("progress_time"),
        "progress_from": progress.get("progress_from"),
        "launch_started": progress.get("launch_started"),
        "checkpoint": _checkpoint(run_dir, now),
        **_topology(run_dir, manifest, nodes, ranks),
        "heartbeat_nodes": nodes,
        "heartbeat_ranks": ranks,
        "heartbeat_age_s": newest_hb,
        "log_age_s": log_age,
        "exit": exits,
        "last_error": last_error,
        "hang": next(iter(hang.values())).get("line") if hang else None,
        "requeues": {
            "count": requeues.get("count", 0),
            "without_progress": requeues.get("without_progress", 0),
            "stopped": requeues.get("stopped"),
        }
        if requeues
        else {"count": 0, "without_progress": 0, "stopped": None},
        "requeue_marker": (run_dir / REQUEUE).exists(),
        "rollbacks": _rollbacks(run_dir),
        "launches": len(manifest) or None,
        "first_launch": manifest[0].get("time") if manifest else None,
        "plan_hash": ((manifest[-1].get("plan") or {}).get("hash") if manifest else None),
        "node_logs": {str(n): p.name for n, p in logs.items()},
    }


def status(args: list[str], as_json: bool) -> int:
    """The command: 0, or ConfigError for input that names no run."""
    from .watchtext import render

    runs = targets(args)
    now = time.time()
    facts = [collect(r, now) for r in runs]
    if as_json:
        print(json.dumps({"time": now, "runs": facts}, indent=2, default=str))
    else:
        print(render(facts, now))
    return 0
