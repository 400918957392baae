"""`taehv-launch requeue-check` (hidden): the requeue limit the rendered sbatch and Kubernetes jobs
apply (cluster/requeue.py). Not for people: `render` writes the call. Exits 0 or 1 (the limit) only
from its decision: anything else that goes wrong is one error line and exit 2."""

from __future__ import annotations

import os
from typing import Annotated, Optional

import typer

from ..errors import LaunchError, UserError, one_line
from .core import app, exit_with


@app.command(
    "requeue-check",
    hidden=True,
    help="Count a requeue (or, --at-start, a restart of pod 0) of a cluster run in its requeue.json; "
    "exit 0 to go on, 1 when --limit requeues in a row found no new checkpoint.",
)
def requeue_check_cmd(
    output_dir: Annotated[str, typer.Option("--output-dir", help="the job's output_dir")],
    limit: Annotated[int, typer.Option("--limit", help="max_requeues_without_progress (0: no limit)")],
    job_id: Annotated[Optional[str], typer.Option("--job-id", help="the scheduler's job id")] = None,
    run_name: Annotated[Optional[str], typer.Option("--run-name", help="the job's --run-name")] = None,
    at_start: Annotated[bool, typer.Option("--at-start", help="Kubernetes: run when a pod starts")] = False,
) -> None:
    from ..cluster.requeue import requeue_check

    def check() -> int:
        try:
            return requeue_check(
                output_dir=output_dir, job_id=job_id, run_name=run_name, limit=limit, at_start=at_start
            )
        except (UserError, KeyboardInterrupt):
            raise
        except Exception as exc:  # never exit 1 by accident: Kubernetes' FailJob rule reads 1 as the limit
            if os.environ.get("TAEHV_TRACEBACK"):
                raise
            raise LaunchError(
                one_line(
                    f"requeue-check failed ({type(exc).__name__}: {exc}); rerun with TAEHV_TRACEBACK=1 to see where"
                )
            ) from None

    exit_with(check)
