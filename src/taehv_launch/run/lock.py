"""One launch per run directory and node: an exclusive lock on `<run dir>/.lock` (`.lock.node<k>`
on node k), held by the launcher for as long as it runs.

flock(2) on an open file: the kernel drops it when the launcher exits or dies, so a lock is never
stale, whatever the file still says. The file records who holds it (host, pid, start time) for the
refusal message, and the launch's id (rundir/launchid.py): `status` reads the current launch's from it. On a local filesystem it keeps two launches of one run on one machine apart. On
NFS, Linux implements flock with the server's byte-range locks (NFSv4, or NFSv3 with lockd), so it
holds across nodes too where the filesystem supports POSIX locks across clients; a filesystem
mounted with `nolock` (or `local_lock=all`) only locks within each machine.

The trainer processes of a launch hold a shared lock on `.lock[.node<k>].trainer` (rundir/layout.py,
taken in train/durability/stop.py; forked DataLoader workers inherit it): a launcher that died (SIGKILL)
leaves its trainer saving a checkpoint and stopping, and a new launch of the run is refused until every
process of the old one has exited, instead of training beside it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from ..errors import LaunchError
from ..rundir.launchid import stamped
from ..rundir.layout import launcher_lock_path, trainer_lock_path


class RunLock:
    """Take it with `acquire()`; it is released by `release()` or when this process ends."""

    def __init__(self, run_dir: Path, node: int) -> None:
        self.path, self.node = launcher_lock_path(run_dir, node), node
        self.fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise LaunchError(
                f"cannot create the run lock {self.path}: {exc.strerror or exc}; pass a writable --set output_dir=..."
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise LaunchError(
                    f"cannot lock {self.path}: {exc.strerror or exc}; the filesystem does not "
                    f"support locks: use another --set output_dir"
                ) from None
            raise LaunchError(
                f"{self.path.parent} is in use by another launch ({self._holder()}): wait for it "
                f"to end, or pass another --run-name"
            ) from None
        try:
            self._no_trainer_left()
        except LaunchError:
            os.close(fd)
            raise
        self.fd = fd
        holder = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(stamped(holder)) + "\n").encode(), 0)

    def _no_trainer_left(self) -> None:
        """Refuse while trainer processes of an earlier launch still hold the trainer lock (their launcher
        was killed: they save a checkpoint and stop). Probed with an exclusive lock, released at once."""
        path = trainer_lock_path(self.path.parent, self.node)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise LaunchError(
                f"cannot create the run lock {path}: {exc.strerror or exc}; pass a writable --set output_dir=..."
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                return  # no locks on this filesystem: acquire() already said so for .lock
            pids = trainer_lock_holders(path)
            who = f"pid {', '.join(map(str, pids))}" if pids else "its processes"
            raise LaunchError(
                f"{self.path.parent} is still in use by the trainer of an earlier launch ({who}), whose "
                f"taehv-launch has ended: it saves a checkpoint and stops; wait for it to end (or kill it), "
                f"or pass another --run-name"
            ) from None
        finally:
            os.close(fd)

    def _holder(self) -> str:
        try:
            h = json.loads(self.path.read_text())
            return f"taehv-launch pid {h['pid']} on {h['host']}, since {h['since']}"
        except (OSError, ValueError, KeyError, TypeError):
            return "another taehv-launch"

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def trainer_lock_holders(path: Path) -> list[int]:
    """The pids /proc/locks names as holding a flock on `path` (the processes that took it; a forked
    DataLoader worker shares its rank's). [] when that cannot be read."""
    try:
        inode = os.stat(path).st_ino
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    pids = []
    for line in lines:
        f = line.split()
        if len(f) >= 6 and f[1] == "FLOCK" and f[5].rsplit(":", 1)[-1] == str(inode) and f[4].isdigit():
            pids.append(int(f[4]))
    return sorted(set(pids))
