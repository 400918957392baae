"""Preemption: a signal becomes a flag; all ranks agree on it at the same optimizer step.

Who gets which signal (docs/troubleshooting.md has the table):

- A rank process: the first SIGTERM/SIGINT/SIGUSR1/SIGHUP sent to it (SLURM signals every process of a
  step; `--signal=USR1@120` is its pre-timeout warning) sets the flag; the loop all-reduces it at
  each optimizer step, so every rank stops after the same step, saves a checkpoint and exits with
  EXIT_RESUMABLE. A second such signal exits at once (EXIT_ABORTED), unless it repeats the first
  within REPEAT_WINDOW_S (`counts_once`): GNU `timeout` and schedulers that signal a job step and
  its process group deliver one stop twice within milliseconds.
- RELAY_SIGNAL (SIGUSR2) is what `taehv-launch` sends to the ranks when it is signalled itself.
  It sets the flag and never counts as a second signal, so a rank that is signalled both
  directly (SLURM, `kill` on every process) and through the launcher stops once, with a checkpoint.
- DataLoader workers never act on a stop signal (`guard_worker`): the rank decides. They still
  exit when their own rank terminates them (what torch's DataLoader does at shutdown). They are
  started with the signals blocked (`workers_starting`), so a signal to the whole process group
  while a rank starts workers (the run's start, a rollback's new loader) is left to the rank too.

`install()` runs first thing in the trainer (train/main.py), so a signal during start-up is
kept too: the run stops with a checkpoint after its first step.

The launcher's death (SIGKILL, the out-of-memory killer, a crash) is a stop request too: each rank
watches the pid of the taehv-launch that started it (`watch_launcher`, LAUNCHER_ENV; a pidfd, through
whatever accelerate or torchrun run in between), sends what it prints from then on to the launch log
(nobody reads its pipe any more), and stops as if the launcher had relayed a signal: checkpoint, exit 75.
Meanwhile every trainer process holds the trainer lock (`hold_trainer_lock`), so a new launch of the run
is refused until the old one's processes, DataLoader workers included, have all exited.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import signal
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

from ...errors import EXIT_ABORTED
from ...rundir.layout import trainer_lock_path
from ...rundir.signals import RELAY_SIGNAL, STOP_SIGNALS, counts_once

LAUNCHER_ENV = "TAEHV_LAUNCHER"  # "<pid> <start time> <launch log>" of the taehv-launch that started us


_direct: list[int] = []  # stop signals sent to this process itself (repeats not counted)
_first: list[tuple[int, float]] = []  # the first direct stop signal and when it came
_relayed: list[int] = []  # RELAY_SIGNAL from the launcher
_installed = False


def _handle(signum, _frame) -> None:
    """Only list appends and a clock read here (no import, no lock): a signal can arrive while
    this handler runs for the previous one."""
    if signum == RELAY_SIGNAL:
        _relayed.append(signum)
        return
    now = time.monotonic()
    if _first and counts_once(_first[0], signum, now):
        return
    if not _first:
        _first.append((signum, now))
    _direct.append(signum)
    if len(_direct) > 1:
        sys.stderr.write(
            f"[rank {os.environ.get('RANK', '0')}] second signal ({signal.Signals(signum).name}): "
            f"exiting without a checkpoint\n"
        )
        sys.stderr.flush()
        os._exit(EXIT_ABORTED)


def install() -> None:
    """Turn stop signals into the flag in this process (idempotent; main thread only)."""
    global _installed
    if _installed:
        return
    for s in (*STOP_SIGNALS, RELAY_SIGNAL):
        signal.signal(s, _handle)
    _installed = True


def requested() -> bool:
    return bool(_direct or _relayed)


# ---------------------------------------------------------------- the launcher's death
_launcher_gone: list[str] = []  # why this rank stops: its launcher ended
_lock_fds: list[int] = []


def hold_trainer_lock(run_dir: Path, node: int) -> None:
    """A shared flock on the node's trainer lock for as long as this process (and the DataLoader workers
    it forks) lives: run/lock.py refuses a new launch of the run meanwhile. Best effort: a filesystem
    without locks, or a lock not granted within a few seconds, only loses that refusal."""
    try:
        fd = os.open(trainer_lock_path(run_dir, node), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        return
    for _ in range(50):  # a launcher's probe holds it exclusively for an instant
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            _lock_fds.append(fd)
            return
        except OSError:
            time.sleep(0.1)
    os.close(fd)


def start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, /proc/<pid>/stat): with the pid, who it is."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2 :].split()[19]
    except (OSError, ValueError, IndexError):
        return None


def launcher_gone() -> str | None:
    """Why this rank stopped, when its launcher ended (for the exit status), else None."""
    return _launcher_gone[0] if _launcher_gone else None


def watch_launcher(rank: str) -> None:
    """When LAUNCHER_ENV names the taehv-launch that started this trainer, watch it from a daemon thread:
    once it has ended, this process prints into the launch log and stops with a checkpoint.

    Our output goes into the launcher's pipe; once it is dead, a write there would fail (EPIPE) and take
    the rank down with a BrokenPipeError before the thread has pointed fds 1 and 2 at the log. So the
    rank holds a read end of that pipe too (never read while the launcher lives, which reads it all):
    with a reader left, a write in that moment lands in the pipe, and the thread moves it to the log."""
    spec = os.environ.get(LAUNCHER_ENV, "").split(" ", 2)
    if len(spec) != 3 or not spec[0].isdigit():
        return
    pid, started, log = int(spec[0]), spec[1], spec[2]
    try:
        keep: int | None = None
        if stat.S_ISFIFO(os.fstat(1).st_mode):
            keep = os.open("/proc/self/fd/1", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        pass
    try:
        fd: int | None = os.pidfd_open(pid)
    except ProcessLookupError:
        fd = -1  # already gone
    except (OSError, AttributeError):
        fd = None  # no pidfd (an old kernel): poll instead
    if start_time(pid) != started:  # gone, or the pid already names another process
        fd = -1

    def wait() -> None:
        if fd is not None and fd >= 0:
            select.select([fd], [], [])
        elif fd is None:
            while start_time(pid) == started:
                time.sleep(1.0)
        _orphaned(rank, pid, log, keep)

    threading.Thread(target=wait, name="launcher-watch", daemon=True).start()


def _drain(pipe: int | None, out: int) -> None:
    """What was written into the dead launcher's pipe (our read end of it), into `out`."""
    while pipe is not None:
        try:
            data = os.read(pipe, 65536)
        except OSError:  # empty (EAGAIN)
            return
        if not data:
            return
        os.write(out, data)


def _orphaned(rank: str, pid: int, log: str, pipe: int | None) -> None:
    why = f"taehv-launch (pid {pid}) ended while the trainer ran (killed?)"
    try:
        out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        out = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    _drain(pipe, out)
    os.dup2(out, 1)
    os.dup2(out, 2)
    _drain(pipe, out)  # written between the first drain and the switch
    os.close(out)
    if pipe is not None:
        os.close(pipe)
    _launcher_gone.append(why)
    _relayed.append(RELAY_SIGNAL)
    sys.stderr.write(f"[rank {rank}] {why}: stopping after this step with a checkpoint\n")
    sys.stderr.flush()


class StopFlag:
    def __init__(self) -> None:
        install()

    @property
    def signals(self) -> list[int]:
        return [*_direct, *_relayed]

    @property
    def local(self) -> bool:
        return requested()


# ---------------------------------------------------------------- DataLoader workers
WORKER_SIGNALS = (*STOP_SIGNALS, RELAY_SIGNAL)  # what a worker leaves to its rank


@contextlib.contextmanager
def workers_starting(start_method: str | None) -> Iterator[None]:
    """Around the code that starts DataLoader workers (train/data/workers.py): this thread blocks the stop
    signals meanwhile, so every new worker is born with them blocked and a signal to the whole process group
    (SLURM, `timeout`, a terminal) in the moment before its `worker_init_fn` (guard_worker) stays pending in
    it instead of killing it. Fork copies this thread's mask; spawn's exec keeps it; forkserver's workers are
    forked from the server, which is started here with them blocked (never killed by them either: it exits
    when the rank does). A rank's own pending signal is delivered when the mask is restored.

    CPython's `resource_tracker.ensure_running` unblocks SIGINT/SIGTERM in the calling thread after it starts
    the tracker (bpo-33613), so spawn and forkserver start the tracker first and block again."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, WORKER_SIGNALS)
    try:
        if start_method in ("spawn", "forkserver"):
            from multiprocessing import forkserver, resource_tracker

            resource_tracker.ensure_running()
            signal.pthread_sigmask(signal.SIG_BLOCK, WORKER_SIGNALS)
            if start_method == "forkserver":
                forkserver.ensure_running()
                signal.pthread_sigmask(signal.SIG_BLOCK, WORKER_SIGNALS)
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def guard_worker() -> None:
    """In a DataLoader worker: stop signals from anyone but the worker's own rank are ignored.

    A worker would otherwise die of SLURM's or a terminal's SIGTERM/SIGINT/SIGUSR1 (torch installs a
    SIGTERM handler in workers that re-raises it unless it comes from the parent; a spawned worker has
    Python's defaults), and the rank would then fail with "DataLoader worker ... is killed by signal".
    The signals are blocked in the worker (from birth, when `workers_starting` started it) and read by a
    small thread: SIGTERM from the worker's rank (torch's `terminate()` of a worker at shutdown) exits the
    worker as torch's own handler does; every other stop signal is dropped. The rank is the process that
    created the worker (multiprocessing's parent_process), also under forkserver, whose workers are the
    server's children.
    """
    import multiprocessing

    signal.pthread_sigmask(signal.SIG_BLOCK, WORKER_SIGNALS)  # before the thread: it inherits the mask
    creator = multiprocessing.parent_process()
    rank = creator.pid if creator is not None and creator.pid else os.getppid()
    watched = set(WORKER_SIGNALS)

    def wait() -> None:
        while True:
            info = signal.sigwaitinfo(watched)
            if info.si_signo == signal.SIGTERM and info.si_pid == rank:
                os._exit(0)

    threading.Thread(target=wait, name="stop-signal-guard", daemon=True).start()


_WORKER_DIED = re.compile(
    r"DataLoader worker \(pids?(?:\(s\))? ?([^)]*)\) (is killed by signal: [^.]+|exited unexpectedly"
    r"(?: with exit code -?\d+)?)"
)


def worker_death_message(exc: BaseException) -> str | None:
    """One line for torch's "DataLoader worker (pid N) is killed by signal: ..." errors, else None.

    Raised from `next(data_iter)` or from torch's SIGCHLD handler anywhere in the rank. The
    workers ignore stop signals, so this is another cause: most often the out-of-memory killer.
    """
    m = _WORKER_DIED.search(str(exc))
    if m is None:
        return None
    return (
        f"a DataLoader worker (pid {m.group(1).strip()}) {m.group(2)}: usually the out-of-memory killer or a "
        f"full /dev/shm; lower --set dataloader_num_workers or prefetch_factor, or give the job more memory "
        f"(validate-env checks /dev/shm), then continue with --resume auto"
    )
