"""`taehv-launch render slurm|k8s`: the shipped jobs (docs/cluster/) are current, pass `bash -n` /
parse as YAML, and each node's `taehv-launch` line, run under the environment SLURM or Kubernetes
gives it, resolves to the right node rank, main node, port and run directory (real CLI, --dry-run)."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, assert_one_line_error, clean_env, overrides, run_cli_here
from test_resume import fake_checkpoint

from taehv_launch.gen.examples import EXAMPLES
from taehv_launch.plan.memory import shm_bytes
from taehv_launch.run.runs import resolve_resume

CLUSTER = REPO / "docs" / "cluster"
FAKE_SRUN = r"""#!/bin/bash
# sbatch's srun for tests: one task per node, in turn, with the variables a real step sets;
# each node's command runs with --dry-run --json and its plan goes to $FAKE_OUT/node<k>.json.
while [[ "$1" == --* ]]; do echo "$1" >> "$FAKE_OUT/srun_options"; shift; done
n=$SLURM_JOB_NUM_NODES
for ((i = 0; i < n; i++)); do
  SLURM_NODEID=$i SLURM_PROCID=$i SLURM_LOCALID=0 SLURM_STEP_NUM_NODES=$n SLURM_STEP_NUM_TASKS=$n \
  SLURM_STEP_NODELIST=$SLURM_JOB_NODELIST SLURM_STEP_ID=0 "$@" --dry-run --json > "$FAKE_OUT/node$i.json" || exit $?
done
exit "${FAKE_SRUN_EXIT:-0}"
"""
FAKE_SCONTROL = """#!/bin/bash
echo "$@" >> "$FAKE_OUT/scontrol"
"""


def _exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _bin_dir(tmp: Path) -> Path:
    """fake srun/scontrol, and `taehv-launch` as this interpreter's (the venv's may not be on PATH)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    _exe(bin_dir / "srun", FAKE_SRUN)
    _exe(bin_dir / "scontrol", FAKE_SCONTROL)
    _exe(bin_dir / "taehv-launch", f'#!/bin/bash\nexec {shlex.quote(sys.executable)} -m taehv_launch.cli "$@"\n')
    return bin_dir


JOB_UID_LABEL = "metadata.labels['batch.kubernetes.io/controller-uid']"


def _pod_env(container: dict, uid: str, index: int) -> dict[str, str]:
    """The container's environment in a pod of the Job with this uid, as the kubelet makes it: the
    Job controller labels every pod with the Job's uid, and `$(VAR)` expands earlier entries."""
    env: dict[str, str] = {}
    for entry in container["env"]:
        if "valueFrom" in entry:
            assert entry["valueFrom"] == {"fieldRef": {"fieldPath": JOB_UID_LABEL}}
            env[entry["name"]] = uid
        else:
            env[entry["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), entry["value"])
    return env | {"JOB_COMPLETION_INDEX": str(index)}


def _render(*args: str) -> str:
    proc = run_cli_here("render", *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_shipped_cluster_job_passes_its_syntax_check(name):
    path = REPO / name
    if path.suffix == ".sbatch":
        subprocess.run(["bash", "-n", str(path)], check=True)
    else:
        docs = list(yaml.safe_load_all(path.read_text()))
        assert [d["kind"] for d in docs] == ["Service", "Job"]


@pytest.mark.parametrize("gpus,nodes", [(16, 2), (64, 8)])
def test_sbatch_under_a_fake_slurm_resolves_every_node(tmp_path, gpus, nodes):
    script = CLUSTER / f"slurm-{gpus}-h100.sbatch"
    text = script.read_text()
    assert f"#SBATCH --nodes={nodes}\n" in text and "#SBATCH --gpus-per-node=8\n" in text
    assert "#SBATCH --signal=USR1@120\n" in text and "#SBATCH --requeue\n" in text
    out = tmp_path / "out"
    out.mkdir()
    env = clean_env(
        PATH=f"{_bin_dir(tmp_path)}:{os.environ['PATH']}",
        FAKE_OUT=str(out),
        SLURM_JOB_ID="4242",
        SLURM_JOB_NUM_NODES=str(nodes),
        SLURM_NNODES=str(nodes),
        SLURM_JOB_NODELIST=f"gpu[017-{16 + nodes:03d}]",
        SLURM_CPUS_ON_NODE="96",
        SLURM_RESTART_COUNT="0",
    )
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "--cpus-per-task=96" in (out / "srun_options").read_text()
    assert not (out / "scontrol").exists()
    plans = [json.loads((out / f"node{i}.json").read_text()) for i in range(nodes)]
    # the plan render resolved for the job, on this machine
    expect = json.loads(
        run_cli_here(
            str(gpus),
            "h100",
            "--dry-run",
            "--json",
            "--run-name",
            "x",
            *overrides(
                "data_root=/shared/videos output_dir=/shared/taehv", "ref_vae_path=/shared/models/cogvideox-vae"
            ),
            env=clean_env(),
        ).stdout
    )
    for i, plan in enumerate(plans):
        topo = plan["topology"]
        assert (topo["num_machines"], topo["machine_rank"], topo["gpus_per_machine"]) == (nodes, i, 8)
        assert topo["main_process_ip"] == "gpu017" and topo["main_process_port"] == 20000 + 4242 % 20000
        assert topo["ranks"] == list(range(8 * i, 8 * i + 8)) and topo["world_size"] == gpus
        assert topo["source"] == "slurm" and topo["job_id"] == "4242"
        assert plan["run_dir"] == "/shared/taehv/job-4242"
        assert plan["config"] == expect["config"]  # overrides included, the same on every node
        assert plan["accelerate"]["gpu_ids"] == "0,1,2,3,4,5,6,7"
        assert any("this-run" in n and "starting from scratch" in n for n in plan["notes"])


@pytest.mark.parametrize("code,requeued", [(75, True), (1, False)])
def test_sbatch_requeues_itself_only_after_a_checkpointed_stop(tmp_path, code, requeued):
    out = tmp_path / "out"
    out.mkdir()
    env = clean_env(
        PATH=f"{_bin_dir(tmp_path)}:{os.environ['PATH']}",
        FAKE_OUT=str(out),
        SLURM_JOB_ID="77",
        SLURM_JOB_NUM_NODES="2",
        SLURM_NNODES="2",
        SLURM_JOB_NODELIST="n[1-2]",
        SLURM_CPUS_ON_NODE="8",
        FAKE_SRUN_EXIT=str(code),
    )
    proc = subprocess.run(
        ["bash", str(CLUSTER / "slurm-16-h100.sbatch")], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == code, proc.stderr
    assert (
        ((out / "scontrol").read_text().split() == ["requeue", "77"]) if requeued else not (out / "scontrol").exists()
    )
    # the requeue check ran (tests/test_requeue.py runs it on a run directory; /shared/taehv is not one here)
    assert ("taehv-launch: requeueing job 77 (no run directory /shared/taehv/job-77" in proc.stdout) == requeued


@pytest.mark.parametrize("gpus,nodes", [(16, 2), (64, 8)])
def test_k8s_job_parses_and_every_pod_resolves_its_node(tmp_path, gpus, nodes):
    service, job = yaml.safe_load_all((CLUSTER / f"k8s-{gpus}-h100.yaml").read_text())
    name = f"taehv-{gpus}-h100"
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["selector"] == {"job-name": name}
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", nodes, nodes)
    rules = spec["podFailurePolicy"]["rules"]
    assert {"action": "Ignore", "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [75]}} in rules
    assert rules[0] == {  # the requeue limit: pod 0's init container refused a restart
        "action": "FailJob",
        "onExitCodes": {"containerName": "requeue-check", "operator": "In", "values": [1]},
    }
    pod = spec["template"]["spec"]
    (check,) = pod["initContainers"]
    assert check["command"][:2] == ["taehv-launch", "requeue-check"] and "--at-start" in check["command"]
    assert pod["subdomain"] == name and pod["restartPolicy"] == "Never" and pod["terminationGracePeriodSeconds"] >= 120
    (container,) = pod["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 8}
    env = {e["name"]: e.get("value") or e["valueFrom"] for e in container["env"]}
    assert env == {
        "NNODES": str(nodes),
        "MASTER_ADDR": f"{name}-0.{name}",
        "MASTER_PORT": "29500",
        "JOB_UID": {"fieldRef": {"fieldPath": JOB_UID_LABEL}},
        "JOB_NAME": f"{name}-$(JOB_UID)",
    }
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts == {"dshm": "/dev/shm", "shared": "/shared"}
    assert volumes["shared"]["persistentVolumeClaim"] == {"claimName": "taehv-shared"}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    argv = container["command"]
    assert argv[:3] == ["taehv-launch", str(gpus), "h100"] and argv[-2:] == ["--resume", "this-run"]
    bin_dir = _bin_dir(tmp_path)
    for index in sorted({0, 1, nodes - 1}):
        pod_env = clean_env(**_pod_env(container, "5f0c-uid", index), HOSTNAME=f"{name}-{index}-x7k2p")
        proc = subprocess.run(
            [str(bin_dir / "taehv-launch"), *argv[1:], "--dry-run", "--json"],
            env=pod_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        plan = json.loads(proc.stdout)
        topo = plan["topology"]
        assert (topo["num_machines"], topo["machine_rank"], topo["source"]) == (
            nodes,
            index,
            "kubernetes (JOB_COMPLETION_INDEX)",
        )
        assert topo["main_process_ip"] == f"{name}-0.{name}" and topo["ranks"][0] == 8 * index
        assert plan["run_dir"] == f"/shared/taehv/job-{name}-5f0c-uid"
        shm = shm_bytes(plan["config"], topo["gpus_per_machine"])
        size = volumes["dshm"]["emptyDir"]["sizeLimit"]
        assert size.endswith("Gi") and shm <= int(size[:-2]) * 2**30 < shm + 2**30


def _pod_plan(container: dict, uid: str, index: int = 0) -> dict:
    proc = run_cli_here(
        *container["command"][1:], "--dry-run", "--json", env=clean_env(**_pod_env(container, uid, index))
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_k8s_job_applied_again_is_a_new_run(tmp_path):
    """The run id is the Job's uid (#29): a pod replaced within the Job continues the run, the same
    manifest applied again later (same Job name, new uid) starts a new one, as docs/resume.md says."""
    out = tmp_path / "runs"
    args = [
        "k8s",
        "16",
        "h100",
        "--output-dir",
        str(out),
        "--mount",
        str(tmp_path),
        *overrides("data_root=/d ref_vae_path=/v"),
        "--image",
        "img:1",
        "--pvc",
        "c",
    ]
    _, job = yaml.safe_load_all(_render(*args))
    (container,) = job["spec"]["template"]["spec"]["containers"]
    first, again = _pod_plan(container, "uid-a"), _pod_plan(container, "uid-b")
    assert first["run_dir"] == str(out / "job-taehv-16-h100-uid-a") and first["run_id_source"] == "scheduler job id"
    assert again["run_dir"] == str(out / "job-taehv-16-h100-uid-b")
    ck = fake_checkpoint(out / "job-taehv-16-h100-uid-a", 40)
    (ck / "trainer_state.json").write_text(
        json.dumps(
            {"step": 40, "world_size": 16, "config": first["config"], "zero_stage": first["config"]["zero_stage"]}
        )
    )
    assert _pod_plan(container, "uid-a", 1)["resume"] == str(ck)  # a replaced pod: same Job, same run
    assert _pod_plan(container, "uid-b")["resume"] is None  # a new Job: never the old run's checkpoint
    _, named = yaml.safe_load_all(_render(*args, "--run-name", "long-run"))
    (container,) = named["spec"]["template"]["spec"]["containers"]
    for uid in ("uid-a", "uid-b"):  # --run-name: one run across Jobs
        plan = _pod_plan(container, uid)
        assert plan["run_dir"] == str(out / "long-run") and plan["run_id_source"] == "--run-name"


def test_render_passes_the_users_request_through(tmp_path):
    cfg = tmp_path / "mine.py"
    cfg.write_text("args = {'learning_rate': 3e-4}\n")
    text = _render(
        "slurm",
        "16",
        "h100",
        "--config",
        str(cfg),
        "--output-dir",
        "/nfs/runs",
        *overrides("data_root=/nfs/data with space", "ref_vae_path=/nfs/vae max_train_steps=5000"),
        "--gpus-per-node",
        "4",
        "--job-name",
        "mine",
        "--account",
        "proj",
        "--time",
        "2:00:00",
    )
    assert "#SBATCH --nodes=4\n" in text and "#SBATCH --gpus-per-node=4\n" in text
    assert "#SBATCH --job-name=mine\n" in text and "#SBATCH --account=proj\n" in text
    line = text.split("\nsrun ", 1)[1].split("\ncode=")[0].replace("\\\n", " ")
    argv = shlex.split(line)[2:]
    assert argv[:5] == ["taehv-launch", "16", "h100", "--config", str(cfg)]
    for item in ("data_root=/nfs/data with space", "max_train_steps=5000", "output_dir=/nfs/runs"):
        assert item in argv
    assert argv[argv.index("--gpus-per-node") + 1] == "4"
    k8s = _render(
        "k8s",
        "16",
        "h100",
        "--output-dir",
        "/mnt/s/runs",
        *overrides("data_root=/d ref_vae_path=/v"),
        "--image",
        "img:1",
        "--pvc",
        "c",
        "--mount",
        "/mnt/s",
        "--namespace",
        "ml",
        "--grace-period",
        "600",
        "--restarts",
        "5",
    )
    service, job = yaml.safe_load_all(k8s)
    assert service["metadata"]["namespace"] == job["metadata"]["namespace"] == "ml"
    assert job["spec"]["backoffLimit"] == 10 and job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 600


def test_a_cache_run_needs_no_reference_vae_path():
    text = _render("slurm", "16", "h100", "--output-dir", "/s", *overrides("data_root=/d latent_cache=/s/lc"))
    assert "latent_cache=/s/lc" in text


@pytest.mark.parametrize(
    "args,match",
    [
        (["slurm", "1", "cpu", "--output-dir", "/s"], "cpu profile runs here"),
        (
            ["slurm", "16", "h100", *overrides("data_root=/d ref_vae_path=/v")],
            "output_dir 'output' is not absolute",
        ),
        (
            ["slurm", "16", "h100", "--output-dir", "runs", *overrides("data_root=/d ref_vae_path=/v")],
            "not absolute",
        ),
        (["slurm", "16", "h100", "--output-dir", "/s"], "data_root and ref_vae_path must be set"),
        (
            [
                "k8s",
                "16",
                "h100",
                "--output-dir",
                "/shared/r",
                *overrides("data_root=/d ref_vae_path=/v"),
                "--pvc",
                "c",
            ],
            "needs --image",
        ),
        (
            [
                "k8s",
                "16",
                "h100",
                "--output-dir",
                "/shared/r",
                *overrides("data_root=/d ref_vae_path=/v"),
                "--image",
                "i",
            ],
            "needs --pvc",
        ),
        (
            [
                "k8s",
                "16",
                "h100",
                "--output-dir",
                "/elsewhere",
                *overrides("data_root=/d ref_vae_path=/v"),
                "--image",
                "i",
                "--pvc",
                "c",
            ],
            "not on the shared volume mounted at /shared",
        ),
        (
            [
                "slurm",
                "16",
                "h100",
                "--output-dir",
                "/s",
                *overrides("data_root=/d ref_vae_path=/v"),
                "--image",
                "i",
            ],
            "--image goes with `render k8s`",
        ),
        (["k8s", "16", "h100", "--time", "1:00:00"], "--time goes with `render slurm`"),
        (
            [
                "slurm",
                "16",
                "h100",
                "--output-dir",
                "/s",
                *overrides("data_root=/d ref_vae_path=/v"),
                "--job-name",
                "Bad_Name",
            ],
            "job name 'Bad_Name'",
        ),
        (["pbs", "16", "h100"], "unknown cluster kind 'pbs'"),
        (
            ["slurm", "12", "h100", "--output-dir", "/s", *overrides("data_root=/d ref_vae_path=/v")],
            "not a whole number of nodes",
        ),
        (["slurm", "16", "h100", "--output-dir", "/s", "--set", "nope=1"], "nope"),
    ],
)
def test_bad_render_inputs_are_one_line(args, match):
    assert_one_line_error(run_cli_here("render", *args), match)


def test_resume_this_run_stays_in_its_own_run(tmp_path):
    out = tmp_path / "output"
    fake_checkpoint(out / "other-run", 50)
    assert resolve_resume("this-run", out, out / "job-7")[0] is None  # never another run's checkpoint
    assert resolve_resume("auto", out, out / "job-7")[0] is None  # a named run: its own only (#29)
    assert resolve_resume("auto", out, None)[0] == out / "other-run" / "checkpoint-50"  # unnamed: the newest run
    ck = fake_checkpoint(out / "job-7", 20)
    assert resolve_resume("this-run", out, out / "job-7")[0] == ck
    proc = run_cli_here("1", "cpu", "--dry-run", "--resume", "this-run", "--set", f"output_dir={out}")
    assert_one_line_error(proc, "--resume this-run needs a named run")
    proc = run_cli_here(
        "1", "cpu", "--dry-run", "--json", "--resume", "this-run", "--run-name", "job-8", "--set", f"output_dir={out}"
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["resume"] is None and any("job-8 yet; starting from scratch" in n for n in plan["notes"])


def test_dry_run_json_shows_a_nodes_place_in_the_job():
    proc = run_cli_here(
        "16",
        "h100",
        "--dry-run",
        "--json",
        "--node-rank",
        "1",
        "--num-nodes",
        "2",
        "--master-addr",
        "node0.cluster",
        "--run-name",
        "r",
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["topology"]["ranks"] == list(range(8, 16)) and plan["topology"]["world_size"] == 16
    assert plan["topology"]["main_process_ip"] == "node0.cluster" and plan["run_id_source"] == "--run-name"


def _k8s(*extra: str):
    from conftest import run_cli_here

    args = ["render", "k8s", "16", "h100", "--image", "img:1", "--pvc", "claim", "--set", "ref_vae_path=/v"]
    return run_cli_here(*args, *extra)


@pytest.mark.parametrize("mount", ["/dev/shm", "/", "/usr", "/usr/", "//usr", "/dev", "/proc/x", "/usr/local"])
def test_k8s_refuses_a_mount_over_the_image_or_shm(mount):
    from conftest import assert_one_line_error

    out = mount.rstrip("/") + "/out"
    proc = _k8s("--mount", mount, "--output-dir", out, "--set", "data_root=/d")
    assert_one_line_error(proc, r"--mount .* would put the shared volume over .*: mount it at a folder of its own")


def test_k8s_mount_paths_are_unique_and_user_values_reach_the_pod_literally():
    import yaml

    value = "/d/$(JOB_NAME)/$$x/$HOME"
    proc = _k8s("--mount", "/mnt/shared", "--output-dir", "/mnt/shared/o$(NNODES)", "--set", f"data_root={value}")
    assert proc.returncode == 0, proc.stderr
    _, job = yaml.safe_load_all("apiVersion: v1\n" + proc.stdout.partition("\napiVersion: v1\n")[2])
    pod = job["spec"]["template"]["spec"]
    for c in pod["containers"] + pod["initContainers"]:
        paths = [m["mountPath"] for m in c["volumeMounts"]]
        assert len(paths) == len(set(paths)), paths
    (trainer,), (check,) = pod["containers"], pod["initContainers"]
    assert "data_root=/d/$$(JOB_NAME)/$$$$x/$$HOME" in trainer["command"]  # Kubernetes reads $$ as $
    assert "output_dir=/mnt/shared/o$$(NNODES)" in trainer["command"]
    assert check["command"][check["command"].index("--output-dir") + 1] == "/mnt/shared/o$$(NNODES)"
    assert check["command"][check["command"].index("--job-id") + 1] == "$(JOB_NAME)"  # ours: expanded
    assert {"name": "JOB_NAME", "value": f"{job['metadata']['name']}-$(JOB_UID)"} in trainer["env"]
