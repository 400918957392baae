"""`taehv-launch validate-env GPUS PROFILE`: preflight of this node, the data and the models."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Annotated

import typer

from ..plan.resolve import Options
from .core import app, exit_with
from .options import JsonOpt, plan_options

if TYPE_CHECKING:
    from ..run.request import Request


@app.command("validate-env", help="Preflight: check this node, the data and the models for the resolved plan.")
@plan_options()
def validate_env_cmd(
    req: Request,
    as_json: JsonOpt = False,
    quick: Annotated[bool, typer.Option("--quick", help="skip the slow checks (all-reduce, model loads)")] = False,
    cache: Annotated[
        bool,
        typer.Option(
            "--cache",
            help="check for `taehv-launch cache` (with --set latent_cache="
            "DIR): the cache's size against the free space there",
        ),
    ] = False,
) -> None:
    from ..preflight import checks as preflight

    req = replace(req, options=Options(task="cache" if cache else "train"))
    exit_with(lambda: preflight.validate_env(req, as_json=as_json, quick=quick))
