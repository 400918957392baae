"""What a cluster template needs from the plan: nodes, GPUs per node, /dev/shm, and the one
`taehv-launch` command every node runs. Pure: the render command builds the plan, this shapes it.

The command in a template is the user's own request (GPU count, profile, --config, every --set,
--gpus-per-node; render's --output-dir becomes `--set output_dir=...`) plus `--resume this-run`:
each node resolves exactly the plan `render` printed, and a requeued job or restarted pod
continues its own run (named by the scheduler's job id) and never another one.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

from ..errors import ConfigError
from ..plan.memory import shm_bytes
from ..plan.resolve import Plan
from ..run.runs import THIS_RUN

JOB_NAME_RE = re.compile(r"^[a-z]([a-z0-9-]{0,50}[a-z0-9])?$")   # a DNS label, room for "-<index>"


@dataclass(frozen=True, kw_only=True)
class ClusterJob:
    name: str
    gpus: int
    profile: str
    nodes: int
    gpus_per_node: int
    output_dir: str
    argv: tuple[str, ...]          # the taehv-launch command of every node
    render_argv: tuple[str, ...]   # the render command that made the file (its header says how to redo it)
    shm_gib: int
    port: int

    @property
    def rendered_by(self) -> str:
        """The render command line, shell-quoted, for the template's header."""
        return " ".join(shlex.quote(a) for a in self.render_argv)


def cluster_job(plan: Plan, *, sets: list[str], config: str | None, gpus_per_node: int | None,
                name: str | None, render_argv: list[str]) -> ClusterJob:
    """sets: the user's --set items, `output_dir=...` included (render's --output-dir adds it)."""
    if plan.profile.device != "cuda":
        raise ConfigError(f"render makes GPU cluster jobs; the {plan.profile.name} profile runs here: "
                          f"`taehv-launch {plan.gpus} {plan.profile.name}`")
    output_dir = str(plan.config["output_dir"])
    if not PurePosixPath(output_dir).is_absolute():
        raise ConfigError(f"output_dir {output_dir!r} is not absolute: pass --output-dir /shared/path, a folder "
                          f"every node mounts (run directories, checkpoints and the dead-rank watchdog's heartbeats live there)")
    c = plan.config
    missing = [k for k in ("data_root", "ref_vae_path") if not c[k]]
    if c["latent_cache"] and c["latent_cache_encode"] == "never":
        missing = [k for k in missing if k != "ref_vae_path"]
    if missing:
        raise ConfigError(f"{' and '.join(missing)} must be set for a cluster job: add "
                          + " ".join(f"--set {k}=/path/on/the/nodes" for k in missing))
    name = name or f"taehv-{plan.gpus}-{plan.profile.name}"
    if not JOB_NAME_RE.match(name):
        raise ConfigError(f"job name {name!r} must be lowercase letters, digits and '-', start with a letter and "
                          f"be at most 52 characters (a Kubernetes DNS label with room for the pod index)")
    topo = plan.topology
    argv = ["taehv-launch", str(plan.gpus), plan.profile.name]
    if config:
        argv += ["--config", config]
    for item in sets:
        argv += ["--set", item]
    if gpus_per_node is not None:
        argv += ["--gpus-per-node", str(gpus_per_node)]
    argv += ["--resume", THIS_RUN]
    return ClusterJob(name=name, gpus=plan.gpus, profile=plan.profile.name, nodes=topo.num_machines,
                      gpus_per_node=topo.gpus_per_machine, output_dir=output_dir, argv=tuple(argv),
                      render_argv=tuple(render_argv), shm_gib=max(1, math.ceil(shm_bytes(c, topo.gpus_per_machine) / 2**30)),
                      port=topo.main_process_port)
