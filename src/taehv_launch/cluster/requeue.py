"""`taehv-launch requeue-check`: the requeue limit the rendered jobs apply (#25). The sbatch script
runs it when its srun step ends with exit 75, before `scontrol requeue`; the Kubernetes Job runs it
as pod 0's init container at every start. It names the run directory exactly as each node's
launcher does (--run-name, else the scheduler's job id, under output_dir), keeps the count in the
run's requeue.json (rundir/requeue.py decides), prints one line and exits 0 (requeue, or let the
pod start) or 1 (stop: max_requeues_without_progress requeues in a row found no new checkpoint).
Exit 1 is only ever that refusal (Kubernetes' FailJob rule reads it as one): an unreadable
requeue.json is kept aside and counted afresh with a note, a bad argument exits 2. --at-start makes
the run directory (and output_dir) when missing: the first start of a run on a fresh volume.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ..errors import EXIT_FAILED, EXIT_OK, ConfigError, one_line
from ..rundir import requeue
from ..run.runs import run_id_for


def requeue_check(
    *,
    output_dir: str,
    job_id: str | None,
    run_name: str | None,
    limit: int,
    at_start: bool,
    env: Mapping[str, str] | None = None,
) -> int:
    env = os.environ if env is None else env
    if limit < 0:
        raise ConfigError(f"--limit {limit}: use 0 (no limit) or more ({requeue.KEY})")
    if not output_dir.strip():
        raise ConfigError("--output-dir is empty: give the job's output_dir (the folder its run directories are in)")
    if not run_name and not job_id:
        raise ConfigError("requeue-check needs --job-id (the scheduler's job id) or --run-name: it names the run")
    run_id, _ = run_id_for(run_name, job_id)
    run_dir = Path(output_dir).expanduser().resolve() / run_id  # the launcher's run directory (run/request.py)
    job = job_id or run_id
    if at_start:
        index = env.get("JOB_COMPLETION_INDEX", "")
        if index not in ("", "0"):
            print(one_line(f"taehv-launch: pod {index}: pod 0 counts the restarts of run {run_dir}"), flush=True)
            return EXIT_OK
        again = (
            f"delete the failed Job and apply the same file again to continue run {run_id}"
            if run_name
            else f"continue this run with a Job rendered with --run-name {run_id}"
        )
        go, line = requeue.at_start(run_dir, limit, job=job, again=again)
    else:
        again = (
            f"submit the same job file again to continue run {run_id}"
            if run_name
            else f"continue this run with a job rendered with --run-name {run_id}"
        )
        go, line = requeue.after_stop(run_dir, limit, job=job, again=again)
    print(line, flush=True)
    return EXIT_OK if go else EXIT_FAILED
