"""`taehv-launch status [RUN ...]`: where runs stand (step, speed, ETA, checkpoint, heartbeats, exit,
requeues), read from their run directories; writes nothing (watch/status.py)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from .core import app, exit_with
from .options import JsonOpt


@app.command(
    "status",
    help="Where runs stand: step/total, clips/s now and on average, ETA, the last complete checkpoint, "
    "each node's and rank's heartbeat, exit status and last error, requeues. RUN: a run directory, "
    "`latest` or a run id under ./output, an output directory (all its runs) or a glob; default "
    "output/latest. Reads only: works on live runs from any machine that sees the run directory.",
)
def status_cmd(
    runs: Annotated[
        Optional[list[str]],
        typer.Argument(
            help="run directories, output directories or globs (default: output/latest)", show_default=False
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    from ..watch.status import status

    exit_with(lambda: status(list(runs or []), as_json))
