"""The launcher's console: the terminal (or whatever its stdout is) beside launch.log, surviving a
closed terminal; and who the launcher is, for the ranks that watch it (train/durability/stop.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


class Console:
    """Where the launch's output goes: the terminal (or whatever stdout is) and launch.log. When the
    terminal is gone (closed: EIO; a pipe whose reader ended: EPIPE), fds 1 and 2 are pointed at the log,
    so the lines printed after (the exit line, the error line) are kept there, and the launch goes on."""

    def __init__(self, log) -> None:
        self.log, self.alive = log, True

    def _lost(self) -> None:
        self.alive = False
        try:
            for fd in (1, 2):
                os.dup2(self.log.fileno(), fd)
        except (OSError, ValueError):
            pass

    def out(self, data: bytes) -> None:
        """A line of the child's output (already in the log)."""
        if self.alive:
            try:
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
            except (OSError, ValueError):
                self._lost()

    def say(self, msg: str) -> None:
        """One of our own lines: stderr and the log."""
        try:
            self.log.write(msg.encode())
            self.log.flush()
        except (OSError, ValueError):  # the log is closed: the launch has ended
            pass
        if self.alive:
            try:
                sys.stderr.write(msg)
                sys.stderr.flush()
            except (OSError, ValueError):
                self._lost()

    def note(self, msg: str) -> None:
        """A line for the log only."""
        try:
            self.log.write(f"{msg}\n".encode())
            self.log.flush()
        except (OSError, ValueError):
            pass


def start_time() -> str:
    """This process's start time (clock ticks since boot, /proc/self/stat): the ranks check who we are."""
    try:
        stat = Path("/proc/self/stat").read_text()
        return stat[stat.rindex(")") + 2 :].split()[19]
    except (OSError, ValueError, IndexError):
        return "?"
