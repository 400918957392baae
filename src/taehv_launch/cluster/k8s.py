"""`taehv-launch render k8s`: an indexed Job (one pod per node) and the headless Service that
gives pod 0 a name for the rendezvous.

Each pod runs `taehv-launch` as PID 1 (so a pod deletion's SIGTERM reaches it) with
JOB_COMPLETION_INDEX as its node rank, NNODES and MASTER_ADDR (pod 0 through the Service) and
JOB_NAME = <job name>-<the Job's uid> (downward API), which names the run directory on the shared
volume: a pod replaced within the Job keeps the run, the Job applied again (same name, new uid)
starts a new one, as a new SLURM job does. A stop signal makes the ranks save a checkpoint and
exit 75; the podFailurePolicy treats 75 (and evictions, preemption) as not the pod's fault, so the
pod is replaced without counting against backoffLimit, and its `--resume this-run` continues the
run. Pod 0's init container `taehv-launch requeue-check --at-start` (cluster/requeue.py) counts
those restarts in the run's requeue.json and exits 1 at the max_requeues_without_progress-th in a
row with no newer complete checkpoint: a FailJob rule on that exit fails the Job instead of
replacing pods forever. /dev/shm is a memory-backed emptyDir sized from the plan. Pure: returns the text.
podFailurePolicy and the Job's uid label on its pods need Kubernetes 1.27 or newer.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import PurePosixPath
from typing import Any

from ..errors import EXIT_FAILED, EXIT_RESUMABLE, ConfigError
from ..yamltext import yaml_text
from .job import ClusterJob, one_line_word

JOB_UID = "metadata.labels['batch.kubernetes.io/controller-uid']"  # the Job's uid, on each of its pods
CHECK = "requeue-check"  # the init container that counts restarts
JOB_ID = "$(JOB_NAME)"  # the requeue check's --job-id: Kubernetes puts the pod's JOB_NAME there
_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_NAMES = {  # option: (pattern, what Kubernetes accepts)
    "namespace": (re.compile(rf"^{_LABEL}$"), "a DNS label: lowercase letters, digits and '-', at most 63"),
    "pvc": (
        re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$"),
        "a DNS subdomain: lowercase letters, digits, '-' and '.', at most 253",
    ),
    "image": (
        re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,1023}$"),
        "an image reference such as registry.example.com/taehv-launch:1.0 (no spaces or quotes)",
    ),
}


def _check_names(**values: str | None) -> None:
    for key, value in values.items():
        pattern, what = _NAMES[key]
        if value and not pattern.match(value):
            raise ConfigError(f"--{key} {value!r} is not {what}")


# Where the claim may not be mounted: over the image's own system folders (`/`, `/usr`: the
# container would not find taehv-launch or Python) or anything under the ones the runtime fills
# (/dev, /proc, /sys: /dev/shm is the pod's memory volume, a second mount there is refused by the API).
SYSTEM_DIRS = ("/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/proc")
SYSTEM_DIRS += ("/root", "/run", "/sbin", "/sys", "/usr", "/var")
SYSTEM_TREES = ("/bin", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sbin", "/sys", "/usr")
SHM = "/dev/shm"


def check_mount(mount: str) -> None:
    if not mount.isprintable() or not PurePosixPath(mount).is_absolute():
        raise ConfigError(
            f"--mount {mount!r} is not an absolute path of printable characters: pass e.g. --mount /shared"
        )
    norm = posixpath.normpath("/" + mount.lstrip("/"))
    if norm in SYSTEM_DIRS or any(PurePosixPath(norm).is_relative_to(tree) for tree in SYSTEM_TREES):
        where = "the pod's /dev/shm memory volume" if PurePosixPath(norm).is_relative_to(SHM) else "the image's files"
        raise ConfigError(
            f"--mount {mount!r} would put the shared volume over {where}: mount it at a folder of its own, "
            f"e.g. --mount /shared"
        )


def literal(text: str) -> str:
    """`text` as Kubernetes passes it on in a command or env value: it expands $(VAR) there and reads
    $$ as $, so every $ of a user's value is doubled."""
    return text.replace("$", "$$")


def render_k8s(
    job: ClusterJob,
    *,
    image: str,
    pvc: str,
    mount: str = "/shared",
    namespace: str | None = None,
    grace_period: int = 300,
    restarts: int = 3,
) -> str:
    _check_names(namespace=namespace, pvc=pvc, image=image)
    check_mount(mount)
    if not PurePosixPath(job.output_dir).is_relative_to(mount):
        raise ConfigError(
            f"output_dir {job.output_dir!r} is not on the shared volume mounted at {mount}: pass "
            f"--output-dir {PurePosixPath(mount) / 'taehv-output'} (or --mount the folder that holds it)"
        )
    meta: dict[str, Any] = {"name": job.name} | ({"namespace": namespace} if namespace else {})
    labels = {"app.kubernetes.io/name": "taehv-launch", "app.kubernetes.io/instance": job.name}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta | {"labels": labels},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"job-name": job.name},
            "ports": [{"name": "rendezvous", "port": job.port}],
        },
    }
    env = {"NNODES": str(job.nodes), "MASTER_ADDR": f"{job.name}-0.{job.name}", "MASTER_PORT": str(job.port)}
    job_env = [  # JOB_NAME, the run's job id: unique per Job
        {"name": "JOB_UID", "valueFrom": {"fieldRef": {"fieldPath": JOB_UID}}},
        {"name": "JOB_NAME", "value": f"{job.name}-$(JOB_UID)"},
    ]
    shared = {"name": "shared", "mountPath": mount}
    check = {  # pod 0 counts the run's restarts; the others let their pod start (cluster/requeue.py)
        "name": CHECK,
        "image": image,
        "command": [  # the job id is ours, expanded by Kubernetes; the rest the user's, literal
            a if a == JOB_ID else literal(a) for a in job.requeue_check(JOB_ID, at_start=True)
        ],
        "env": job_env,
        "terminationMessagePolicy": "FallbackToLogsOnError",  # its one line in `kubectl describe pod`
        "volumeMounts": [shared],
    }
    container = {
        "name": "trainer",
        "image": image,
        "command": [literal(a) for a in job.argv],
        "env": [{"name": k, "value": v} for k, v in env.items()] + job_env,
        "ports": [{"containerPort": job.port, "name": "rendezvous"}],
        "resources": {"limits": {"nvidia.com/gpu": job.gpus_per_node}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, shared],
    }
    pod = {
        "subdomain": job.name,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": grace_period,
        "initContainers": [check],
        "containers": [container],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{job.shm_gib}Gi"}},
            {"name": "shared", "persistentVolumeClaim": {"claimName": pvc}},
        ],
    }
    job_obj = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta | {"labels": labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": job.nodes,
            "parallelism": job.nodes,
            "backoffLimit": restarts * job.nodes,
            "podFailurePolicy": {
                "rules": [
                    {  # the requeue check refused a restart: stop the whole Job, not only this pod
                        "action": "FailJob",
                        "onExitCodes": {"containerName": CHECK, "operator": "In", "values": [EXIT_FAILED]},
                    },
                    {
                        "action": "Ignore",
                        "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [EXIT_RESUMABLE]},
                    },
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                ]
            },
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }
    head = [
        f"taehv-launch {job.gpus} {job.profile} on Kubernetes: {job.nodes} pod(s) x {job.gpus_per_node} GPUs "
        f"(an indexed Job), one launcher per pod.",
        f"Rendered by: {job.rendered_by}",
        "Render it again rather than edit it. Start: kubectl apply -f <this file>; logs of node 0:",
        f"kubectl logs -f {job.name}-0-<suffix> (or `kubectl logs -f job/{job.name}`); the run:",
        f"{one_line_word(job.output_dir.rstrip('/') + '/')}{job.run_name or f'job-{job.name}-<uid>'}/ on the volume "
        f"'{pvc}' (ReadWriteMany: every pod mounts it)" + ("." if job.run_name else "; <uid> is the Job's:"),
        *(
            []
            if job.run_name
            else [
                f"kubectl get job {job.name} -o jsonpath='{{.metadata.uid}}'. A replaced pod "
                f"continues its Job's run; a Job applied again starts a new one."
            ]
        ),
        f"Exit {EXIT_RESUMABLE} (checkpoint saved after SIGTERM) and evictions replace the pod without counting",
        f"against backoffLimit ({restarts} failures per pod); each pod has {grace_period} s after SIGTERM to finish",
        "its step and save the checkpoint. Needs Kubernetes 1.27 or newer (podFailurePolicy, the Job uid label).",
        *(
            [
                f"Pod 0's init container {CHECK} counts its restarts in the run's requeue.json: once pod 0 has",
                f"restarted {job.max_requeues} times in a row with no newer checkpoint saved in between "
                f"(max_requeues_without_progress), it exits {EXIT_FAILED}",
                "and the Job fails (the FailJob rule);",
                f"why, in one line: kubectl logs <pod 0> -c {CHECK}, or the run's requeue.json.",
            ]
            if job.max_requeues
            else [
                f"Pod 0's init container {CHECK} counts its restarts in the run's requeue.json "
                "(max_requeues_without_progress=0: no limit)."
            ]
        ),
    ]
    return (
        "\n".join(f"# {line}" for line in head)
        + "\n"
        + yaml_text(service, plain=True)
        + "---\n"
        + yaml_text(job_obj, plain=True)
    )
