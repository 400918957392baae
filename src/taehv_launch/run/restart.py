"""Restart in place: after a rank failure or a detected hang, the launcher starts the ranks again from the
newest complete checkpoint instead of ending the job (issue #39).

decide() is pure: the attempt's exit code and line, the checkpoint it started from and the newest complete
one now, the counts so far and the caps in; the verdict (restart or not, the one line, the new no-progress
count) out. supervise.py runs the loop: it waits for the old ranks to let go of the trainer lock, records each
restart in <run>/events.jsonl (rundir/events.py) and starts `accelerate launch` again with
`--resume <checkpoint>`; on several nodes every launcher does so together, node 0 deciding (together.py).

Not restarted: a clean end (0), bad input (2: config errors), a user error that a restart would meet
again (the exit status's "repeats": diverging again, a full disk; a dead peer is restarted), exit 75 (a stop
signal: the checkpoint is saved, the scheduler requeues as before), 130 (aborted by a second signal), a stop
the launcher itself was asked for, an out-of-memory before the attempt's first step (it would fail again).
A restart whose attempt fails again without a complete checkpoint newer than the one it started from
counts against max_restarts_without_progress; the first failure of a launch never does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import EXIT_ABORTED, EXIT_HUNG, EXIT_OK, EXIT_RESUMABLE, EXIT_USAGE
from ..rundir.launchid import launch_id, written_by

LOCK_WAIT_S = 60.0  # for the old ranks (and their DataLoader workers) to exit before a restart
OOM_WORDS = ("out of memory", "outofmemoryerror")

NOT_RESTARTED = {
    EXIT_OK: "finished",
    EXIT_USAGE: "a configuration or input error (exit 2) repeats on a restart",
    EXIT_RESUMABLE: "stopped after saving a checkpoint (exit 75): the scheduler requeues it",
    EXIT_ABORTED: "stopped at once by a second signal (exit 130)",
}


@dataclass(frozen=True)
class Verdict:
    restart: bool
    line: str  # why (restart: the reason; not: why not), one line
    without_progress: int  # the no-progress count after this failure


def reason_of(code: int, message: str | None) -> str:
    """What the failure was, in a few words, for the event and `status`."""
    if code == EXIT_HUNG:
        return "hang (exit 76)"
    if code > 128:
        return f"a process was killed (exit {code}, signal {code - 128})"
    first = (message or "").split(";")[0].strip()
    return f"exit {code}" + (f": {first[:160]}" if first else "")


def decide(
    code: int,
    message: str | None,
    *,
    started_from: str | None,
    newest: str | None,
    stepped: bool,
    count: int,
    without_progress: int,
    max_restarts: int,
    max_without_progress: int,
    stop_requested: bool = False,
    repeats: bool = False,
) -> Verdict:
    """Whether the launcher starts the ranks again after an attempt ended with `code`.
    started_from/newest: checkpoint names (the one the attempt resumed, the newest complete one now);
    stepped: the attempt logged a training step past its start; count: restarts so far; repeats: the
    trainer's exit status says a restart would meet the same problem (a user error: diverged again, a
    full disk ...; not a dead peer)."""
    progressed = newest is not None and newest != started_from
    wp = 0 if progressed else without_progress + (1 if count > 0 else 0)
    if code in NOT_RESTARTED:
        return Verdict(False, NOT_RESTARTED[code], wp)
    if stop_requested:
        return Verdict(False, "the launcher was asked to stop", wp)
    if repeats:
        return Verdict(False, f"the trainer stopped on a problem a restart would meet again (exit {code})", wp)
    if max_restarts <= 0:
        return Verdict(False, "restarts are off (max_restarts=0)", wp)
    if not stepped and any(w in (message or "").lower() for w in OOM_WORDS):
        return Verdict(False, "out of memory before the first step repeats on a restart", wp)
    if count >= max_restarts:
        return Verdict(False, f"{count} restart{'s' if count != 1 else ''} already (max_restarts={max_restarts})", wp)
    if max_without_progress > 0 and wp >= max_without_progress:
        return Verdict(
            False,
            f"{wp} restart{'s' if wp != 1 else ''} in a row got past no checkpoint "
            f"(max_restarts_without_progress={max_without_progress})",
            wp,
        )
    return Verdict(True, reason_of(code, message), wp)


def restart_argv(argv: list[str], checkpoint: Path | None) -> list[str]:
    """The launch command again, resuming `checkpoint` (None: as it was, e.g. no checkpoint yet)."""
    if checkpoint is None:
        return list(argv)
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--resume":
            skip = True
            continue
        out.append(arg)
    return out + ["--resume", str(checkpoint)]


def wait_lock_free(
    path: Path, timeout_s: float = LOCK_WAIT_S, poll_s: float = 0.2, stopped: Callable[[], bool] | None = None
) -> bool:
    """Wait until no process holds the trainer lock (`path`, flocked shared by every rank and its
    DataLoader workers): the old ranks have exited. False after timeout_s, or at once when stopped() says a
    stop signal came (a scheduler's grace period is not spent waiting)."""
    import errno
    import fcntl
    import os

    deadline = time.monotonic() + timeout_s
    while True:
        if stopped is not None and stopped():
            return False
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:
            return True  # no lock to wait for
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                return True  # no locks on this filesystem
        finally:
            os.close(fd)
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def fs_now(run_dir: Path, node: int) -> float:
    """The clock of the run directory's filesystem, now: the mtime of node `node`'s trainer lock file, touched
    (as run/freeze.py reads it). A restart's times (failed_at, first_step_at, recovery_s) are all on
    this one clock: on several nodes the failure is seen on one node and the first new step on node 0, and
    the shared filesystem is the one clock both see (NFS stamps a write with the server's time); the
    heartbeats, progress.json and the exit status are files whose mtimes are that clock already. On a local
    disk it is this machine's clock. time.time() where the file cannot be touched."""
    import os

    from ..rundir.layout import trainer_lock_path

    path = trainer_lock_path(run_dir, node)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        os.utime(path)
        return path.stat().st_mtime
    except OSError:
        return time.time()


def of_attempt(record: object, number: int) -> bool:
    """Whether `record` (a heartbeat or progress.json as read) was written by attempt `number` (restarts so far)
    of this launcher's launch: by its "attempt" and "launch_id" (rundir/launchid.py: the launcher puts both in
    its trainer's environment), never by a file's time. Not: the failed attempt's last heartbeat, an earlier
    launch's leftover file, a record with no attempt (a trainer started by hand); on several nodes the other
    nodes' ranks (their launchers' own launch ids): node 0's ranks and progress.json tell the step."""
    lid = launch_id()
    return written_by(record, number, None if lid is None else {lid})


def progress_at(run_dir: Path, number: int) -> tuple[int, float] | None:
    """(the step progress.json holds, its mtime: the filesystem's clock) when attempt `number` wrote it, else None."""
    from ..rundir.progress import PROGRESS_FILE, read_progress

    prog = read_progress(run_dir)
    try:
        return (prog["step"], (Path(run_dir) / PROGRESS_FILE).stat().st_mtime) if of_attempt(prog, number) else None
    except OSError:
        return None


def first_new_step(run_dir: Path, after_step: int, number: int) -> float | None:
    """When attempt `number`'s ranks first logged a step past `after_step` (of_attempt tells their records):
    progress.json's or a heartbeat's mtime (the filesystem's clock, as failed_at: fs_now); None: not yet."""
    from ..rundir.heartbeat import read_heartbeats

    times = []
    prog = progress_at(run_dir, number)
    if prog and prog[0] > after_step:
        times.append(prog[1])
    for hb in read_heartbeats(run_dir).values():
        step = hb.get("step")
        if isinstance(step, int) and not isinstance(step, bool) and step > after_step and of_attempt(hb, number):
            times.append(hb["mtime"])
    return min(times) if times else None


class FirstStepWatch:
    """A thread that records {"event": "restarted", "restart", "first_step_at", "recovery_s"} in
    events.jsonl once the restarted ranks log a step past the checkpoint they resumed."""

    def __init__(self, run_dir: Path, number: int, after_step: int, failed_at: float) -> None:
        import threading

        self.args = (run_dir, number, after_step, failed_at)
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._run, name="taehv-restart-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        run_dir, number, after_step, failed_at = self.args
        while not self._ended.wait(0.5):
            try:
                at = first_new_step(run_dir, after_step, number)
            except (OSError, ValueError, TypeError):
                continue
            if at is not None:
                record(
                    run_dir,
                    {
                        "event": "restarted",
                        "time": time.time(),
                        "restart": number,
                        "first_step_at": at,
                        "recovery_s": round(max(0.0, at - failed_at), 1),
                    },
                )
                return

    def end(self) -> None:
        self._ended.set()
        self._thread.join(timeout=2)


def record(run_dir: Path, rec: dict) -> None:
    from ..errors import UserError
    from ..rundir.events import append_event

    try:
        append_event(run_dir, rec)
    except (UserError, OSError):  # bookkeeping: never stops a run
        pass
