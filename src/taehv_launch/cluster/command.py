"""The `render` command: build the plan as a cluster node would (no local environment read),
then print the SLURM or Kubernetes job that runs it."""

from __future__ import annotations

import sys
from dataclasses import replace

from ..run.request import Request, build_plan
from ..errors import ConfigError
from ..plan.configfile import parse_set
from ..plan.text import check_path, check_text
from .job import cluster_job

KINDS = ("slurm", "k8s")
SLURM_ONLY = ("partition", "account", "time", "signal_seconds")
K8S_ONLY = ("image", "pvc", "mount", "namespace", "grace_period", "restarts")


def render_job(kind: str, req: Request, **kw) -> int:
    sys.stdout.write(render_text(kind, req, **kw))
    return 0


def render_text(
    kind: str,
    req: Request,
    *,
    output_dir: str | None,
    job_name: str | None,
    render_argv: list[str],
    run_name: str | None = None,
    **kw,
) -> str:
    if kind not in KINDS:
        raise ConfigError(
            f"unknown cluster kind {kind!r}: use `taehv-launch render slurm ...` or `taehv-launch render k8s ...`"
        )
    other = SLURM_ONLY if kind == "k8s" else K8S_ONLY
    stray = [f"--{k.replace('_', '-')}" for k in other if kw.get(k) is not None]
    if stray:
        raise ConfigError(
            f"{', '.join(stray)} {'goes' if len(stray) == 1 else 'go'} with "
            f"`render {'slurm' if kind == 'k8s' else 'k8s'}`, not `render {kind}`"
        )
    for label, value in [("--set", s) for s in req.sets]:
        check_text(label, value)  # before the plan: a NUL byte breaks even a path lookup
    for label, value in [("--config", req.config), ("--output-dir", output_dir)]:
        if value:
            check_path(label, value)
    sets = [*req.sets, *([_set_item("output_dir", output_dir)] if output_dir else [])]
    req = replace(req, sets=sets)
    plan = build_plan(req, env={}, local=False)  # the nodes' plan: nothing from this machine's environment
    job = cluster_job(
        plan,
        sets=sets,
        config=req.config,
        gpus_per_node=req.gpus_per_node,
        name=job_name,
        render_argv=render_argv,
        run_name=run_name,
    )
    given = {k: v for k, v in kw.items() if v is not None}  # the rest take the render functions' defaults
    if kind == "slurm":
        from .slurm import render_slurm

        return render_slurm(job, **given)
    from .k8s import render_k8s

    for need, why in (
        ("image", "--image: a container image with taehv-launch and its dependencies installed"),
        (
            "pvc",
            "--pvc CLAIM: a ReadWriteMany PersistentVolumeClaim every pod mounts (the run directory must be shared)",
        ),
    ):
        if not given.get(need):
            raise ConfigError(f"render k8s needs {why}")
    return render_k8s(job, **given)


def _set_item(key: str, text: str) -> str:
    """KEY=VALUE as a person writes it: bare when it reads back as the same string, else quoted."""
    bare = f"{key}={text}"
    return bare if parse_set(bare)[1] == text else f"{key}={text!r}"
