"""`taehv-launch render slurm|k8s GPUS PROFILE`: print a cluster job that runs the plan on every node."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from .core import app, exit_with
from .options import plan_options

if TYPE_CHECKING:
    from ..run.request import Request


@app.command(
    "render",
    help="Print a cluster job that runs GPUS x PROFILE on every node: `render slurm 16 h100 "
    "--output-dir /shared/runs --set ...` (an sbatch script) or `render k8s ... --image IMG "
    "--pvc CLAIM` (an indexed Job and a headless Service). Redirect it to a file.",
)
@plan_options(topology=("gpus_per_node",))
def render_cmd(
    kind: Annotated[str, typer.Argument(help="slurm or k8s", show_default=False)],
    req: Request,
    output_dir: Annotated[
        Optional[str],
        typer.Option(
            "--output-dir", help="where run directories go: an absolute path every node mounts (= --set output_dir=...)"
        ),
    ] = None,
    job_name: Annotated[Optional[str], typer.Option("--job-name", help="default taehv-GPUS-PROFILE")] = None,
    run_name: Annotated[
        Optional[str],
        typer.Option(
            "--run-name", help="one run every job continues (default: each job is a new run, named by its job id)"
        ),
    ] = None,
    partition: Annotated[Optional[str], typer.Option("--partition", rich_help_panel="SLURM")] = None,
    account: Annotated[Optional[str], typer.Option("--account", rich_help_panel="SLURM")] = None,
    time: Annotated[
        Optional[str], typer.Option("--time", help="time limit, e.g. 24:00:00", rich_help_panel="SLURM")
    ] = None,
    signal_seconds: Annotated[
        Optional[int],
        typer.Option(
            "--signal-seconds",
            min=10,
            help="SIGUSR1 this long before the time limit (default 120)",
            rich_help_panel="SLURM",
        ),
    ] = None,
    image: Annotated[
        Optional[str],
        typer.Option("--image", help="container image with taehv-launch installed", rich_help_panel="Kubernetes"),
    ] = None,
    pvc: Annotated[
        Optional[str],
        typer.Option("--pvc", help="ReadWriteMany PersistentVolumeClaim for the runs", rich_help_panel="Kubernetes"),
    ] = None,
    mount: Annotated[
        Optional[str],
        typer.Option("--mount", help="where the claim is mounted (default /shared)", rich_help_panel="Kubernetes"),
    ] = None,
    namespace: Annotated[Optional[str], typer.Option("--namespace", rich_help_panel="Kubernetes")] = None,
    grace_period: Annotated[
        Optional[int],
        typer.Option(
            "--grace-period",
            min=1,
            help="seconds between SIGTERM and SIGKILL (default 300)",
            rich_help_panel="Kubernetes",
        ),
    ] = None,
    restarts: Annotated[
        Optional[int],
        typer.Option("--restarts", min=0, help="failures tolerated per pod (default 3)", rich_help_panel="Kubernetes"),
    ] = None,
) -> None:
    from ..cluster.command import render_job

    argv = ["taehv-launch", "render", *sys.argv[2:]] if sys.argv[1:2] == ["render"] else ["taehv-launch", "render"]
    exit_with(
        lambda: render_job(
            kind,
            req,
            output_dir=output_dir,
            job_name=job_name,
            render_argv=argv,
            run_name=run_name,
            partition=partition,
            account=account,
            time=time,
            signal_seconds=signal_seconds,
            image=image,
            pvc=pvc,
            mount=mount,
            namespace=namespace,
            grace_period=grace_period,
            restarts=restarts,
        )
    )
