"""The stop signals, as the launcher and the trainer agree on them (train/durability/stop.py acts on them,
run/launch.py relays them; docs/troubleshooting.md has the table).

The first STOP_SIGNALS signal to a rank makes it stop after the next optimizer step with a checkpoint;
a second one exits at once, unless it repeats the first within REPEAT_WINDOW_S (`counts_once`). The
launcher, when signalled itself, sends RELAY_SIGNAL to the ranks, which never counts as a second signal.
"""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP)  # SIGHUP: a closed terminal
RELAY_SIGNAL = signal.SIGUSR2
REPEAT_WINDOW_S = 2.0  # the same signal again this soon after the first is the same stop


def counts_once(first: tuple[int, float], signum: int, at: float) -> bool:
    """Whether a stop signal `signum` arriving at `at` (time.monotonic()) repeats the first stop
    signal `first` = (signum, time): the same signal within REPEAT_WINDOW_S. A different signal
    (a person's Ctrl-C after a scheduler's SIGTERM), or the same one later, is a second signal."""
    return signum == first[0] and 0 <= at - first[1] <= REPEAT_WINDOW_S
