"""Preemption: a signal becomes a flag; all ranks agree on it at the same optimizer step.

Who gets which signal (docs/troubleshooting.md has the table):

- A rank process: the first SIGTERM/SIGINT/SIGUSR1 sent to it (SLURM signals every process of a
  step; `--signal=USR1@120` is its pre-timeout warning) sets the flag; the loop all-reduces it at
  each optimizer step, so every rank stops after the same step, saves a checkpoint and exits with
  EXIT_RESUMABLE. A second such signal exits at once (EXIT_ABORTED), unless it repeats the first
  within REPEAT_WINDOW_S (`counts_once`): GNU `timeout` and schedulers that signal a job step and
  its process group deliver one stop twice within milliseconds.
- RELAY_SIGNAL (SIGUSR2) is what `taehv-launch` sends to the ranks when it is signalled itself.
  It sets the flag and never counts as a second signal, so a rank that is signalled both
  directly (SLURM, `kill` on every process) and through the launcher stops once, with a checkpoint.
- DataLoader workers never act on a stop signal (`guard_worker`): the rank decides. They still
  exit when their own rank terminates them (what torch's DataLoader does at shutdown).

`install()` runs first thing in the trainer (train/main.py), so a signal during start-up is
kept too: the run stops with a checkpoint after its first step.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time

from ...errors import EXIT_ABORTED
from ...rundir.signals import RELAY_SIGNAL, STOP_SIGNALS, counts_once


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
def guard_worker() -> None:
    """In a DataLoader worker: stop signals from anyone but the worker's own rank are ignored.

    A forked worker would otherwise die of SLURM's or a terminal's SIGTERM/SIGINT/SIGUSR1 (torch
    installs a SIGTERM handler in workers that re-raises it unless it comes from the parent), and
    the rank would then fail with "DataLoader worker ... is killed by signal". The signals are
    blocked in the worker and read by a small thread: SIGTERM from the parent rank (torch's
    `terminate()` of a worker at shutdown) exits the worker as torch's own handler does; every
    other stop signal is dropped.
    """
    watched = {*STOP_SIGNALS, RELAY_SIGNAL}
    signal.pthread_sigmask(signal.SIG_BLOCK, watched)  # before the thread: it inherits the mask
    parent = os.getppid()

    def wait() -> None:
        while True:
            info = signal.sigwaitinfo(watched)
            if info.si_signo == signal.SIGTERM and info.si_pid == parent:
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
