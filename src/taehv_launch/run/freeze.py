"""The launcher's watch over its node's ranks while the launch runs (a thread of taehv-launch, which stays
alive beside the trainer on every node).

- A hang the trainer reported (EXIT_HUNG recorded: every live rank dumped its stacks and exits,
  train/durability/hang.py): after HANG_GRACE_S what is left (a frozen rank, torchrun's agent waiting
  for it) is killed.
- A rank that stopped answering: the trainer's hang detector is a thread of each rank, so a frozen
  process (SIGSTOP, a debugger, a native call holding the GIL) reports nothing itself, and in a 1-process
  job, or when every rank of the job is frozen, nobody else would. With hang_timeout on, a rank of this
  node whose process is stopped, or whose heartbeat is older than SILENT_S (its threads do not run), and
  whose progress is older than the job's hang limit (rundir/heartbeat.silence_limit: the configured
  values, or those derived from this launch's times in <run>/hang_limits.json, rundir/hanglimits.py) is
  reported here, unless a hang report or an exit status already exists (then the trainer reports: no
  second report). A live rank on this host reports a
  frozen peer itself, so while there is one the launcher waits PEER_GRACE_S longer. The report is the
  trainer's: heartbeat/rank<r>.hang (the other ranks of the job, on every node, read it, dump their
  stacks and stop with 76), exit status 76 with the one line, then every process of the launch is
  killed. A stopped process cannot dump its own stacks (the line says so); a running one whose threads
  are blocked is sent STACKS_SIGNAL first, and its faulthandler prints every thread's Python stack into
  the launch log.

Which records are this attempt's (run/launch.py passes the attempt's number, `attempt`; the launcher's
launch id is TAEHV_LAUNCH_ID, rundir/launchid.py): never by a file's time (its time only measures a beat's
age), by the ids its trainer stamps: a heartbeat of this node's ranks carries this launcher's launch id and
this attempt's number. Another node's ranks (they count for the job's limit and as live peers) carry their
own launcher's id: one of those counts when its attempt is this attempt's and its id is one of
progress.json's "launch_ids" (every node's launcher's, gathered by the trainer's first collective,
train/loop/stragglers.py) while progress.json is this attempt's (its "attempt", with this launcher's id
among its "launch_ids"). Until it is (the trainer's first log line of the attempt) no other node's rank
counts: the job's limit is then hang_timeout_slow (fewer than `world` ranks have a heartbeat), so a frozen
rank is reported later, never earlier, and another node's hang report is not seen yet (this watch may
then report its own frozen rank beside it: the ranks stop with 76 either way). hang_limits.json (rank 0's,
node 0's launch id) and the hang reports (a rank's, or a launcher's: it writes its attempt's number into
its own) are told by the same rule. Without an attempt number or a launch id (a caller that passes none:
the trainer's records then carry none) the watch falls back to the file's time: written at or after its
start.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Callable

from ..errors import EXIT_HUNG
from ..files import read_json_or_none
from ..rundir.hanglimits import HangLimits, clean_measured, hang_limits_path, limit_text, read_hang_limits
from ..rundir.heartbeat import (
    HANG_SUFFIX,
    HEARTBEAT_PERIOD_S,
    SILENT_S,
    STACKS_SIGNAL,
    STOPPED,
    heartbeat_path,
    process_state,
    read_hang_reports,
    read_heartbeats,
    silence_limit,
    stacks_dir,
    write_heartbeat,
)
from ..rundir.launchid import ATTEMPT, launch_id, valid, valid_attempt, written_by
from ..rundir.layout import trainer_lock_path
from ..rundir.progress import PROGRESS_FILE
from ..rundir.records import LONGEST_S, number
from ..rundir.exitstatus import write_exit_status

POLL_S = 1.0
HANG_GRACE_S = 10.0  # after the trainer recorded a hang: the ranks have dumped their stacks and are exiting
PEER_GRACE_S = 2 * HEARTBEAT_PERIOD_S  # a live rank on this host reports a frozen peer first: its watchdog ticks
DUMP_WAIT_S = 2.0  # for STACKS_SIGNAL's output to reach the launch log before the kill

STATES = {
    "T": "its process is stopped (SIGSTOP or job control)",
    "t": "its process is stopped by a debugger",
    "D": "its process waits in uninterruptible I/O (a hung filesystem or device?)",
    "R": "its process runs but its threads are blocked (a native call holding the GIL?)",
    "S": "its process sleeps but its threads are blocked (a native call holding the GIL?)",
}


def recorded_code(path: Path) -> int | None:
    """The exit code the trainer (or the launcher) recorded in the exit status file, or None."""
    try:
        return int(json.loads(path.read_text() or "{}").get("code", 1))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def ranks_text(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def freeze_line(frozen: dict[int, dict], limit: tuple[float, str], node: int, stacks: Path) -> str:
    """The one line, as the trainer's (train/durability/hang.py hang_line) words it, for ranks found
    silent by the launcher: who, where they stopped, for how long, why no stack dump."""
    ranks = sorted(frozen)
    where = {(v["phase"], v["step"]) for v in frozen.values()}
    if len(where) == 1:
        phase, step = where.pop()
        who = f"{ranks_text(ranks)} stuck in {phase} at step {step}"
    else:
        who = (
            f"{ranks_text(ranks)} stuck ("
            + "; ".join(f"rank {r} in {frozen[r]['phase']} at step {frozen[r]['step']}" for r in ranks)
            + ")"
        )
    age = max(v["progress_age_s"] for v in frozen.values())
    beat = max(v["beat_age_s"] for v in frozen.values())
    states = "; ".join(dict.fromkeys(STATES.get(v["state"], "its process does not answer") for v in frozen.values()))
    stopped = [r for r in ranks if frozen[r]["state"] in STOPPED]
    asked = [r for r in ranks if r not in stopped]
    dumps = f"stack dumps: {stacks}"
    if stopped:
        dumps += f" (none from {ranks_text(stopped)}: a stopped process cannot dump its own stacks)"
    if asked:
        dumps += f"; {ranks_text(asked)}: Python stacks in the launch log"
    parts = [
        f"job hung: {who}, no progress for {age:.0f} s ({limit_text(limit)})",
        f"not responding since its last heartbeat {beat:.0f} s ago (its phase and step then), {states}",
        f"found by taehv-launch on node {node}: the rank's own hang detector does not run",
        dumps,
        "resume with --resume auto once the cause is fixed",
    ]
    return "; ".join(parts)


class NodeWatch:
    """Started (`start()`) with the launch, ended (`end()`) once it has exited. `kill()` kills every
    process of the launch; `note(text)` writes a line into the launch log. `attempt`: the attempt's number
    in the launch (the restarts so far): its records are told by it and the launch ids (`ours`); None: by
    the file's time, at or after its start (`started`, the filesystem's time)."""

    def __init__(
        self,
        run_dir: Path,
        node: int,
        world: int,
        exit_file: Path,
        kill: Callable[[], None],
        note: Callable[[str], None],
        hang_timeout: float = 0.0,
        hang_timeout_slow: float = 0.0,
        poll_s: float = POLL_S,
        attempt: int | None = None,
    ) -> None:
        self.run_dir, self.node, self.world, self.exit_file = Path(run_dir), node, world, exit_file
        self.kill, self.note, self.poll_s = kill, note, poll_s
        self.hang_timeout, self.slow = float(hang_timeout or 0), float(hang_timeout_slow or 0)
        self.clock = trainer_lock_path(self.run_dir, node)  # touched for the filesystem's time
        self.started = self.fs_now()
        self.attempt = valid_attempt(attempt)
        self.launch = launch_id() if self.attempt is not None else None  # None: told by the file's time
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._run, name="taehv-node-watch", daemon=True)

    def start(self) -> "NodeWatch":
        self._thread.start()
        return self

    def end(self) -> None:
        self._ended.set()
        self._thread.join(timeout=DUMP_WAIT_S + 5)

    def fs_now(self) -> float:
        """The filesystem's time, as the heartbeats' mtimes are (NFS stamps them with the server's clock)."""
        try:
            os.utime(self.clock)
            return self.clock.stat().st_mtime
        except OSError:
            return time.time()

    def _run(self) -> None:
        while not self._ended.wait(self.poll_s):
            code = recorded_code(self.exit_file)
            if code == EXIT_HUNG:
                self._end_hung()
                return
            if code is None and self.hang_timeout > 0:
                try:
                    found = self.find_frozen()
                except (OSError, ValueError, TypeError):  # a file mid-write or gone: the next poll
                    continue
                if found:
                    self._report(*found)
                    return

    def _end_hung(self) -> None:
        if self._ended.wait(HANG_GRACE_S):
            return
        self.note(
            f"taehv-launch: the trainer reported a hang; stopping the processes still running after {HANG_GRACE_S:g} s"
        )
        self.kill()

    def linked(self) -> set[str]:
        """Every node's launcher's launch id of this launch, from progress.json when this attempt wrote it
        (its attempt, this launcher's id among its "launch_ids"); else none."""
        rec = read_json_or_none(self.run_dir / PROGRESS_FILE)
        if not isinstance(rec, dict) or valid_attempt(rec.get(ATTEMPT)) != self.attempt:
            return set()
        got = rec.get("launch_ids")
        ids = {x for x in map(valid, got) if x is not None} if isinstance(got, list) else set()
        return ids if self.launch in ids else set()

    def ours(self) -> Callable[[object, float], bool]:
        """For one poll: whether a record (as read) of a file of that mtime is this attempt's."""
        if self.launch is None:
            since = self.started - 1
            return lambda record, mtime: mtime >= since
        ids = {self.launch} | self.linked()
        return lambda record, mtime: written_by(record, self.attempt, ids)

    def limits(self, ours: Callable[[object, float], bool]) -> HangLimits:
        """The configured limits, with hang_limits.json's measured times when it is this attempt's."""
        if self.launch is None:
            return read_hang_limits(self.run_dir, self.started - 1, self.hang_timeout, self.slow)
        record = read_json_or_none(hang_limits_path(self.run_dir)) if self.hang_timeout else None
        if not ours(record, 0.0):
            return HangLimits(self.hang_timeout, self.slow)
        return HangLimits(self.hang_timeout, self.slow, clean_measured(record.get("measured")))

    def find_frozen(self) -> tuple[dict[int, dict], tuple[float, str]] | None:
        """(this node's silent ranks past the limit, the limit), or None: nothing to report (yet), or
        the trainer has reported or recorded an exit itself."""
        now, here, ours = self.fs_now(), socket.gethostname(), self.ours()
        beats = {}
        for rank, hb in read_heartbeats(self.run_dir).items():
            if ours(hb, hb["mtime"]) and not heartbeat_path(self.run_dir, rank, ".done").exists():
                beats[rank] = hb
                hb["beat_age_s"] = now - hb["mtime"]
                hb["state"] = process_state(hb.get("host"), hb.get("pid"), hb.get("pidns"))  # None elsewhere
                hb["silent"] = hb["beat_age_s"] > SILENT_S or hb["state"] in STOPPED
        peers_here = any(not hb["silent"] and hb.get("host") == here for hb in beats.values())
        limit = silence_limit(list(beats.values()), self.limits(ours), self.world)
        frozen = {}
        for rank, hb in beats.items():
            if hb.get("node") != self.node or hb.get("host") != here or not hb["silent"]:
                continue
            if hb["state"] is None:
                continue  # gone: accelerate or torchrun sees its exit
            age = (number(hb.get("progress_age_s"), LONGEST_S) or 0.0) + hb["beat_age_s"]
            if age > limit[0] + (PEER_GRACE_S if peers_here else 0.0):
                frozen[rank] = {
                    "step": hb.get("step") if isinstance(hb.get("step"), int) else "?",
                    "phase": hb.get("phase") if isinstance(hb.get("phase"), str) else "?",
                    "progress_age_s": round(age, 1),
                    "beat_age_s": round(hb["beat_age_s"], 1),
                    "state": hb["state"],
                    "pid": hb.get("pid"),
                    "host": here,
                    "node": self.node,
                }
        if not frozen or recorded_code(self.exit_file):
            return None
        if any(ours(r, r["mtime"]) for r in read_hang_reports(self.run_dir).values()):
            return None
        return frozen, limit

    def _report(self, frozen: dict[int, dict], limit: tuple[float, str]) -> None:
        line = freeze_line(frozen, limit, self.node, stacks_dir(self.run_dir))
        asked = False
        for v in frozen.values():
            if v["state"] not in STOPPED and isinstance(v["pid"], int):
                try:
                    os.kill(v["pid"], STACKS_SIGNAL)
                    asked = True
                except (ProcessLookupError, PermissionError):
                    pass
        report = {
            "line": line,
            "by": f"taehv-launch node {self.node}",
            "culprits": sorted(frozen),
            "why": "late",
            "limit_s": limit[0],
            "ranks": {str(r): v for r, v in frozen.items()},
            "dumps": [],
            "missing": sorted(frozen),
            "time": time.time(),
        } | ({ATTEMPT: self.attempt} if self.attempt is not None else {})  # stamped() adds the launch id
        culprit = min(frozen)
        try:  # the other ranks of the job (every node) read it, dump their stacks and stop with 76
            stacks_dir(self.run_dir).mkdir(parents=True, exist_ok=True)
            write_heartbeat(heartbeat_path(self.run_dir, culprit, HANG_SUFFIX), report)
        except OSError as exc:
            self.note(f"taehv-launch: warning: cannot write the hang report: {exc.strerror or exc}")
        try:
            write_exit_status(self.exit_file, EXIT_HUNG, line)
        except OSError as exc:
            self.note(f"taehv-launch: warning: cannot record the exit status: {exc.strerror or exc}")
        self.note(
            f"taehv-launch: {ranks_text(sorted(frozen))} stopped answering; reporting the hang and stopping the job"
        )
        if asked:
            self._ended.wait(DUMP_WAIT_S)
        self.kill()
