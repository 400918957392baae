"""The heartbeat files every trainer rank keeps in <run>/heartbeat/ (written by
train/durability/watchdog.py, read by the peers' watchdogs and by `taehv-launch status`).

rank<r>       JSON, rewritten every few seconds by a background thread:
              {"rank", "node", "host", "pid", "pidns", "step", "phase", "progress_age_s", "collectives",
               "warmup", "times", "time"}
              `pidns` where `pid` can be looked up ("<kernel boot id>/<PID namespace>", or null: the
              trainer's watchdog reads a peer's process state only when it is its own)
              `step` is the last finished optimizer step, `phase` what the rank does now (data,
              forward, backward, collective, checkpoint, validation, compile, setup, ...),
              `progress_age_s` how long ago the step or phase last changed, `collectives` how many
              collectives the rank has issued (those the trainer counts: a rank with fewer than its
              peers has not reached the one they wait in), `warmup` true during the first steps of
              the process (compile warm-up), `times` the rank's measured times once known
              ({"step_s", "steps", "checkpoint_s", "validation_s"}, null until measured: the hang
              limits derived from them are in <run>/hang_limits.json, rundir/hanglimits.py), `time`
              the writer's clock, `launch_id` the launch (rundir/launchid.py).
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
(live ranks that left no stack dump), "time", "launch_id". A report written by a node's launcher (run/freeze.py:
the rank's own watchdog no longer runs) has "by": "taehv-launch node <k>".

A rank whose heartbeat is older than SILENT_S does not run its threads (frozen: SIGSTOP, a debugger, a
native call holding the GIL). Past its hang limit (`silence_limit`: the configured values, or those
derived from the run's times, rundir/hanglimits.py) the node's launcher reports it and `taehv-launch
status` says the run is hung.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
from pathlib import Path

from ..files import read_json, write_atomic
from .hanglimits import SLOW_PHASES as SLOW_PHASES
from .hanglimits import HangLimits, job_limit, limits_summary, read_hang_limits
from .launches import ThisLaunch, since_ok
from .launchid import stamped
from .progress import read_text_part
from .records import LONGEST_S, Field, Number, Record, Text, Whole

HEARTBEAT_DIR = "heartbeat"
STACKS_DIR = "stacks"
HANG_SUFFIX = ".hang"
TIMEOUT_DUMP_PREFIX = "nccl_trace_rank_"  # torch appends the global rank
HEARTBEAT_LIMIT = 1 << 20  # bytes: a heartbeat is a few hundred, a hang report a few thousand
HEARTBEAT_PERIOD_S = 5.0  # how often a rank rewrites its heartbeat (train/durability/watchdog.py's period_s)
SILENT_S = 3 * HEARTBEAT_PERIOD_S  # a heartbeat this old: the rank's threads do not run
STOPPED = frozenset({"T", "t"})  # process states: stopped by a signal, or by a debugger
STACKS_SIGNAL = signal.SIGRTMIN + 2  # a rank's faulthandler prints its Python stacks on it (train/main.py)


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


def write_heartbeat(path: Path, info: dict) -> None:
    """A rank's heartbeat (rank<r>) or hang report (rank<r>.hang), replaced atomically; OSError is the caller's."""
    write_atomic(path, json.dumps(stamped(info)))


def read_heartbeat(path: Path) -> dict | None:
    """One rank's heartbeat with `mtime` added (the filesystem's clock), or None when absent, mid-write
    or no JSON object (a FIFO, a huge file, deep nesting: files.read_json). The fields are as written:
    their readers check the types they use."""
    try:
        info = read_json(path, dict, HEARTBEAT_LIMIT)
        info["mtime"] = path.stat().st_mtime
    except (OSError, ValueError):
        return None
    return info


def _rank_files(run_dir: Path, pattern: str) -> list[Path]:
    """The heartbeat folder's files matching pattern; [] when there is no folder or it cannot be read."""
    folder = heartbeat_dir(run_dir)
    try:
        return list(folder.glob(pattern)) if folder.is_dir() else []
    except OSError:
        return []


def read_heartbeats(run_dir: Path) -> dict[int, dict]:
    """rank -> heartbeat (see read_heartbeat) for every rank<r> file in the run's heartbeat folder."""
    out: dict[int, dict] = {}
    for path in _rank_files(run_dir, "rank*"):
        if path.name[4:].isdigit() and (info := read_heartbeat(path)) is not None:
            out[int(path.name[4:])] = info
    return out


def read_hang_reports(run_dir: Path, since: ThisLaunch | float | None = None) -> dict[int, dict]:
    """rank -> hang report (with `mtime` added) of every rank<r>.hang of this launch (`since`:
    ThisLaunch, or written at or after this time by the filesystem's clock; None: all, including an
    earlier launch's; rundir/launches.since_ok)."""
    out: dict[int, dict] = {}
    for path in _rank_files(run_dir, f"rank*{HANG_SUFFIX}"):
        rank = path.name[4 : -len(HANG_SUFFIX)]
        if rank.isdigit() and (report := read_heartbeat(path)) is not None and since_ok(since, report, report["mtime"]):
            out[int(rank)] = report
    return out


@functools.cache  # fixed for a process's life: read /proc once, not at every process_state of a poll
def pid_namespace() -> str | None:
    """Where this process's pid can be looked up: "<kernel boot id>/<PID namespace>" (the namespace's number
    repeats across machines, the boot id does not), or None where /proc does not say (no peer's pid is then
    looked up by it). Every heartbeat records its writer's as "pidns"."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}" if boot else None
    except OSError:
        return None


def process_state(host: object, pid: object, pidns: object = None) -> str | None:
    """The state letter of process `pid` if it runs on this host (R, S, D, T stopped, t traced, ...),
    "?" when it exists but its state is unreadable, None when it does not exist here (gone, a zombie,
    or on another host: then nothing can be told). `pidns`: the writer's pid_namespace() when its record
    says it: a pid of another namespace (a container with our hostname) is not looked up here either."""
    if host != socket.gethostname() or not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    if isinstance(pidns, str) and pidns != pid_namespace():
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        state = stat[stat.rindex(")") + 2]
        return None if state in "ZX" else state
    except FileNotFoundError:
        return None
    except (OSError, ValueError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "?"


def silence_limit(beats: list[dict], limits: HangLimits, world: int | None = None) -> tuple[float, str]:
    """(seconds, name) a rank whose heartbeat stopped may go without progress, as the trainer's hang
    detector judges the job (train/durability/hang.py, job_limit; rundir/hanglimits.py): the longest of
    the step's limit and those of the phases its ranks are in (hang_timeout_slow for warm-up and the slow
    phases without a limit of their own), hang_timeout_slow while fewer than `world` ranks have a heartbeat.
    `beats`: this launch's heartbeats, with "state" (process_state) where known: a stopped process gets no
    allowance for its own last phase, which no longer runs."""
    running = [(hb.get("phase"), hb.get("warmup")) for hb in beats if hb.get("state") not in STOPPED]
    return job_limit(running, world is not None and len(beats) < world, limits)


HEARTBEAT = Record(  # what `status` shows of a heartbeat (the watchdogs read theirs as written)
    "heartbeat",
    (
        Field("node", Whole(None)),
        Field("host", Text()),
        Field("step", Whole()),
        Field("phase", Text()),
        Field("progress_age_s", Number(high=LONGEST_S)),
    ),
)


def rank_rows(
    run_dir: Path,
    now: float,
    live_s: float,
    launch: ThisLaunch | None = None,
    limits: tuple[float, float] | None = None,
) -> list[dict]:
    """One row a rank for `taehv-launch status`, its fields checked (a field of another type than the
    writer's reads as None): rank, node, host, step, phase, age_s (of the file), stale (older than
    live_s), progress_age_s, done, dead (the .dead marker's first line), limit_s and not_responding (with
    the run's `limits` = (hang_timeout, hang_timeout_slow), hang_timeout not 0: the job's hang limit, and
    whether the rank's heartbeat is older than it while its process is stopped or its heartbeat older
    than SILENT_S, and it is neither done nor dead nor a process known to be gone from this host),
    hang_limits (the limits derived from this launch's times, the same on every row, or None:
    {"step_s", "checkpoint_s", "validation_s", "measured", "text"}, rundir/hanglimits.py).
    Heartbeats of another launch than `launch` (an earlier one's) are left out."""
    beats = {r: hb for r, hb in read_heartbeats(run_dir).items() if launch is None or launch.holds(hb, hb["mtime"])}
    done = {r for r in beats if heartbeat_path(run_dir, r, ".done").exists()}
    limit, here, derived = None, socket.gethostname(), None
    if limits and limits[0] > 0:
        for hb in beats.values():  # a process on this host: its state; elsewhere, or fresh: "?" (unknown)
            late = now - hb["mtime"] > SILENT_S or hb.get("host") == here
            hb["state"] = process_state(hb.get("host"), hb.get("pid"), hb.get("pidns")) if late else "?"
        judged = read_hang_limits(run_dir, launch, *limits)
        limit = silence_limit([hb for r, hb in beats.items() if r not in done], judged)[0]
        if any(v is not None for v in judged.measured.values()):
            derived = {f"{k}_s": judged.limit(k)[0] for k in ("step", "checkpoint", "validation")}
            derived |= {"measured": dict(judged.measured), "text": limits_summary(judged)}
    rows = []
    for rank, hb in sorted(beats.items()):
        dead = heartbeat_path(run_dir, rank, ".dead")
        try:
            why = (read_text_part(dead, 4096, tail=False).strip().splitlines() or ["?"])[0] if dead.exists() else None
        except OSError:
            why = "?"
        shown = HEARTBEAT.parse(hb).record  # every field optional: a dict
        beat_age = now - hb["mtime"]
        gone = hb.get("host") == here and hb.get("state", "?") is None  # its process is no longer on this host
        rows.append(
            {
                "rank": rank,
                "node": shown["node"],
                "host": shown["host"],
                "step": shown["step"],
                "phase": shown["phase"],
                "age_s": beat_age,
                "stale": beat_age > live_s,
                "progress_age_s": shown["progress_age_s"],
                "done": rank in done,
                "dead": why,
                "limit_s": limit,
                "hang_limits": derived,
                "not_responding": limit is not None
                and beat_age > limit
                and (beat_age > SILENT_S or hb.get("state") in STOPPED)
                and not (rank in done or why or gone),
            }
        )
    return rows


def node_rows(ranks: list[dict]) -> list[dict]:
    """rank_rows() grouped by node: node, host (every host its ranks named; None when none did), ranks,
    newest_age_s, oldest_age_s."""
    nodes: dict[int | None, dict] = {}
    for r in ranks:
        n = nodes.setdefault(r["node"], {"node": r["node"], "hosts": [], "ranks": [], "ages": []})
        n["ranks"].append(r["rank"])
        n["ages"].append(r["age_s"])
        if r["host"] not in n["hosts"]:
            n["hosts"].append(r["host"])
    return [
        {
            "node": n["node"],
            "host": ", ".join(str(h) for h in n["hosts"] if h is not None) or None,
            "ranks": n["ranks"],
            "newest_age_s": min(n["ages"]),
            "oldest_age_s": max(n["ages"]),
        }
        for n in sorted(nodes.values(), key=lambda n: (n["node"] is None, n["node"] or 0))
    ]
