"""A hung job becomes a report: which rank is stuck, in which phase, and every live rank's stacks.

Every rank's watchdog (watchdog.py) reads all heartbeats every few seconds. Each carries the rank's
step, phase and how long ago either last changed (progress.py). When a rank's progress is older
than the job's limit, the job is hung:

- the limit is `hang_timeout`, or `hang_timeout_slow` while any rank is in a slow phase (set-up,
  checkpoint, validation, compile, ...), in its first steps (compile warm-up), or has not started
  its heartbeat yet: a rank waiting for a peer that is saving a checkpoint is not hung. Once the run
  has measured its steps, checkpoints and validations, their limits come from those times, with the
  configured values as upper bounds (rundir/hanglimits.py; the watchdog's rank 0 derives them);
- the rank that sees it first writes heartbeat/rank<r>.hang (the report, with the one line);
- every rank that reads a report dumps its Python stacks (and torch's flight recorder) into
  heartbeat/stacks/, waits until every live rank did, records the exit status EXIT_HUNG with the
  line, and exits; the launcher prints the line and stops what is left (a frozen process).

A rank whose heartbeat stopped is told from a live one by its process state, read at every check
(this host only: SIGSTOP or a debugger is certain at once), else by its heartbeat's age: late after
LATE_PERIODS periods. Deciding the moment the limit passes would judge a frozen rank that is not late
yet as live (hang_timeout 10 s against 15 s for lateness), with the same step and phase as the peers
blocked on it (DDP's gradient all-reduce inside backward is no counted collective): "every rank is
stuck". So the verdict waits until every rank either beat after the limit passed (it is live) or is
late (`unsettled`): a live rank beats within a period, a frozen one is late within LATE_PERIODS.

Who is stuck (`name_culprits`): ranks waiting in a collective for a stuck peer are victims, not
culprits. In order: ranks whose heartbeat stopped (their process is frozen: SIGSTOP, a debugger,
a native call holding the GIL); else the ranks behind the others (an older step, or fewer
collectives issued: they have not reached the one the others wait in); else ranks outside a
collective while the others wait in one; else, when all wait in a collective, all of them (the
flight-recorder dumps show which collective never completed); else ranks stuck in their own data
loading; else every rank.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from ...compat import flight_recorder_dumps
from ...errors import EXIT_HUNG
from ...files import write_atomic
from ...rundir.hanglimits import HangLimits, limit_text
from ...rundir.hanglimits import job_limit as shared_job_limit
from ...rundir.heartbeat import process_state, stack_path, stacks_dir, trace_path
from ...rundir.exitstatus import exit_status_path, write_exit_status
from .exitwrite import node_rank

WAIT_PHASES = frozenset({"collective"})  # a rank here may be waiting for a peer
LOCAL_PHASES = frozenset({"data"})  # a rank here waits on no peer: stuck there, it is stuck by itself
LATE_PERIODS = 3  # a heartbeat this many periods old: the rank's threads do not run
STOPPED = frozenset({"T", "t"})  # process states: stopped by a signal, or by a debugger

STATES = {
    "T": "its process is stopped (SIGSTOP or job control)",
    "t": "its process is stopped by a debugger",
    "D": "its process waits in uninterruptible I/O (a hung filesystem or device?)",
    "R": "its process runs but its threads are blocked (a native call holding the GIL?)",
    "S": "its process sleeps but its threads are blocked (a native call holding the GIL?)",
}


def rank_view(info: dict, now: float, period_s: float) -> dict:
    """A rank as the hang detector judges it, from its heartbeat (with `mtime`) at filesystem time `now`:
    its progress age counts on from its last heartbeat, so a frozen rank's grows like the others'. Late
    (its threads do not run): its heartbeat is LATE_PERIODS periods old, or its process on this host is
    stopped (SIGSTOP, a debugger), however young its last heartbeat."""
    beat_age = max(0.0, now - float(info["mtime"]))
    state = process_state(info.get("host"), info.get("pid"))
    late = beat_age > LATE_PERIODS * period_s or state in STOPPED
    return {
        "step": int(info.get("step", 0)),
        "phase": str(info.get("phase", "?")),
        "collectives": int(info.get("collectives", 0)),
        "warmup": bool(info.get("warmup", False)),
        "progress_age_s": round(float(info.get("progress_age_s", 0.0)) + beat_age, 1),
        "beat_age_s": round(beat_age, 1),
        "late": late,
        "state": state,
        "host": info.get("host"),
        "pid": info.get("pid"),
        "node": info.get("node"),
    }


def job_limit(views: dict[int, dict], unstarted: int, limits: HangLimits) -> tuple[float, str]:
    """(seconds, name) the job's ranks may go without progress (rundir/hanglimits.py, job_limit): the
    step's limit, or the longer limit of a phase a rank is in (hang_timeout_slow in warm-up and the slow
    phases; a checkpoint's or a validation's own once measured), hang_timeout_slow while a rank is not yet
    beating (`unstarted`): the others may be waiting for it. A stopped process (SIGSTOP, a debugger) gets
    no such allowance: its last phase no longer runs."""
    running = [(v["phase"], v["warmup"]) for v in views.values() if v["state"] not in STOPPED]
    return shared_job_limit(running, bool(unstarted), limits)


def unsettled(views: dict[int, dict], limit_s: float, period_s: float) -> bool:
    """True while the verdict must wait: a rank that is not late has not beaten since the job passed its
    limit, so it may be frozen (the culprit) or live. A frozen rank stopped before the job's progress
    did, so it never beats after that moment and is late at most LATE_PERIODS periods later; a live one
    beats within a period. Never longer than that past the limit."""
    # A live rank that has not beaten since the newest progress of any rank may have moved on since: its
    # heartbeat still shows the wait it has left (e.g. the others' wait for rank 0's rank-0-only work
    # inside a slow phase, judged against the step's limit once rank 0 left that phase). A frozen rank
    # turns late within LATE_PERIODS periods and is not waited for.
    newest = min(v["progress_age_s"] for v in views.values())
    if any(not v["late"] and v["beat_age_s"] > newest for v in views.values()):
        return True
    excess = max(v["progress_age_s"] for v in views.values()) - limit_s  # how long ago the limit passed
    if excess > LATE_PERIODS * period_s:
        return False
    return any(not v["late"] and v["beat_age_s"] > excess for v in views.values())


def name_culprits(views: dict[int, dict]) -> tuple[list[int], str]:
    """(the stuck ranks, why them): "late", "behind", "outside", "all-collective", "local" or "all"
    (see the module's docstring)."""
    ranks = sorted(views)
    late = [r for r in ranks if views[r]["late"]]
    if late and len(late) < len(ranks):
        return late, "late"
    key = {r: (views[r]["step"], views[r]["collectives"]) for r in ranks}
    lowest = min(key.values())
    behind = [r for r in ranks if key[r] == lowest]
    if len(behind) < len(ranks):
        return behind, "behind"
    waiting = [r for r in ranks if views[r]["phase"] in WAIT_PHASES]
    if waiting and len(waiting) < len(ranks):
        return [r for r in ranks if r not in waiting], "outside"
    if waiting:
        return ranks, "all-collective"
    local = [r for r in ranks if views[r]["phase"] in LOCAL_PHASES]
    if local and len(local) < len(ranks):
        return local, "local"
    return ranks, "all"


def ranks_text(ranks: list[int]) -> str:
    """ "rank 3", "ranks 0-2, 5"."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    spans: list[list[int]] = []
    for r in ranks:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return "ranks " + ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


def _groups(views: dict[int, dict], ranks: list[int]) -> list[tuple[list[int], str, int]]:
    out: dict[tuple[str, int], list[int]] = {}
    for r in sorted(ranks):
        out.setdefault((views[r]["phase"], views[r]["step"]), []).append(r)
    return [(rs, phase, step) for (phase, step), rs in out.items()]


def _detail(views: dict[int, dict], culprits: list[int], why: str) -> str:
    if why == "late":
        v = max((views[r] for r in culprits), key=lambda v: v["beat_age_s"])
        state = STATES.get(v["state"] or "", "its process is gone or on another node")
        return f"not responding since its last heartbeat {v['beat_age_s']:.0f} s ago (its phase and step then), {state}"
    return {
        "behind": "behind the others: it has not reached the step or collective they wait in",
        "outside": "the others wait for it in a collective",
        "all-collective": "every rank waits in a collective that never completed: the flight-recorder dumps "
        "show which one and which rank did not join",
        "local": "stuck in its own data loading while the others wait",
        "all": "every rank is stuck",
    }[why]


def hang_line(views: dict[int, dict], culprits: list[int], why: str, limit: tuple[float, str], stacks: Path) -> str:
    """The one line the launcher prints: who is stuck, in which phase and step, who waits, where the dumps are."""
    groups = _groups(views, culprits)
    if len(groups) == 1:
        who = f"{ranks_text(culprits)} stuck in {groups[0][1]} at step {groups[0][2]}"
    else:
        who = f"{ranks_text(culprits)} stuck (" + "; ".join(
            f"{ranks_text(rs)} in {p} at step {s}" for rs, p, s in groups
        )
        who += ")"
    age = max(views[r]["progress_age_s"] for r in culprits)
    parts = [f"job hung: {who}, no progress for {age:.0f} s ({limit_text(limit)})"]
    if len(views) > 1 or why == "late":
        parts.append(_detail(views, culprits, why))
    others = [r for r in views if r not in culprits]
    if others:
        parts.append(
            "waiting: " + ", ".join(f"{ranks_text(rs)} ({p}, step {s})" for rs, p, s in _groups(views, others))
        )
    parts.append(f"stack dumps: {stacks}")
    parts.append("resume with --resume auto once the cause is fixed")
    return "; ".join(parts)


# ----------------------------------------------------------------------------- dumps


def dump_stacks(run_dir: Path, rank: int, header: str) -> list[Path]:
    """This rank's Python stacks (every thread, faulthandler) into stacks/rank<r>.txt and its flight
    recorder (compat.flight_recorder_dumps) beside it. Returns the files written."""
    stacks_dir(run_dir).mkdir(parents=True, exist_ok=True)
    path = stack_path(run_dir, rank)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # peers wait for the whole file
    names = ", ".join(f"0x{t.ident:016x} {t.name}" for t in threading.enumerate() if t.ident is not None)
    with open(tmp, "w") as f:
        f.write(f"{header}\nthreads: {names}\n\n")
        f.flush()
        faulthandler.dump_traceback(file=f, all_threads=True)
    os.replace(tmp, path)
    files = [path]
    for kind, data in flight_recorder_dumps().items():
        trace = trace_path(run_dir, rank, kind)
        write_atomic(trace, analysable(data))
        files.append(trace)
    return files


def analysable(data: bytes) -> bytes:
    """A flight-recorder dump that torch's analyser (`torchfrtrace`) reads. torch's generic recorder
    (gloo; seen on torch 2.13) records the process group nameless, {"": {"name": "", "desc": "", "ranks"}},
    while its entries name it ("0", "default_pg"): the analyser looks the group up by that name and fails
    (KeyError). When every entry names one group, the record takes that name and description; anything
    else (NCCL's dumps, several groups) is written as torch made it."""
    import pickle

    try:
        dump = pickle.loads(data)
        config = dump["pg_config"]
        groups = {tuple(e["process_group"]) for e in dump["entries"]}
        if list(config) != [""] or len(groups) != 1:
            return data
        ((name, desc),) = groups
        dump["pg_config"] = {str(name): {**config[""], "name": str(name), "desc": str(desc)}}
        return pickle.dumps(dump)
    except Exception:  # not the format this knows: as torch wrote it
        return data


def wait_for_dumps(run_dir: Path, ranks: list[int], since: float, timeout_s: float, poll_s: float = 0.5) -> list[int]:
    """Wait until each of `ranks` has a stack dump written at or after `since` (filesystem clock), at
    most `timeout_s`; returns the ranks still without one."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing = []
        for r in ranks:
            try:
                if stack_path(run_dir, r).stat().st_mtime < since - 1:
                    missing.append(r)
            except OSError:
                missing.append(r)
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(poll_s)


def dumps_since(run_dir: Path, since: float) -> list[str]:
    """The names of the dump files written at or after `since`."""
    try:
        return sorted(p.name for p in stacks_dir(run_dir).iterdir() if p.stat().st_mtime >= since - 1)
    except OSError:
        return []


def record_hang_exit(run_dir: Path, message: str) -> None:
    """Every rank that stops for a hang records it for its node (the same line on every rank; the file
    is replaced atomically): the node's local rank 0 may be the frozen one."""
    path = exit_status_path(run_dir, node_rank())
    try:
        write_exit_status(path, EXIT_HUNG, message)
    except OSError as exc:
        print(f"warning: cannot record the exit status in {path}: {exc.strerror or exc}", file=sys.stderr, flush=True)


def end_hung_job(run_dir: Path, rank: int) -> Callable[[dict, bool], None]:
    """What a rank does once every live rank dumped: the deciding rank says why on stderr, every rank
    records the exit status and exits at once (no waiting on collectives, no cleanup)."""

    def _end(report: dict, decided: bool) -> None:
        line = str(report.get("line", "job hung"))
        if decided:
            missing = report.get("missing") or []
            note = f" (no stack dump from {ranks_text(missing)})" if missing else ""
            sys.stderr.write(f"[rank {rank}] error: {line}{note}\n")
            sys.stderr.flush()
        record_hang_exit(run_dir, line)
        os._exit(EXIT_HUNG)

    return _end
