"""`taehv-launch render slurm`: an sbatch script that runs one launcher per node and requeues itself.

Preemption follows the launcher's reliability path (docs/troubleshooting.md): SLURM sends SIGUSR1
to every process of the step `signal_seconds` seconds before the time limit (and SIGTERM on preemption
or scancel); the ranks finish their step, save a checkpoint and exit 75; the script then puts
the job back in the queue, unless `taehv-launch requeue-check` (cluster/requeue.py) refuses: the
max_requeues_without_progress-th requeue in a row that found no newer complete checkpoint (the
script then exits 1). The requeued job keeps its job id, so the same run directory, and its
`--resume this-run` continues from that checkpoint. Pure: returns the text.
"""

from __future__ import annotations

import re

from ..errors import EXIT_RESUMABLE, ConfigError
from .job import ClusterJob, one_line_word

# What an #SBATCH value may hold: sbatch reads the directive line itself (no shell quoting), so
# a space, quote, '#' or line break cannot be carried; partition/account names and times never need one.
_DIRECTIVE = {
    "partition": (re.compile(r"^[A-Za-z0-9_.,-]{1,256}$"), "letters, digits and _ . , -"),
    "account": (re.compile(r"^[A-Za-z0-9_.-]{1,256}$"), "letters, digits and _ . -"),
    "time": (
        re.compile(r"^(?:[0-9][0-9:-]{0,30}|UNLIMITED|infinite)$"),
        "a SLURM time such as 24:00:00, 2-00:00:00 or 90",
    ),
}


def render_slurm(
    job: ClusterJob,
    *,
    partition: str | None = None,
    account: str | None = None,
    time: str | None = None,
    signal_seconds: int = 120,
) -> str:
    for key, value in (("partition", partition), ("account", account), ("time", time)):
        pattern, what = _DIRECTIVE[key]
        if value and not pattern.match(value):
            raise ConfigError(f"--{key} {value!r} cannot go on an #SBATCH line: use {what}")
    sbatch = [
        f"--job-name={job.name}",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",
        f"--gpus-per-node={job.gpus_per_node}",
        "--exclusive",
        "--mem=0",
    ]
    sbatch += [f"--partition={partition}"] * bool(partition) + [f"--account={account}"] * bool(account)
    sbatch += [f"--time={time}"] * bool(time)
    sbatch += [f"--signal=USR1@{signal_seconds}", "--requeue", "--open-mode=append", "--output=slurm-%x-%j.out"]
    cmd = " \\\n    ".join(_lines(job.argv))
    words = job.requeue_check("$SLURM_JOB_ID")
    check = " \\\n        ".join(_lines(tuple(words), first=2, shell_var=words.index("--job-id") + 1))
    limit_words = (
        f"Requeue, unless\n# this is attempt {job.max_requeues} in a row that ended without a newer checkpoint "
        f"(max_requeues_without_progress):\n# requeue-check keeps the count in the run's requeue.json, prints one "
        f"line and exits 1 to stop."
        if job.max_requeues
        else "Requeue\n# (max_requeues_without_progress=0: no limit); requeue-check still counts in the run's "
        "requeue.json."
    )
    run = job.run_name or "job-<jobid>"
    return f"""#!/bin/bash
# taehv-launch {job.gpus} {job.profile} on SLURM: {job.nodes} node(s) x {job.gpus_per_node} GPUs, one launcher per node.
# Rendered by: {job.rendered_by}
# Render it again rather than edit it. Submit: sbatch <this file>. Log: slurm-{job.name}-<jobid>.out;
# the run: {one_line_word(job.output_dir.rstrip("/") + "/")}{run}/ (launch.log, checkpoints, REQUEUE, requeue.json).
{chr(10).join(f"#SBATCH {s}" for s in sbatch)}
set -uo pipefail

# A rendezvous port of this job's own (two jobs on one node cannot both take 29500). Node count,
# node rank and the main node (first host of the node list) come from srun's SLURM_* variables.
export MASTER_PORT=$(( 20000 + SLURM_JOB_ID % 20000 ))
echo "taehv-launch: job $SLURM_JOB_ID, attempt $(( ${{SLURM_RESTART_COUNT:-0}} + 1 )), nodes $SLURM_JOB_NODELIST"

# One task per node with every CPU of the node (srun would otherwise bind it to one core).
# --resume {job.argv[-1]}: continue this job's own run after a requeue; start fresh the first time.
srun --ntasks-per-node=1 --cpus-per-task="$SLURM_CPUS_ON_NODE" \\
    {cmd}
code=$?

# {EXIT_RESUMABLE}: stopped by SIGUSR1 (time limit) or SIGTERM (preemption) after saving a checkpoint. {limit_words}
if [ "$code" -eq {EXIT_RESUMABLE} ]; then
    if {check}; then
        scontrol requeue "$SLURM_JOB_ID"
    else
        code=$?
    fi
fi
exit "$code"
"""


def _lines(argv: tuple[str, ...], first: int = 3, shell_var: int | None = None) -> list[str]:
    """The command with each option and its value on a line of their own (a value with a line
    break is written $'...\\n...', so no line of the script is part of a value); the first `first`
    words on the first line. argv[shell_var] is a shell variable's name ($NAME): written "$NAME"."""
    words = [f'"{a}"' if i == shell_var else one_line_word(a) for i, a in enumerate(argv)]
    lines, i = [" ".join(words[:first])], first
    while i < len(words):
        take = 2 if words[i].startswith("--") and i + 1 < len(words) and not words[i + 1].startswith("--") else 1
        lines.append(" ".join(words[i : i + take]))
        i += take
    return lines
