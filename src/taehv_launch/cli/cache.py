"""`taehv-launch cache GPUS PROFILE --set latent_cache=DIR`: encode the views once, train from them."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from ..plan.resolve import Options
from .core import app, exit_with, fail
from .options import DryRunOpt, JsonOpt, plan_options

if TYPE_CHECKING:
    from ..run.request import Request


@app.command(
    "cache",
    help="Encode every video's views once with the reference VAE and store the latents "
    "(--set latent_cache=DIR); train with the same --set to skip the reference encode.",
)
@plan_options()
def cache_cmd(
    req: Request,
    views: Annotated[
        Optional[int],
        typer.Option(
            "--views", help="views per video (a view: fixed frames, crop, flip); default: the cache_views key, 4"
        ),
    ] = None,
    dry_run: DryRunOpt = False,
    as_json: JsonOpt = False,
    debug: Annotated[bool, typer.Option("--debug", help="verbose distributed logs")] = False,
    run_name: Annotated[
        Optional[str],
        typer.Option("--run-name", help="log directory name (default: scheduler job id, else cache-<timestamp>)"),
    ] = None,
) -> None:
    from ..run import dryrun, start

    if views is not None and views < 1:
        fail(f"--views must be at least 1, got {views}")
    req = replace(
        req,
        sets=[*req.sets, *([f"cache_views={views}"] if views is not None else [])],
        options=Options(debug=debug, run_name=run_name, task="cache"),
    )
    if as_json and not dry_run:
        fail("--json goes with --dry-run")
    exit_with(lambda: dryrun.dry_run(req, as_json) if dry_run else start.launch(req))
