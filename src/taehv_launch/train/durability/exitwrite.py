"""Which node this trainer process is on, and the exit status it leaves for the launcher."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ...rundir.exitstatus import exit_status_path, write_exit_status


def node_rank() -> int:
    """This process's node, as torchrun (GROUP_RANK) or a scheduler (NODE_RANK) sets it."""
    return int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0")) or 0)


def leave_exit_status(run_dir: Path, code: int, message: str, repeats: bool = False) -> None:
    if os.environ.get("LOCAL_RANK", "0") != "0":
        return
    path = exit_status_path(run_dir, node_rank())
    try:
        write_exit_status(path, code, message, repeats)
    except OSError as exc:  # the launcher then reports accelerate's code instead: say why
        print(f"warning: cannot record the exit status in {path}: {exc.strerror or exc}", file=sys.stderr, flush=True)
