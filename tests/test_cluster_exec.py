"""The rendered cluster jobs, executed end to end on one machine (#28): two nodes train to a
checkpoint, a stop signal makes both exit 75, and the job's next attempt resumes and finishes.

What is real: `taehv-launch render slurm|k8s` output, unedited; the sbatch script run by bash
(MASTER_PORT arithmetic, the srun line, the exit-75 test, the requeue check and its `scontrol
requeue`); the pod's init container (the requeue check) and command with the environment the
indexed Job's YAML gives it (JOB_COMPLETION_INDEX, NNODES, JOB_UID, JOB_NAME = <job>-$(JOB_UID)); two launchers per attempt that find their node rank, node
count, main node, port and run directory from those variables alone; the trainer, its checkpoints,
the signals, the resume. What is stood in, and why:
- the GPUs: `render` makes GPU jobs only (the cpu profile "runs here"), so the job is rendered for
  `2 h100 --gpus-per-node 1` and the stand-in srun (and the test, for a pod) runs each node's
  command with the profile word `h100` swapped for `cpu`. Every other word is the rendered one,
  so the CPU ranks run the cpu profile's defaults plus every --set the job carries.
- `srun`: a bash script that starts the command once per node in the background with the
  variables SLURM sets for a task (SLURM_NODEID, SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS,
  SLURM_STEP_*), waits for both and exits with the worst code, as srun does; `scontrol` records
  its arguments. SLURM_JOB_NODELIST is `localhost,<this host>`: its first host is the main node.
- SLURM's `--signal=USR1@120`: the test sends SIGUSR1 to every process under the stand-in srun
  (launchers, torchrun, ranks); the requeue is the test running the script again with the same
  SLURM_JOB_ID and SLURM_RESTART_COUNT=1.
- Kubernetes: a pod is a process with the container's environment; the headless Service's DNS
  name (MASTER_ADDR) is stood in by 127.0.0.1 and the rendezvous port by a free one (each pod has
  its own network; this machine is shared). A pod deletion is SIGTERM to each pod's launcher
  (the container's main process); the replacement pods are the same command run again with the
  same Job uid and new pod host names.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import Proc, clean_env, free_port, overrides, run_cli_here, start, wait_for_text
from test_cluster import _exe, _pod_env
from trainrun import scalars

pytestmark = pytest.mark.slow

STEPS = 6
# Few steps, a checkpoint and a validation every 2: the stop signal lands after checkpoint-2 and the
# ranks' stop vote is read one step later, so the saved step is 3 or 4 and the resume runs the rest.
SETTINGS = overrides(
    "log_every=1 checkpointing_steps=2 validation_steps=2 max_validation_batches=1",
    "dataloader_num_workers=0",
    f"max_train_steps={STEPS}",
)
STAND_IN_SRUN = r"""#!/bin/bash
# Stand-in srun: one task per node, all at once, with the variables SLURM sets for a task; the
# profile word h100 becomes cpu (no GPUs here); exits with the worst task exit code, as srun does.
while [[ "$1" == --* ]]; do echo "$1" >> "$FAKE_OUT/srun_options"; shift; done
cmd=("$@")
if [ "${cmd[0]}" != taehv-launch ] || [ "${cmd[2]}" != h100 ]; then
  echo "stand-in srun: expected 'taehv-launch N h100 ...', got: ${cmd[*]}" >&2; exit 99
fi
cmd[2]=cpu
n=$SLURM_JOB_NUM_NODES
pids=()
for ((i = 0; i < n; i++)); do
  SLURM_NODEID=$i SLURM_PROCID=$i SLURM_LOCALID=0 SLURM_NTASKS=$n SLURM_STEP_NUM_NODES=$n \
  SLURM_STEP_NUM_TASKS=$n SLURM_STEP_NODELIST=$SLURM_JOB_NODELIST SLURM_STEP_ID=0 "${cmd[@]}" &
  pids+=($!)
done
echo "${pids[*]}" > "$FAKE_OUT/tasks"
worst=0
for p in "${pids[@]}"; do wait "$p"; c=$?; (( c > worst )) && worst=$c; done
exit $worst
"""
RECORD_SCONTROL = """#!/bin/bash
echo "$@" >> "$FAKE_OUT/scontrol"
"""


def _bin(tmp: Path) -> Path:
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    _exe(bin_dir / "srun", STAND_IN_SRUN)
    _exe(bin_dir / "scontrol", RECORD_SCONTROL)
    _exe(bin_dir / "taehv-launch", f'#!/bin/bash\nexec {shlex.quote(sys.executable)} -m taehv_launch.cli "$@"\n')
    return bin_dir


def _demo_sets(tmp: Path) -> list[str]:
    """The cpu profile's own demo data and reference VAE paths (a cluster job must name both)."""
    env = clean_env(TAEHV_CACHE=str(tmp.parent / "taehv-cache"))
    plan = json.loads(run_cli_here("1", "cpu", "--dry-run", "--json", env=env).stdout)["config"]
    return overrides(f"data_root={plan['data_root']}", f"ref_vae_path={plan['ref_vae_path']}")


def _render(tmp: Path, kind: str, *args: str) -> str:
    proc = run_cli_here("render", kind, "2", "h100", "--gpus-per-node", "1", *_demo_sets(tmp), *SETTINGS, *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _job_id() -> int:
    """A job id whose MASTER_PORT (20000 + id % 20000, the script's arithmetic) is free here."""
    for _ in range(200):
        job_id = random.randrange(1000, 20000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", 20000 + job_id))
                return job_id
            except OSError:
                continue
    raise AssertionError("no free port in 20000-39999")


def _tree(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _saved(run: Path) -> int:
    steps = sorted(int(p.name.split("-")[1]) for p in run.glob("checkpoint-*") if (p / "COMPLETE").is_file())
    assert steps, f"no complete checkpoint in {run}"
    return steps[-1]


def _every_step_once(run: Path) -> None:
    assert [s for s, _ in scalars(run)["train/loss"]] == list(range(1, STEPS + 1))


def test_rendered_sbatch_runs_two_nodes_requeues_on_usr1_and_resumes(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "job.sbatch"
    script.write_text(_render(tmp_path, "slurm", "--output-dir", str(tmp_path / "output")))
    assert "#SBATCH --nodes=2\n" in script.read_text() and "#SBATCH --signal=USR1@120\n" in script.read_text()
    job_id = _job_id()
    run = tmp_path / "output" / f"job-{job_id}"
    bin_dir = _bin(tmp_path)

    def attempt(restart: int) -> Proc:
        env = clean_env(
            PATH=f"{bin_dir}:{os.environ['PATH']}",
            FAKE_OUT=str(out),
            TAEHV_CACHE=str(tmp_path.parent / "taehv-cache"),
            OMP_NUM_THREADS="1",
            SLURM_JOB_ID=str(job_id),
            SLURM_JOB_NUM_NODES="2",
            SLURM_NNODES="2",
            SLURM_JOB_NODELIST=f"localhost,{socket.gethostname()}",
            SLURM_CPUS_ON_NODE="2",
            SLURM_RESTART_COUNT=str(restart),
        )
        log = tmp_path / f"slurm-{job_id}.{restart}.out"  # sbatch's --output
        return start(["bash", str(script)], env=env, cwd=tmp_path, out=log, start_new_session=True)

    first = attempt(0)
    wait_for_text(run / "launch.log", "checkpoint: checkpoint-2", [first], poll=0.1)
    import psutil

    srun = [p for p in psutil.Process(first.pid).children() if p.cmdline()[1:2] == [str(tmp_path / "bin" / "srun")]]
    assert len(srun) == 1, [p.cmdline() for p in psutil.Process(first.pid).children()]
    step = _tree(srun[0].pid)  # the step's processes: both launchers and all below them
    assert len(step) >= 2 * 3, step
    for pid in step:  # --signal=USR1@120: SIGUSR1 to every process of the step
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    assert first.wait(timeout=300) == 75, (tmp_path / f"slurm-{job_id}.0.out").read_text()[-3000:]
    text = (tmp_path / f"slurm-{job_id}.0.out").read_text()
    assert "Traceback" not in text, text[-3000:]
    assert f"requeueing job {job_id}" in text
    for node in (0, 1):  # each task found its place from SLURM's variables; node 0 = the list's first host
        assert f"this is node {node} (GPU ids 0), master localhost:{20000 + job_id}  [slurm]" in text, text[-3000:]
    assert (out / "scontrol").read_text().split() == ["requeue", str(job_id)]
    saved = _saved(run)
    assert 2 < saved < STEPS, saved  # a new checkpoint
    assert json.loads((run / "REQUEUE").read_text())["step"] == saved
    assert "--cpus-per-task=2" in (out / "srun_options").read_text()
    requeues = json.loads((run / "requeue.json").read_text())  # the requeue check's count (#25)
    assert requeues | {"stopped": None} == {
        "count": 1,
        "without_progress": 0,
        "last_checkpoint": f"checkpoint-{saved}",
        "stopped": None,
        "job": str(job_id),
    }

    second = attempt(1)  # the requeued job: same id, SLURM_RESTART_COUNT=1
    assert second.wait(timeout=300) == 0, (tmp_path / f"slurm-{job_id}.1.out").read_text()[-3000:]
    text = (tmp_path / f"slurm-{job_id}.1.out").read_text()
    assert f"job {job_id}, attempt 2" in text and f"checkpoint-{saved} at step {saved}" in text, text[-3000:]
    assert "Traceback" not in text
    assert (out / "scontrol").read_text().split() == ["requeue", str(job_id)]  # not requeued again
    assert not (run / "REQUEUE").exists() and (run / "launch.node1.log").exists()
    assert json.loads((run / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())["world_size"] == 2
    _every_step_once(run)


def test_rendered_k8s_pods_stop_on_sigterm_and_replacements_resume(tmp_path):
    shared = tmp_path / "shared"
    _, job = yaml.safe_load_all(
        _render(
            tmp_path,
            "k8s",
            "--output-dir",
            str(shared / "runs"),
            "--mount",
            str(shared),
            "--image",
            "img:1",
            "--pvc",
            "c",
        )
    )
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (2, 2)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    (check,) = job["spec"]["template"]["spec"]["initContainers"]
    argv = container["command"]
    assert argv[:3] == ["taehv-launch", "2", "h100"] and argv[-2:] == ["--resume", "this-run"]
    bin_dir = _bin(tmp_path)
    port, uid = free_port(), "7d1e-uid"
    run = shared / "runs" / f"job-taehv-2-h100-{uid}"

    def pods(attempt: int) -> list[Proc]:
        procs = []
        for index in (0, 1):  # each pod's init container first: pod 0 counts the run's restarts (#25)
            env = clean_env(**_pod_env(check, uid, index))
            init = [env["JOB_NAME"] if a == "$(JOB_NAME)" else a for a in check["command"]]
            done = subprocess.run([str(bin_dir / "taehv-launch"), *init[1:]], env=env, capture_output=True, text=True)
            assert done.returncode == 0, done.stdout + done.stderr
            if index == 0:
                assert ("first start of this run" if attempt == 0 else "restart 1 of this run") in done.stdout
            env = clean_env(
                **_pod_env(container, uid, index),
                HOSTNAME=f"taehv-2-h100-{index}-p{attempt}",
                TAEHV_CACHE=str(tmp_path.parent / "taehv-cache"),
                OMP_NUM_THREADS="1",
            )
            assert env["MASTER_ADDR"] == "taehv-2-h100-0.taehv-2-h100" and env["NNODES"] == "2"
            env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # the Service's name, a free port
            log = tmp_path / f"pod{index}.{attempt}.out"
            command = [str(bin_dir / "taehv-launch"), argv[1], "cpu", *argv[3:]]
            procs.append(start(command, env=env, cwd=tmp_path, out=log, start_new_session=True))
        return procs

    first = pods(0)
    wait_for_text(run / "launch.log", "checkpoint: checkpoint-2", first, poll=0.1)
    for p in first:  # pod deletion: SIGTERM to the container's main process
        p.send_signal(signal.SIGTERM)
    for index, p in enumerate(first):
        code = p.wait(timeout=300)
        text = (tmp_path / f"pod{index}.0.out").read_text()
        assert code == 75, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
        assert f"this is node {index} (GPU ids 0), master 127.0.0.1:{port}  [kubernetes" in text, text[-3000:]
    saved = _saved(run)
    assert 2 < saved < STEPS, saved  # a new checkpoint
    second = pods(1)  # the replacement pods of the same Job (same uid)
    for index, p in enumerate(second):
        code = p.wait(timeout=300)
        text = (tmp_path / f"pod{index}.1.out").read_text()
        assert code == 0, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
        resumed = f"checkpoint-{saved} at step {saved}" if index == 0 else f"--resume {run / f'checkpoint-{saved}'}"
        assert resumed in text, text[-3000:]  # node 0: the trainer's line; node 1: its plan's command
    assert not (run / "REQUEUE").exists()
    requeues = json.loads((run / "requeue.json").read_text())
    assert (requeues["count"], requeues["without_progress"], requeues["last_checkpoint"]) == (
        1,
        0,
        f"checkpoint-{saved}",
    )
    _every_step_once(run)
