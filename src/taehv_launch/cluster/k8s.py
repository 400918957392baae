"""`taehv-launch render k8s`: an indexed Job (one pod per node) and the headless Service that
gives pod 0 a name for the rendezvous.

Each pod runs `taehv-launch` as PID 1 (so a pod deletion's SIGTERM reaches it) with
JOB_COMPLETION_INDEX as its node rank, NNODES and MASTER_ADDR (pod 0 through the Service) and
JOB_NAME, which names the run directory on the shared volume. A stop signal makes the ranks
save a checkpoint and exit 75; the podFailurePolicy treats 75 (and evictions, preemption) as not
the pod's fault, so the pod is replaced without counting against backoffLimit, and its
`--resume this-run` continues the run. /dev/shm is a memory-backed emptyDir sized from the plan.
Pure: returns the text. podFailurePolicy needs Kubernetes 1.26 or newer.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from ..errors import EXIT_RESUMABLE, ConfigError
from ..yamltext import yaml_text
from .job import ClusterJob


def render_k8s(job: ClusterJob, *, image: str, pvc: str, mount: str = "/shared", namespace: str | None = None,
               grace_period: int = 300, restarts: int = 3) -> str:
    if not PurePosixPath(mount).is_absolute() or not PurePosixPath(job.output_dir).is_relative_to(mount):
        raise ConfigError(f"output_dir {job.output_dir} is not on the shared volume mounted at {mount}: pass "
                          f"--output-dir {PurePosixPath(mount) / 'taehv-output'} (or --mount the folder that holds it)")
    meta: dict[str, Any] = {"name": job.name} | ({"namespace": namespace} if namespace else {})
    labels = {"app.kubernetes.io/name": "taehv-launch", "app.kubernetes.io/instance": job.name}
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": meta | {"labels": labels},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": {"job-name": job.name},
                 "ports": [{"name": "rendezvous", "port": job.port}]},
    }
    env = {"NNODES": str(job.nodes), "MASTER_ADDR": f"{job.name}-0.{job.name}", "MASTER_PORT": str(job.port),
           "JOB_NAME": job.name}
    container = {
        "name": "trainer", "image": image, "command": list(job.argv),
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "ports": [{"containerPort": job.port, "name": "rendezvous"}],
        "resources": {"limits": {"nvidia.com/gpu": job.gpus_per_node}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "shared", "mountPath": mount}],
    }
    pod = {
        "subdomain": job.name, "restartPolicy": "Never", "terminationGracePeriodSeconds": grace_period,
        "containers": [container],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{job.shm_gib}Gi"}},
                    {"name": "shared", "persistentVolumeClaim": {"claimName": pvc}}],
    }
    job_obj = {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": meta | {"labels": labels},
        "spec": {
            "completionMode": "Indexed", "completions": job.nodes, "parallelism": job.nodes,
            "backoffLimit": restarts * job.nodes,
            "podFailurePolicy": {"rules": [
                {"action": "Ignore", "onExitCodes": {"containerName": "trainer", "operator": "In",
                                                     "values": [EXIT_RESUMABLE]}},
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
            ]},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }
    head = [
        f"taehv-launch {job.gpus} {job.profile} on Kubernetes: {job.nodes} pod(s) x {job.gpus_per_node} GPUs "
        f"(an indexed Job), one launcher per pod.",
        f"Rendered by: {job.rendered_by}",
        "Render it again rather than edit it. Start: kubectl apply -f <this file>; logs of node 0:",
        f"kubectl logs -f {job.name}-0-<suffix> (or `kubectl logs -f job/{job.name}`); the run:",
        f"{job.output_dir}/job-{job.name}/ on the volume '{pvc}' (ReadWriteMany: every pod mounts it).",
        f"Exit {EXIT_RESUMABLE} (checkpoint saved after SIGTERM) and evictions replace the pod without counting",
        f"against backoffLimit ({restarts} failures per pod); each pod has {grace_period} s after SIGTERM to finish",
        "its step and save the checkpoint. podFailurePolicy needs Kubernetes 1.26 or newer.",
    ]
    return ("\n".join(f"# {line}" for line in head) + "\n" + yaml_text(service, plain=True) + "---\n"
            + yaml_text(job_obj, plain=True))
