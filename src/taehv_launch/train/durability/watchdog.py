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

from ...errors import EXIT_FAILED
from ...files import write_atomic


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
    ):
        self.dir = run_dir / "heartbeat"
        self.rank, self.world, self.node = rank, world, node
        self.period_s, self.stale_s, self.on_dead = period_s, stale_s, on_dead
        self.started = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="taehv-watchdog", daemon=True)

    def _path(self, rank: int, suffix: str = "") -> Path:
        return self.dir / f"rank{rank}{suffix}"

    def start(self) -> "Watchdog":
        if self.world <= 1:
            return self
        self.dir.mkdir(parents=True, exist_ok=True)
        for suffix in ("", ".dead", ".done"):
            self._path(self.rank, suffix).unlink(missing_ok=True)
        self._beat()
        self.started = self._fs_now()
        self._thread.start()
        return self

    def _beat(self) -> None:
        info = {"rank": self.rank, "node": self.node, "host": socket.gethostname(), "pid": os.getpid()}
        write_atomic(self._path(self.rank), json.dumps(info))

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
                if why := self._any_problem():
                    self.on_dead(why)
                    return
            except OSError:
                continue

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


def stop_message(why: str) -> str:
    return f"stopping the job: {why}; resume with --resume auto once the cause is fixed"


def abort_job(write_status: Callable[[int, str], None], rank: int) -> Callable[[str], None]:
    """What a rank does when a peer died: say so, record it, exit without waiting on collectives."""

    def _abort(why: str) -> None:
        msg = stop_message(why)
        sys.stderr.write(f"[rank {rank}] error: {msg}\n")
        sys.stderr.flush()
        write_status(EXIT_FAILED, msg)
        os._exit(EXIT_FAILED)

    return _abort
