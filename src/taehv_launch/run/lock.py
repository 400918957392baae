"""One launch per run directory and node: an exclusive lock on `<run dir>/.lock` (`.lock.node<k>`
on node k), held by the launcher for as long as it runs.

flock(2) on an open file: the kernel drops it when the launcher exits or dies, so a lock is never
stale, whatever the file still says. The file records who holds it (host, pid, start time) for the
refusal message. On a local filesystem it keeps two launches of one run on one machine apart. On
NFS, Linux implements flock with the server's byte-range locks (NFSv4, or NFSv3 with lockd), so it
holds across nodes too where the filesystem supports POSIX locks across clients; a filesystem
mounted with `nolock` (or `local_lock=all`) only locks within each machine.
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
from ..rundir.layout import node_suffix


def lock_path(run_dir: Path, node: int) -> Path:
    return run_dir / f".lock{node_suffix(node)}"


class RunLock:
    """Take it with `acquire()`; it is released by `release()` or when this process ends."""

    def __init__(self, run_dir: Path, node: int) -> None:
        self.path = lock_path(run_dir, node)
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
        self.fd = fd
        holder = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)

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
