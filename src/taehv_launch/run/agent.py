"""`accelerate launch`, run in-process, with the stop signals left to the trainer ranks.

    python -m taehv_launch.run.agent /path/to/accelerate launch --config_file ... main.py ...

launch.py starts the rendered `accelerate launch` command through this module. With several
processes accelerate runs torchrun's agent in this process, and that agent turns SIGTERM/SIGINT
into an exception that tears the ranks down (SIGTERM to each rank's process group, the DataLoader
workers included, then SIGKILL after a grace period); SIGUSR1 kills it outright. A scheduler that
signals every process of a job (SLURM) would so break the checkpoint the ranks are writing. Here
these signals do nothing: the ranks get them directly or through taehv-launch's relay, save and
exit, and the agent then ends as it always does when its ranks have exited. SIGQUIT keeps
torchrun's handling. Handlers (not SIG_IGN) are used so the ranks start with default dispositions.
"""

from __future__ import annotations

import signal
import sys

HELD = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP, signal.SIGUSR2)  # rundir/signals.py's


def _hold(_signum, _frame) -> None:
    """The ranks decide; the agent waits for them."""


def _patch_torchrun() -> None:
    """torchrun registers its own handler for SIGTERM/SIGINT when it starts the ranks (elastic
    multiprocessing `PContext.start`); make that handler ignore the held signals (compat.py)."""
    from ..compat import hold_elastic_stop_signals

    hold_elastic_stop_signals(HELD)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    for s in HELD:
        signal.signal(s, _hold)
    try:
        from accelerate.commands.accelerate_cli import main as accelerate_main
    except ImportError:  # accelerate lives in another environment: run its own script
        import os

        os.execv(argv[0], argv)
    _patch_torchrun()

    sys.argv = argv
    try:
        accelerate_main()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
