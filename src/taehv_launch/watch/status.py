"""`taehv-launch status`: where runs stand, from their run directories alone (pure reads: nothing is
written, not even `latest`), on a live run (its ranks' heartbeats on the shared filesystem) and after
it ended (exit_status*.json, launch*.log). statustext.py prints what collect() gathers.

Where each fact comes from: progress.json (step, total, clips/s now and average, ETA; the trainer's rank
0 rewrites it at each log line), else the last `step N/T` line of launch.log; heartbeat/rank<r> (each
rank's host, node, step, phase; the file's mtime says whether it lives); checkpoint-<step>/COMPLETE;
exit_status[.node<k>].json and the last `error:` line of launch[.node<k>].log; requeue.json;
env[.node<k>].json (nodes and processes); manifest.jsonl (launches); events.jsonl (divergence rollbacks); validation.json.
Every file is read as files.read_json* reads it (a FIFO, a device or a huge file never blocks nor fills
memory; a field of another type than written reads as unknown). What an earlier launch of the run left
(progress.json, heartbeats, hang reports, hang_limits.json, exit status) is not taken for this launch's:
each record carries the launch id of the launch that wrote it, and the current launch's is in node 0's
.lock (rundir/launches.py; a run directory from before launch ids: by the times the records were
written); log lines: those after the launch log's last banner.
"""

from __future__ import annotations

import glob
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Callable

from ..errors import ConfigError
from ..files import BadRecord, read_json_lines, read_json_or_none
from ..plan.configfile import read_config_literals
from ..rundir.checkpoint import COMPLETE, checkpoint_step, incomplete_reason
from ..rundir.events import EVENTS_FILE, read_events, restarts_summary
from ..rundir.heartbeat import node_rows, rank_rows, read_hang_reports
from ..rundir.launches import current_launch, launcher_alive
from ..rundir.launchid import LAUNCH_ID
from ..rundir.layout import REQUEUE, runs_newest_first
from ..rundir.manifest import MANIFEST_FILE, part, read_manifest_state, record_time
from ..rundir.progress import progress_of, read_text_part, this_launch, validation_of
from ..rundir.records import count, number, timestamp
from ..rundir.requeue import read_requeues
from ..rundir.exitstatus import read_exit_status, exit_status_path
from .statustext import link_text, shown

LIVE_S = 60.0  # a heartbeat younger than this is a live rank (ranks rewrite theirs every 5 s; stale at 30 s)
RUN_FILES = ("config.py", "env.json", "launch.log", "manifest.jsonl", "exit_status.json")
RUN_FILES_TEXT = "no config.py, env.json, launch.log, manifest.jsonl or exit_status.json"
LOG_TAIL = 256 * 1024  # bytes of a launch log read for its last step and error lines
ERROR_LINE = re.compile(r"^(?:\[rank \d+\] )?error: .*$", re.M)
GLOB_CHARS = set("*?[")
WHERE = "give a run directory, an output directory or a glob"
FIELDS = (  # collect()'s keys: `status --json` (docs/watching.md lists them)
    "run", "run_dir", "state", "exit_code", "now", "step", "logged_step", "total", "clips_per_s",
    "clips_per_s_avg", "global_batch", "eta_s", "ends_at", "progress_time", "progress_from", "progress_of",
    "launch_started", "flops", "checkpoint", "nodes", "processes", "heartbeat_nodes", "heartbeat_ranks",
    "heartbeat_age_s", "log_age_s", "exit", "last_error", "hang", "requeues", "requeue_marker", "rollbacks",
    "launches", "first_launch", "resume_from", "plan_hash", "node_logs", "unreadable", "restarts", "validation",
    "unstarted",
)  # fmt: skip


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def probe(path: Path) -> tuple[bool, str | None]:
    """(is it a run directory, why it cannot be looked into or None)."""
    try:
        return path.is_dir() and any((path / name).exists() for name in RUN_FILES), None
    except OSError as exc:
        return False, _why(exc)


def is_run_dir(path: Path) -> bool:
    return probe(path)[0]


def targets(args: list[str], output_dir: str = "output") -> list[tuple[Path, str | None]]:
    """(run directory, why it cannot be read or None) for each run `status RUN ...` names: a run dir,
    `latest` or a run id (under output_dir), an output dir (every run in it, newest first) or a glob.
    Input that names no run: ConfigError."""
    found: list[tuple[Path, str | None]] = []
    for arg in args or [f"{output_dir}/latest"]:
        found += _target(arg, output_dir)
    seen, out = set(), []
    for p, why in found:
        if (r := p.resolve()) not in seen:
            seen.add(r)
            out.append((r, why))
    return out


def missing(arg: str, path: Path, output_dir: str) -> ConfigError:
    """The error for a path that is not there: a dangling link says where it points, a loop of links
    that it is one (Path.exists() says False for both)."""
    if (link := link_text(path, WHERE)) is not None:
        return ConfigError(f"{shown(arg)} {link}")
    hint = f" (nor {shown(Path(output_dir) / arg)})" if "/" not in arg else ""
    return ConfigError(
        f"no run directory {shown(arg)}{hint}: {WHERE} (default: {output_dir}/latest, from the folder you launched in)"
    )


def locate(arg: str, output_dir: str) -> Path:
    """The path an argument names: itself, else `latest` or a run id under output_dir (ConfigError: empty)."""
    if not arg.strip():
        raise ConfigError(f"an empty path {arg!r}: {WHERE}")
    path = Path(arg).expanduser()
    if not os.path.lexists(path) and "/" not in arg and os.path.lexists(Path(output_dir) / arg):
        path = Path(output_dir) / arg  # `latest` or a run id
    return path


def _target(arg: str, output_dir: str) -> list[tuple[Path, str | None]]:
    path = locate(arg, output_dir)
    try:
        exists = path.exists()
    except OSError as exc:
        return [(path, _why(exc))]
    if GLOB_CHARS & set(arg) and not exists:
        matches = [Path(m) for m in sorted(glob.glob(os.path.expanduser(arg)))]
        runs = [(m, why) for m in matches for is_run, why in [probe(m)] if is_run or why]
        if not runs:
            what = "nothing" if not matches else f"{len(matches)} path(s), none of them a run directory"
            raise ConfigError(f"{shown(arg)} matches {what}: {WHERE} of runs")
        return runs
    if not exists:
        raise missing(arg, path, output_dir)
    is_run, why = probe(path)
    if is_run or why:
        return [(path, why)]
    try:
        subdirs = runs_newest_first(path) if path.is_dir() else []
    except OSError as exc:
        return [(path, _why(exc))]
    runs = [(p, why) for p in subdirs for is_run, why in [probe(p)] if is_run or why]
    if not runs:
        raise ConfigError(f"{shown(arg)} is not a run directory ({RUN_FILES_TEXT}) and holds none: {WHERE}")
    return runs


def _tail(path: Path) -> str:
    try:
        return read_text_part(path, LOG_TAIL)
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


def _checkpoint(run_dir: Path, now: float, problems: list[str]) -> dict | None:
    """The newest complete checkpoint (sizes only, no file read); an unreadable one is a problem."""
    best = None
    for p in run_dir.iterdir():
        step = checkpoint_step(p)
        if step is None or (best is not None and step <= best[0]):
            continue
        try:
            if p.is_dir() and incomplete_reason(p) is None:
                best = (step, p)
        except OSError as exc:
            problems.append(f"{shown(p.name)}: {_why(exc)}")
    if best is None:
        return None
    at = _mtime(best[1] / COMPLETE)
    return {"name": best[1].name, "step": best[0], "time": at, "age_s": now - at if at else None}


def _rollbacks(run_dir: Path) -> dict[str, Any]:
    """How many divergence rollbacks the run made, the newest one, and a stop for diverging again."""
    try:
        events = read_json_lines(run_dir / EVENTS_FILE)[0]
    except (OSError, BadRecord):
        events = []
    rollbacks = [e for e in events if e.get("event") == "rollback"]
    stop = next((e for e in reversed(events) if e.get("event") == "stop"), None)

    def pick(e: dict, keys: tuple[str, ...]) -> dict:
        return {k: (timestamp(e.get(k)) if k == "time" else e.get(k)) for k in keys}

    keys = ("time", "step", "to_step", "checkpoint", "reason")
    return {
        "count": len(rollbacks),
        "last": pick(rollbacks[-1], keys) if rollbacks else None,
        "stopped": pick(stop, ("time", "step", "reason")) if stop else None,
    }


def _requeues(run_dir: Path) -> dict[str, Any]:
    rec = read_requeues(run_dir) or {}  # its fields checked: another type reads as 0 or None
    return {
        "count": rec.get("count", 0),
        "without_progress": rec.get("without_progress", 0),
        "stopped": rec.get("stopped"),
    }


def _topology(run_dir: Path, manifest: list[dict], beat_nodes: list[dict], beat_ranks: list[dict]) -> dict:
    """Nodes and processes: the rendered env files, else the manifest, else the heartbeats."""
    for _node_k, path in _node_files(run_dir, "env", "json").items():
        topo = part(read_json_or_none(path), "topology")
        nodes, per = count(topo.get("num_machines")), count(topo.get("gpus_per_machine"))
        if nodes is not None and per is not None:
            return {"nodes": nodes, "processes": nodes * per}
    plan = part(manifest[-1], "plan") if manifest else {}
    if count(plan.get("num_machines")) is not None:
        return {"nodes": plan["num_machines"], "processes": count(plan.get("world_size"))}
    return {"nodes": len(beat_nodes) or None, "processes": len(beat_ranks) or None}


def _config(run_dir: Path) -> dict[str, Any]:
    """config.py's literal values (read, never executed): the total before the first log line, hang limits."""
    try:
        return read_config_literals(run_dir / "config.py")
    except (OSError, ConfigError):
        return {}


def collect(run_dir: Path, now: float | None = None) -> dict[str, Any]:
    """Everything status shows about one run (the JSON that `status --json` prints for it). A part that
    cannot be read (an unreadable checkpoint folder) is named in `unreadable`; the rest is still shown."""
    now = time.time() if now is None else now
    run_dir = Path(run_dir)
    problems: list[str] = []

    def guard(what: str, read: Callable[[], Any], default: Any) -> Any:
        try:
            return read()
        except OSError as exc:
            problems.append(f"{what}: {_why(exc)}")
            return default

    logs = guard("launch logs", lambda: _node_files(run_dir, "launch", "log"), {})
    manifest = (manifest_read := read_manifest_state(run_dir)).records  # only its tail when huge
    problems += [f"{MANIFEST_FILE}: {manifest_read.why}"] if manifest_read.why else []  # one there, no record
    launcher = launcher_alive(run_dir)
    launch = current_launch(run_dir, manifest, launcher)  # which records are this launch's (rundir/launches.py)
    tails = {n: _tail(p) for n, p in logs.items()}
    log0 = logs.get(0)
    progress = progress_of(run_dir, tails.get(0, ""), log0.name if log0 else "", log0 and _mtime(log0), launch)
    cfg = _config(run_dir)
    progress = progress or {"total": count(cfg.get("max_train_steps")) or None}
    limits = (number(cfg.get("hang_timeout")) or 0.0, number(cfg.get("hang_timeout_slow")) or 0.0)
    ranks = guard("heartbeat", lambda: rank_rows(run_dir, now, LIVE_S, launch, limits), [])
    nodes = node_rows(ranks)
    exit_files = guard("exit status", lambda: _node_files(run_dir, "exit_status", "json"), {})
    exits = []
    for node in sorted({0, *logs, *exit_files}):
        path = exit_status_path(run_dir, node)
        rec = read_exit_status(path, launch=True)
        if rec is not None and launch.holds(rec, _mtime(path) or 0.0):  # not an earlier launch's
            exits.append({"node": node, **{k: v for k, v in rec.items() if k != LAUNCH_ID}})
    errors = [(n, m[-1]) for n, tail in tails.items() if (m := ERROR_LINE.findall(this_launch(tail)[0]))]
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
    elif launcher or (log_age is not None and log_age < LIVE_S):
        state = "starting" if newest_hb is None or (log_age is not None and log_age < newest_hb) else "running"
    elif logs:
        state = "lost"  # no exit status and nothing alive: killed, or its node was lost
    else:
        state = "not started"
    state = "hung" if state == "running" and any(r["not_responding"] for r in ranks) else state  # frozen rank
    live = state in ("running", "starting")
    eta_now = ends_at = None
    if progress.get("eta_s") is not None and progress.get("progress_time") and live:
        eta_now = max(0.0, progress["eta_s"] - (now - progress["progress_time"]))
        ends_at = now + eta_now
    step = progress.get("step")  # as of the last log line; the live ranks' heartbeats may know a later one
    beats = [r["step"] for r in ranks if not r["stale"] and r["step"] is not None]
    if live and beats and (step is None or min(beats) > step):
        step = min(beats)
    plan = part(launch.record, "plan")
    hang = read_hang_reports(run_dir, since=launch)
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
        "eta_s": eta_now,
        "ends_at": ends_at,
        "progress_time": progress.get("progress_time"),
        "progress_from": progress.get("progress_from"),
        "progress_of": progress.get("of", "this launch") if progress.get("step") is not None else None,
        "launch_started": progress.get("launch_started"),
        "flops": progress.get("flops"),  # the last log window's TFLOP/s per GPU and MFU (rundir/progress.py)
        "validation": validation_of(run_dir, tails.get(0, ""), log0.name if log0 else ""),  # the newest one
        "checkpoint": guard("checkpoints", lambda: _checkpoint(run_dir, now, problems), None),
        **_topology(run_dir, manifest, nodes, ranks),
        "heartbeat_nodes": nodes,
        "heartbeat_ranks": ranks,
        "heartbeat_age_s": newest_hb,
        "log_age_s": log_age,
        "exit": exits,
        "last_error": last_error,
        "hang": next((r["line"] for r in hang.values() if isinstance(r.get("line"), str)), None),
        "requeues": _requeues(run_dir),
        "requeue_marker": guard(REQUEUE, lambda: (run_dir / REQUEUE).exists(), False),
        "rollbacks": _rollbacks(run_dir),
        # in-job restarts (run/restart.py) of this launch only: an earlier launch's ended with it; or None
        "restarts": restarts_summary(
            [e for e in read_events(run_dir) if launch.holds(e, started=timestamp(e.get("time")))]
        ),
        "launches": manifest_read.launches,
        "unstarted": launch.unstarted,  # a newer launch that ended before writing its manifest record, or None
        "first_launch": record_time(manifest[0]) if manifest and manifest_read.whole else None,
        "resume_from": Path(r).name if isinstance(r := (launch.record or {}).get("resume"), str) else None,
        "plan_hash": plan.get("hash") if isinstance(plan.get("hash"), str) else None,
        "node_logs": {str(n): p.name for n, p in logs.items()},
        "unreadable": problems,
    }


def unreadable(run_dir: Path, why: str, now: float) -> dict[str, Any]:
    """collect()'s fields for a run whose directory cannot be read: state "unreadable", and why."""
    known: dict[str, Any] = {"run": run_dir.name, "run_dir": str(run_dir), "state": "unreadable", "now": now}
    empty = {"count": 0, "last": None, "stopped": None}
    return {
        **dict.fromkeys(FIELDS),
        **known,
        "heartbeat_nodes": [],
        "heartbeat_ranks": [],
        "exit": [],
        "node_logs": {},
        "requeues": {"count": 0, "without_progress": 0, "stopped": None},
        "requeue_marker": False,
        "rollbacks": empty,
        "unreadable": [why],
    }


def status(args: list[str], as_json: bool) -> int:
    """The command: 0, or ConfigError for input that names no run or one run that cannot be read."""
    from .statustext import render

    runs = targets(args)
    now = time.time()
    facts = []
    for run, why in runs:
        if why is None:
            try:
                facts.append(collect(run, now))
                continue
            except OSError as exc:
                why = _why(exc)
        if len(runs) == 1:
            raise ConfigError(
                f"cannot read the run directory {shown(run)} ({why}): make it readable, or run status as its owner"
            )
        facts.append(unreadable(run, why, now))
    if as_json:
        print(json.dumps({"time": now, "runs": facts}, indent=2, default=str))
    else:
        print(render(facts, now))
    return 0
