"""`taehv-launch diff A B`: config, plan, environment and versions of two runs, a run and a plan, or two
plans, only what differs; exit 0 identical, 1 different, 2 bad input (watch/diff.py)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from .core import app, exit_with
from .options import JsonOpt

SIDE_HELP = (
    'a run directory (or `latest`, a run id under ./output), a config file (.py), or a plan "GPUS PROFILE '
    '[--set KEY=VALUE ...] [--config FILE]" as one quoted argument'
)


@app.command(
    "diff",
    help="What differs between two runs, a run and a plan, or two plans: config, plan (GPUs, topology, "
    "strategy), environment and versions, only the rows that differ. Exit 0 identical, 1 different, 2 bad "
    'input. Example: taehv-launch diff output/latest "64 h100" (what relaunching this run on 64 H100s changes).',
)
def diff_cmd(
    a: Annotated[str, typer.Argument(help=SIDE_HELP, show_default=False)],
    b: Annotated[str, typer.Argument(help=SIDE_HELP, show_default=False)],
    as_json: JsonOpt = False,
    only: Annotated[
        Optional[str],
        typer.Option("--only", help="compare only these groups: config, plan, environment, versions (comma-separated)"),
    ] = None,
) -> None:
    from ..watch.diff import diff
    from ..run.manifest import plan_record

    exit_with(lambda: diff(a, b, plan_record, as_json, only))
