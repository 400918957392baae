"""Take the whole job down within a minute when one rank dies, instead of hanging until the
process-group timeout (up to 4 hours on 8+ nodes).

Every rank keeps a heartbeat file in <run>/heartbeat/ fresh from a background thread and
watches the others'. A peer whose heartbeat is older than `stale_s`, or that left a `.dead`
marker (an exception in that rank), makes this rank record why and exit at once. torchrun
already tears down a node whose local worker died; this covers the ranks on the *other*
nodes, which would otherwise wait in a collective. Needs the run directory on a filesystem
every node sees (as checkpoints do). A peer that finished cleanly leaves a `.done` marker.

Ages are measured on the filesystem's clock, not this node's: "now" is the modification time of
this rank's own heartbeat, just rewritten on the same filesystem. A shared filesystem whose server
clock is off from a node's (NFS stamps writes with the server's time) would otherwise make that
node see every peer as stale, or never stale.

Hangs (hang.py): the heartbeat also carries this rank's step, phase and progress age (progress.py).
With `hang_timeout` set, every tick first looks for a hang: a rank with no progress for the job's
limit, or another rank's hang report; then every live rank dumps its stacks and the job stops with
EXIT_HUNG. A stale heartbeat whose process still exists on this host (frozen: SIGSTOP, a debugger, a
native call holding the GIL) is not a dead peer: the hang detector reports it, with its last step and
phase, once the limit passes. A rank whose process is gone from this host is dead, not hung, even
when the hang limit (from the run's times: 30 s at least) passes before `stale_s`: it is reported as
stopped responding. On another host a silent rank cannot be told from a dead one: it is reported as
stopped responding after `stale_s`, or as hung when the hang limit passes first.

Whose pid can be looked up: a peer's pid means something here only in our own PID namespace on our own
kernel. The hostname does not tell: containers on one machine (or pods given the same name) each have a PID
namespace of their own, where a peer's pid is another process here or none. So each heartbeat carries
"pidns" (`pid_namespace`: the kernel's boot id and the PID namespace), and a peer's process state is read only
when its "pidns" is ours; any other peer is judged as one on another host, by its heartbeat alone. And a
process found gone holds the hang verdict back (a dead peer: _problem reports it) only once its heartbeat is
late too: a rank that still beats is alive, whatever a pid lookup says.

Hang limits from the run's times (rundir/hanglimits.py): each heartbeat carries its rank's measured
times; rank 0's watchdog combines them once every rank has them, writes <run>/hang_limits.json and
prints the limits (a line each time one more limit is derived: step, checkpoint, validation); every
rank's watchdog judges with the limits of that file (written by this launch), else the configured ones.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from ...errors import EXIT_FAILED, LaunchError
from ...files import disk_error_message
from ...rundir.hanglimits import KINDS, HangLimits, combine, derived_line, hang_limits_path, read_hang_limits
from ...rundir.hanglimits import write_hang_limits
from ...rundir.heartbeat import HANG_SUFFIX, pid_namespace, read_heartbeat, read_hang_reports, stacks_dir
from ...rundir.heartbeat import write_heartbeat
from .hang import dump_stacks, dumps_since, hang_line, job_limit, name_culprits, process_state, rank_view
from .hang import unsettled, wait_for_dumps
from .progress import PROGRESS, Progress


class Watchdog:
    def __init__(
        self,
        run_dir: Path,
        rank: int,
        world: int,
        node: int,
        on_dead: Callable[[str], None],
        period_s: float = 5.0,
        stale_s: float = 30.0,
        *,
        hang_timeout: float = 0.0,
        hang_timeout_slow: float = 0.0,
        on_hang: Callable[[dict, bool], None] | None = None,
        progress: Progress = PROGRESS,
        note: Callable[[str], None] | None = None,
    ):
        self.run_dir, self.dir = run_dir, run_dir / "heartbeat"
        self.rank, self.world, self.node = rank, world, node
        self.period_s, self.stale_s, self.on_dead = period_s, stale_s, on_dead
        self.hang_timeout = hang_timeout if on_hang is not None else 0.0  # 0: no hang detection
        self.hang_timeout_slow, self.on_hang, self.progress = hang_timeout_slow, on_hang, progress
        self.limits = HangLimits(self.hang_timeout, hang_timeout_slow)  # the configured ones until measured
        self.note = note or (lambda line: print(line, flush=True))  # rank 0: the derived limits' line
        self._warned = False  # rank 0 said it cannot write the limits' file
        self.pid, self.pidns = os.getpid(), pid_namespace()
        self.started = time.time()
        self.hanging = threading.Event()  # set while this rank reports a hang (it then ends the process)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="taehv-watchdog", daemon=True)

    def _path(self, rank: int, suffix: str = "") -> Path:
        return self.dir / f"rank{rank}{suffix}"

    @property
    def active(self) -> bool:
        """Several ranks (dead peers), or the hang detector on (one rank can hang too)."""
        return self.world > 1 or self.hang_timeout > 0

    def start(self) -> "Watchdog":
        if not self.active:
            return self
        try:
            self._prepare()
        except OSError as exc:
            raise LaunchError(setup_problem(self.run_dir, exc)) from None
        self.started = self._fs_now()
        if self.hang_timeout:
            self.progress.watch_compiles()
        self._thread.start()
        return self

    def _prepare(self) -> None:
        """The heartbeat folder (and stacks/), this rank's markers of an earlier launch removed, the first beat."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.hang_timeout:
            stacks_dir(self.run_dir).mkdir(exist_ok=True)  # also where torch dumps at the NCCL timeout
            if self.rank == 0:  # an earlier launch's limits: this one measures itself again
                hang_limits_path(self.run_dir).unlink(missing_ok=True)
        for suffix in ("", ".dead", ".done", HANG_SUFFIX):
            self._path(self.rank, suffix).unlink(missing_ok=True)
        self._beat()

    def _beat(self) -> None:
        info = {"rank": self.rank, "node": self.node, "host": socket.gethostname(), "pid": self.pid}
        info["pidns"] = self.pidns
        info |= {**self.progress.snapshot(), "time": round(time.time(), 3)}
        write_heartbeat(self._path(self.rank), info)

    def _fs_now(self) -> float:
        """The filesystem's time: the mtime of our own heartbeat (rewritten every period_s)."""
        try:
            return self._path(self.rank).stat().st_mtime
        except OSError:
            return time.time()

    def _problem(self, peer: int, now: float) -> str | None:
        if self._path(peer, ".done").exists():
            return None
        dead = self._path(peer, ".dead")
        if dead.exists() and dead.stat().st_mtime >= self.started - 1:
            return f"rank {peer} failed: {dead.read_text(errors='replace').strip()[:300]}"
        beat = self._path(peer)
        try:
            mtime = beat.stat().st_mtime
            info = json.loads(beat.read_text())
        except (OSError, ValueError):
            return None  # not started yet, or mid-replace
        if mtime < self.started - 1:
            return None  # left over from an earlier launch of this run
        age = now - mtime
        if age > self.stale_s:
            if self.hang_timeout and self._state(info) is not None:
                return None  # frozen, not dead (its process exists, in our PID namespace): the hang detector judges it
            return (
                f"rank {peer} (node {info.get('node')}, host {info.get('host')}, pid {info.get('pid')}) "
                f"stopped responding {age:.0f} s ago (killed, out of memory, or hung)"
            )
        return None

    def _any_problem(self) -> str | None:
        now = self._fs_now()
        return next(
            (why for peer in range(self.world) if peer != self.rank and (why := self._problem(peer, now))), None
        )

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self._beat()
                self._update_limits()
                if report := self.find_hang():
                    self._respond(report)
                    return
                if why := self._any_problem():
                    self.on_dead(why)
                    return
            except (OSError, ValueError, TypeError, KeyError):  # a file mid-write or gone: the next tick
                continue

    # ------------------------------------------------------------------ hangs (hang.py)
    def _update_limits(self) -> None:
        """Rank 0 derives the limits still missing from every rank's measured times; every rank then
        judges with those of this launch's <run>/hang_limits.json."""
        if not self.hang_timeout:
            return
        if self.rank == 0 and any(self.limits.measured.get(f"{k}_s") is None for k in KINDS):
            try:
                self._derive()
            except OSError as exc:  # the next tick tries again; the configured limits hold meanwhile
                if not self._warned:
                    self._warned = True
                    sys.stderr.write(
                        f"[rank 0] warning: cannot write {hang_limits_path(self.run_dir)}: {exc.strerror or exc}; "
                        "the configured hang limits hold\n"
                    )
        self.limits = read_hang_limits(self.run_dir, self.started - 1, self.hang_timeout, self.hang_timeout_slow)

    def _derive(self) -> None:
        beats = [read_heartbeat(self._path(r)) for r in range(self.world)]
        times = [b.get("times") for b in beats if b is not None and b["mtime"] >= self.started - 1]
        found = combine(times, self.world)
        known = {k: v for k, v in self.limits.measured.items() if v is not None}  # derived once, kept
        measured = {**found, **known}
        if measured == dict(self.limits.measured) or all(v is None for v in measured.values()):
            return
        limits = HangLimits(self.hang_timeout, self.hang_timeout_slow, measured)
        write_hang_limits(self.run_dir, limits)
        self.limits = limits
        self.note(derived_line(limits, self.run_dir))

    def _views(self, now: float) -> tuple[dict[int, dict], int]:
        """Each running rank of this launch as the hang detector sees it, and how many have not beaten yet."""
        views, unstarted = {}, 0
        for r in range(self.world):
            if self._path(r, ".done").exists():
                continue
            info = read_heartbeat(self._path(r))
            if info is None or info["mtime"] < self.started - 1:
                unstarted += 1
            else:
                views[r] = self._view(info, now)
        return views, unstarted

    def _pid_here(self, info: dict) -> bool:
        """Whether the peer's pid is one of our PID namespace (see the module's docstring)."""
        return self.pidns is not None and info.get("pidns") == self.pidns

    def _seen(self, info: dict) -> dict:
        """The heartbeat as process_state should see it: the pid of our namespace looked up here, whatever the
        hostname; any other pid not at all (host None: as a rank on another host)."""
        return {**info, "host": socket.gethostname() if self._pid_here(info) else None}

    def _state(self, info: dict) -> str | None:
        return process_state(self._seen(info).get("host"), info.get("pid"))

    def _view(self, info: dict, now: float) -> dict:
        """rank_view with the process state of a pid of our namespace only ("pid_here"); any other rank is judged
        as one on another host: state None, late by its heartbeat's age alone."""
        view = rank_view(self._seen(info), now, self.period_s)
        return view | {"host": info.get("host"), "pid_here": self._pid_here(info)}

    def find_hang(self) -> dict | None:
        """A hang report to act on: the first rank's report of this launch, or a new one of ours when a
        rank made no progress for the job's limit (written to rank<r>.hang); None while the job moves."""
        if not self.hang_timeout:
            return None
        if reports := read_hang_reports(self.run_dir, since=self.started - 1):
            return reports[min(reports)]
        now = self._fs_now()
        views, unstarted = self._views(now)
        limit = job_limit(views, unstarted, self.limits)
        if not views or all(v["progress_age_s"] <= limit[0] for v in views.values()):
            return None
        if unsettled(views, limit[0], self.period_s):
            return None  # a rank has not beaten since: frozen (the culprit) or live? a later tick knows
        if any(v["pid_here"] and v["state"] is None and v["late"] for v in views.values()):
            return None  # a rank's process is gone and its heartbeat stopped: a dead peer (_problem, within stale_s)
        culprits, why = name_culprits(views)
        report = {
            "line": hang_line(views, culprits, why, limit, stacks_dir(self.run_dir)),
            "by": self.rank,
            "culprits": culprits,
            "why": why,
            "limit_s": limit[0],
            "ranks": {str(r): v for r, v in views.items()},
            "time": time.time(),
        }
        path = self._path(self.rank, HANG_SUFFIX)
        write_heartbeat(path, report)
        report["mtime"] = path.stat().st_mtime
        return report

    def _respond(self, report: dict) -> None:
        """Dump this rank's stacks, wait (a few periods at most) until every live rank has, then hand
        over to on_hang, which records the exit status and ends the process."""
        assert self.on_hang is not None
        self.hanging.set()
        since = float(report.get("mtime", self._fs_now()))
        snap = self.progress.snapshot()
        header = (
            f"rank {self.rank} of {self.world} (node {self.node}, host {socket.gethostname()}, pid {self.pid}): "
            f"step {snap['step']}, phase {snap['phase']}, no progress for {snap['progress_age_s']:.0f} s\n"
            f"hang reported by rank {report.get('by')}: {report.get('line')}"
        )
        try:
            dump_stacks(self.run_dir, self.rank, header)
        except OSError as exc:
            sys.stderr.write(f"[rank {self.rank}] warning: cannot write the stack dump: {exc.strerror or exc}\n")
        views, _ = self._views(self._fs_now())
        live = [r for r, v in views.items() if not v["late"]]
        missing = wait_for_dumps(self.run_dir, live, since, timeout_s=2 * self.period_s + 5.0)
        decided = report.get("by") == self.rank
        if decided:
            report = {**report, "dumps": dumps_since(self.run_dir, since), "missing": missing}
            report.pop("mtime", None)
            try:
                write_heartbeat(self._path(self.rank, HANG_SUFFIX), report)
            except OSError:
                pass
        self.on_hang(report, decided)

    def wait_if_hanging(self, timeout_s: float | None = None) -> bool:
        """After an exception in the loop (a peer that stopped for a hang closes its connections):
        when a hang is being reported, give the watchdog the time to dump and end the process.
        Returns False at once when there is none; True if the wait ran out."""
        if not self.hang_timeout:
            return False
        if not self.hanging.is_set() and not read_hang_reports(self.run_dir, since=self.started - 1):
            return False
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else 4 * self.period_s + 15.0)
        while time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.2)
        return True

    def find_dead_peer(self, timeout_s: float) -> str | None:
        """After a communication error: wait (up to timeout_s) until a peer's heartbeat says
        which rank died, so the message names it instead of a transport error."""
        if self.world <= 1:
            return None
        deadline = time.time() + timeout_s
        while not (why := self._any_problem()) and time.time() < deadline:
            time.sleep(1.0)
            try:
                self._beat()  # keeps our own mtime, the filesystem's "now", fresh
            except OSError:
                pass
        return why

    def mark_dead(self, reason: str) -> None:
        if self.world > 1:
            try:
                self._path(self.rank, ".dead").write_text(reason)
            except OSError:
                pass

    def stop(self, clean: bool) -> None:
        self._stop.set()
        if self.world > 1 and clean:
            try:
                self._path(self.rank, ".done").write_text("ok")
            except OSError:
                pass


def setup_problem(run_dir: Path, exc: OSError) -> str:
    """The one line for a heartbeat folder or file the watchdog could not make or clear: a path of the
    wrong kind (a file where the folder goes, a folder where a file goes), or the disk's reason."""
    path = Path(exc.filename) if exc.filename else run_dir / "heartbeat"
    if path.is_dir() and not path.is_symlink():
        what = "a folder, where the trainer keeps a heartbeat file"
    elif os.path.lexists(path) and isinstance(exc, (FileExistsError, NotADirectoryError)):
        what = "not a folder, where the trainer keeps its heartbeats"
    else:
        return disk_error_message("the heartbeat", path.parent, exc, "then resume with --resume auto")
    return f"{path} is {what}: move it away or remove it (the trainer makes it again), then resume with --resume auto"


def stop_message(why: str) -> str:
    return f"stopping the job: {why}; resume with --resume auto once the cause is fixed"


def abort_job(write_exit: Callable[[int, str], None], rank: int) -> Callable[[str], None]:
    """What a rank does when a peer died: say so, record it, exit without waiting on collectives."""

    def _abort(why: str) -> None:
        msg = stop_message(why)
        sys.stderr.write(f"[rank {rank}] error: {msg}\n")
        sys.stderr.flush()
        write_exit(EXIT_FAILED, msg)
        os._exit(EXIT_FAILED)

    return _abort
