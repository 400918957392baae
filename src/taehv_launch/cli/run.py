"""`taehv-launch GPUS PROFILE` (= `taehv-launch run GPUS PROFILE`): resolve, render, start training."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from ..plan.resolve import Options
from .core import app, exit_with, fail
from .options import DryRunOpt, JsonOpt, plan_options

if TYPE_CHECKING:
    from ..run.request import Request


@app.command("run", help="Resolve, render and start training on this node (the default command).")
@plan_options()
def run_cmd(
    req: Request,
    dry_run: DryRunOpt = False,
    as_json: JsonOpt = False,
    resume: Annotated[
        Optional[str],
        typer.Option(
            "--resume",
            help="a checkpoint-<step> folder, a run folder, "
            "`auto` (newest complete checkpoint of the latest run), or `this-run` (only this "
            "named run's own, else start fresh: for requeued jobs)",
        ),
    ] = None,
    debug: Annotated[
        bool, typer.Option("--debug", help="verbose distributed logs, anomaly detection, few steps")
    ] = False,
    profile_run: Annotated[
        bool,
        typer.Option("--profile", help="torch.profiler trace of a few steps and a table of where a step's time goes"),
    ] = False,
    run_name: Annotated[
        Optional[str],
        typer.Option("--run-name", help="run directory name (default: scheduler job id, else a timestamp)"),
    ] = None,
) -> None:
    from ..run import dryrun, start

    req = replace(req, options=Options(resume=resume, debug=debug, profile_run=profile_run, run_name=run_name))
    if as_json and not dry_run:
        fail("--json goes with --dry-run (or validate-env)")
    exit_with(lambda: dryrun.dry_run(req, as_json) if dry_run else start.launch(req))
