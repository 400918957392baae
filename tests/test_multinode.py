"""Two "nodes" on one machine (two launchers, loopback master): the multi-node path for real,
a dead rank on one node taking the other node down within 60 s, and both nodes preempted
(SIGUSR1 to every process, as SLURM does) and resumed with the loss curve of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import Proc, clean_env, free_port, overrides, start_cli, wait_for_text
from trainrun import FAST, scalars, trainer_state

pytestmark = pytest.mark.slow


def start_nodes(tmp: Path, steps: int, port: int) -> list[Proc]:
    env = clean_env(TAEHV_CACHE=str(tmp.parent / "taehv-cache"), OMP_NUM_THREADS="1")
    procs = []
    for rank in (0, 1):
        argv = [
            "2",
            "cpu",
            "--num-nodes",
            "2",
            "--node-rank",
            str(rank),
            "--gpus-per-node",
            "1",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            "--run-name",
            "mn",
            *overrides(f"output_dir='{tmp / 'output'}'"),
            *FAST,
            *overrides(f"max_train_steps={steps}"),
        ]
        procs.append(start_cli(*argv, env=env, cwd=tmp))
        time.sleep(1.0)
    return procs


def test_a_dead_rank_on_another_node_stops_the_job_within_60s(tmp_path):
    import psutil

    procs = start_nodes(tmp_path, 500, free_port())
    run = tmp_path / "output" / "mn"
    wait_for_text(run / "launch.log", "step 2/", procs, timeout=300, poll=0.5)
    victim = None
    for p in psutil.Process(procs[1].pid).children(recursive=True):
        if any(c.endswith("train/main.py") for c in p.cmdline()) and "launch" not in p.cmdline():
            victim = p
    assert victim is not None, "node 1's trainer not found"
    victim.send_signal(signal.SIGKILL)  # OOM-killer style: no cleanup, no marker
    t0 = time.time()
    out0, err0 = procs[0].communicate(timeout=120)
    elapsed = time.time() - t0
    procs[1].communicate(timeout=60)
    assert procs[0].returncode not in (0, None)
    assert elapsed < 60, elapsed
    assert "rank 1" in err0, err0[-2000:]
    assert "Traceback" not in err0


# --- preempted and resumed (#28) ------------------------------------------------------------

BIG = 100000
REF_STEPS = 6  # the stop vote of several ranks is read one step after the signal (train/loop/speed.py)


class TwoNodes:
    """Node 0 and node 1 of one `taehv-launch 2 cpu` job, as users run it (2 DataLoader workers per
    rank), each in a session of its own with its output in files (no pipe to fill)."""

    def __init__(self, tmp: Path, name: str, *args: str):
        self.run, self.procs = tmp / "output" / name, []
        env = clean_env(TAEHV_CACHE=str(tmp.parent / "taehv-cache"), OMP_NUM_THREADS="1")
        port, attempt = free_port(), len(list(tmp.glob(f"{name}.*.node0.out")))
        for rank in (0, 1):
            argv = [
                "2",
                "cpu",
                "--num-nodes",
                "2",
                "--node-rank",
                str(rank),
                "--gpus-per-node",
                "1",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                "--run-name",
                name,
                *overrides(
                    f"output_dir='{tmp / 'output'}'",
                    "log_every=1 checkpointing_steps=2 validation_steps=1000 max_validation_batches=1",
                    "lr_scheduler='constant' dataloader_num_workers=2",
                ),
                *args,
            ]
            out, err = tmp / f"{name}.{attempt}.node{rank}.out", tmp / f"{name}.{attempt}.node{rank}.err"
            self.procs.append(start_cli(*argv, env=env, cwd=tmp, out=out, err=err, start_new_session=True))

    def text(self, rank: int) -> str:
        return self.procs[rank].text()

    def wait_log(self, what: str, timeout: float = 300) -> None:
        """Until node 0's launch.log shows `what` (both nodes still running)."""
        wait_for_text(self.run / "launch.log", what, self.procs, timeout=timeout, poll=0.1)

    def processes(self) -> list[int]:
        """Every process of both nodes: launchers, torchrun, ranks, DataLoader workers."""
        return [pid for p in self.procs for pid in p.tree()]

    def kill(self) -> None:
        for p in self.procs:
            p.kill_tree()

    def finish(self, timeout: float = 300) -> list[int]:
        deadline = time.time() + timeout
        try:
            return [p.wait(timeout=max(1.0, deadline - time.time())) for p in self.procs]
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the nodes did not exit in {timeout} s: {self.text(0)[-2000:]}") from None


def complete_steps(run: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in run.glob("checkpoint-*") if (p / "COMPLETE").is_file())


@pytest.fixture(scope="module")
def together(tmp_path_factory) -> tuple[TwoNodes, list[int]]:
    """One uninterrupted two-node run: test_two_nodes_train_together checks it, and the preemption
    test compares its loss curve with it (the same settings)."""
    nodes = TwoNodes(tmp_path_factory.mktemp("together"), "mn", "--set", f"max_train_steps={REF_STEPS}")
    return nodes, nodes.finish()


def test_two_nodes_train_together(together):
    nodes, codes = together
    assert codes == [0, 0], (nodes.text(0)[-3000:], nodes.text(1)[-3000:])
    run = nodes.run
    assert "processes 2" in nodes.text(0)
    assert trainer_state(run / f"checkpoint-{REF_STEPS}")["world_size"] == 2
    assert (run / "launch.log").exists() and (run / "launch.node1.log").exists()
    assert (run / "env.json").exists() and (run / "env.node1.json").exists()
    assert [s for s, _ in scalars(run)["train/loss"]] == list(range(1, REF_STEPS + 1))


def test_two_nodes_preempted_by_sigusr1_resume_with_the_same_losses(tmp_path, together):
    ref, ref_codes = together  # the uninterrupted run of the same settings
    job = TwoNodes(tmp_path, "pre", "--set", f"max_train_steps={BIG}")
    job.wait_log("checkpoint: checkpoint-2")
    pids = job.processes()
    assert len(pids) >= 2 * 4, pids  # per node: launcher, torchrun, rank, 2 workers
    for pid in pids:  # SLURM's --signal=USR1@120: every process of the step at once
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    codes = job.finish()
    for rank in (0, 1):
        assert codes[rank] == 75, (rank, codes, job.text(rank)[-3000:])
        assert "Traceback" not in job.text(rank), job.text(rank)[-3000:]
    saved = complete_steps(job.run)[-1]
    assert 2 < saved < REF_STEPS, f"saved at step {saved}: the stop came too late for REF_STEPS={REF_STEPS}"
    assert json.loads((job.run / f"checkpoint-{saved}" / "trainer_state.json").read_text())["step"] == saved
    assert json.loads((job.run / "REQUEUE").read_text())["step"] == saved

    resumed = TwoNodes(tmp_path, "pre", "--resume", "auto", "--set", f"max_train_steps={REF_STEPS}")
    codes = resumed.finish()
    assert codes == [0, 0], (codes, resumed.text(0)[-3000:], resumed.text(1)[-3000:])
    assert f"checkpoint-{saved} at step {saved}" in resumed.text(0), resumed.text(0)[-3000:]  # the trainer's line
    assert f"--resume {job.run / f'checkpoint-{saved}'}" in resumed.text(1), resumed.text(1)[-3000:]  # node 1's plan
    assert not (job.run / "REQUEUE").exists()
    assert ref_codes == [0, 0], ref.text(0)[-3000:]
    reference = scalars(ref.run)["train/loss"]
    assert [s for s, _ in reference] == list(range(1, REF_STEPS + 1))
    got = scalars(job.run)["train/loss"]
    assert [s for s, _ in got] == list(range(1, REF_STEPS + 1)), got  # every step once, none lost
    for (step, a), (_, b) in zip(got, reference):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-6), (step, a, b)
