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
from ..plan.text import check_path
from ..plan.resolve import Plan
from ..run.runs import THIS_RUN, run_id_for

JOB_NAME_RE = re.compile(r"^[a-z]([a-z0-9-]{0,50}[a-z0-9])?$")  # a DNS label, room for "-<index>"


@dataclass(frozen=True, kw_only=True)
class ClusterJob:
    name: str
    gpus: int
    profile: str
    nodes: int
    gpus_per_node: int
    output_dir: str
    argv: tuple[str, ...]  # the taehv-launch command of every node
    render_argv: tuple[str, ...]  # the render command that made the file (its header says how to redo it)
    shm_gib: int
    port: int

    run_name: str | None = None  # --run-name: the run every node continues; else each job is a run of its own
    max_requeues: int = 3  # max_requeues_without_progress: the requeue check's limit (0: none)

    @property
    def rendered_by(self) -> str:
        """The render command line, shell-quoted on one line, for the template's header."""
        return " ".join(one_line_word(a) for a in self.render_argv)

    def requeue_check(self, job_id: str, *, at_start: bool = False) -> list[str]:
        """The requeue check's command (cluster/requeue.py) for this job; `job_id` is the scheduler's
        job id as the file refers to it (a shell or Kubernetes variable), the caller's to quote."""
        argv = ["taehv-launch", "requeue-check", "--limit", str(self.max_requeues), "--job-id", job_id]
        argv += ["--output-dir", self.output_dir] + (["--run-name", self.run_name] if self.run_name else [])
        return argv + ["--at-start"] * at_start


def one_line_word(text: str) -> str:
    """`text` as one bash word on one line (a header comment must not end early, and each option
    of a command keeps its line): shlex.quote when every character prints, else bash's $'...' with
    the UTF-8 bytes of the others as \\xHH, which means the same bytes in every locale (bytes that
    were not UTF-8 come back as themselves)."""
    if text.isprintable():
        return shlex.quote(text)
    out = []
    for char in text:
        if char in "\\'":
            out.append("\\" + char)
        elif char.isprintable():
            out.append(char)
        elif 0xDC80 <= ord(char) <= 0xDCFF:  # surrogateescape: the byte the command line had
            out.append(f"\\x{ord(char) - 0xDC00:02x}")
        else:
            out.append(
                {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char)
                or "".join(f"\\x{b:02x}" for b in char.encode("utf-8", "surrogatepass"))
            )
    return "$'" + "".join(out) + "'"


def cluster_job(
    plan: Plan,
    *,
    sets: list[str],
    config: str | None,
    gpus_per_node: int | None,
    name: str | None,
    render_argv: list[str],
    run_name: str | None = None,
) -> ClusterJob:
    """sets: the user's --set items, `output_dir=...` included (render's --output-dir adds it)."""
    if plan.profile.device != "cuda":
        raise ConfigError(
            f"render makes GPU cluster jobs; the {plan.profile.name} profile runs here: "
            f"`taehv-launch {plan.gpus} {plan.profile.name}`"
        )
    output_dir = str(plan.config["output_dir"])
    check_path("output_dir", output_dir)
    if not PurePosixPath(output_dir).is_absolute():
        raise ConfigError(
            f"output_dir {output_dir!r} is not absolute: pass --output-dir /shared/path, a folder "
            f"every node mounts (run directories, checkpoints and the dead-rank watchdog's heartbeats live there)"
        )
    c = plan.config
    missing = [k for k in ("data_root", "ref_vae_path") if not c[k]]
    if c["latent_cache"] and c["latent_cache_encode"] == "never":
        missing = [k for k in missing if k != "ref_vae_path"]
    if missing:
        raise ConfigError(
            f"{' and '.join(missing)} must be set for a cluster job: add "
            + " ".join(f"--set {k}=/path/on/the/nodes" for k in missing)
        )
    max_requeues = c["max_requeues_without_progress"]
    if max_requeues < 0:
        raise ConfigError(
            f"max_requeues_without_progress={max_requeues}: use 0 (requeue without limit) or more; "
            f"the default 3 stops a job after 3 requeues in a row that saved no new checkpoint"
        )
    name = name or f"taehv-{plan.gpus}-{plan.profile.name}"
    if not JOB_NAME_RE.match(name):
        raise ConfigError(
            f"job name {name!r} must be lowercase letters, digits and '-', start with a letter and "
            f"be at most 52 characters (a Kubernetes DNS label with room for the pod index)"
        )
    topo = plan.topology
    argv = ["taehv-launch", str(plan.gpus), plan.profile.name]
    if config:
        argv += ["--config", config]
    for item in sets:
        argv += ["--set", item]
    if gpus_per_node is not None:
        argv += ["--gpus-per-node", str(gpus_per_node)]
    if run_name is not None:
        run_id_for(run_name, None)  # the same check every node makes, here once
        argv += ["--run-name", run_name]
    argv += ["--resume", THIS_RUN]
    return ClusterJob(
        name=name,
        gpus=plan.gpus,
        profile=plan.profile.name,
        nodes=topo.num_machines,
        gpus_per_node=topo.gpus_per_machine,
        output_dir=output_dir,
        argv=tuple(argv),
        render_argv=tuple(render_argv),
        shm_gib=max(1, math.ceil(shm_bytes(c, topo.gpus_per_machine) / 2**30)),
        port=topo.main_process_port,
        run_name=run_name,
        max_requeues=max_requeues,
    )
