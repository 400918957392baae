"""Preemption with real signals, as users run it: 2 DataLoader workers, 1 and 2 CPU ranks.

The signals: SIGTERM to the launcher, SIGTERM to every process of the job (SLURM), SIGUSR1 to every
process (SLURM's `--signal=USR1@120` without `B:`), SIGINT to the launcher's process group (Ctrl-C).
At 2 ranks: SIGTERM to the launcher, SIGTERM to every process and SIGINT to the group; at 1 rank:
SIGUSR1 to every process and SIGINT to the group. Every cell must end with a new complete checkpoint,
REQUEUE, exit 75 and no traceback, and `--resume auto` must continue at the saved step with the losses
of an uninterrupted run. Where the other cells are (one rank handler and one worker guard for every
stop signal; the rank count changes only the stop vote): SIGTERM to the launcher at 1 rank is stopped
and resumed 20 times by the "delivered twice" test below; SIGTERM to every process at 1 rank takes
the 2-rank cell's path; SIGUSR1 to every process at 2 ranks: the 1-rank cell here, and
test_cluster_exec's two-node sbatch job (SIGUSR1 to every process of a 2-rank step, requeued, resumed).
DataLoader workers 0 (no profile runs it) is not part of the matrix: the other slow tests' runs use it.

To keep CI short the signal cells of one configuration form a chain: the `--resume auto` launch
that checks one cell's resume is the run the next cell interrupts, and the last one runs a single
step. The whole chain's loss curve is then compared, step by step, with one uninterrupted reference
run of that configuration. The constant learning-rate schedule makes the curve independent of
max_train_steps, so the interrupted runs can ask for many steps.
The reference runs at the same time as the chain.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from conftest import overrides
from trainrun import scalars, start_launch

pytestmark = pytest.mark.slow

BIG = 100000
# steps of the uninterrupted reference, per rank count: each cell adds a step or two (with several ranks the
# stop vote is read one step later, no host sync per step); a 4-cell 2-rank chain has run up to 14 steps
REF_STEPS = {1: 12, 2: 15}
CELLS = [
    "SIGTERM to the launcher",
    "SIGTERM to every process",
    "SIGUSR1 to every process",
    "SIGINT to the process group",
]
CONFIGS = [(2, 1), (2, 2)]  # (DataLoader workers, ranks)
# at 1 rank: a direct signal and one the launcher relays; at 2 ranks both kinds of direct SIGTERM too
RANK_CELLS = {1: [CELLS[2], CELLS[3]], 2: [CELLS[0], CELLS[1], CELLS[3]]}


def settings(workers: int) -> list[str]:
    return overrides(
        "log_every=1 checkpointing_steps=2 validation_steps=1000 max_validation_batches=1",
        "lr_scheduler='constant'",
        f"dataloader_num_workers={workers}",
        "checkpoints_total_limit=2",
        "max_restarts=0",  # one failure's exit code and line are checked here; restarts: test_restart.py
    )


class Launch:
    """`taehv-launch RANKS cpu` in a session of its own (so SIGINT to its group is Ctrl-C),
    output into files (no pipe to fill)."""

    def __init__(self, tmp: Path, name: str, ranks: int, workers: int, *args: str, wrapper: tuple[str, ...] = ()):
        self.tmp, self.run = tmp, tmp / "output" / name
        n = len(list(tmp.glob(f"{name}.*.out")))
        self.out, self.err = tmp / f"{name}.{n}.out", tmp / f"{name}.{n}.err"
        self.proc = start_launch(
            tmp,
            ranks,
            *settings(workers),
            *args,
            run_name=name,
            fast=False,
            wrapper=wrapper,
            out=self.out,
            err=self.err,
            start_new_session=True,
        )

    def text(self) -> tuple[str, str]:
        return self.out.read_text(errors="replace"), self.err.read_text(errors="replace")

    def wait_for(self, what: str, timeout: float = 240) -> None:
        """Until the launcher's output shows `what` (the trainer's log is teed to it)."""
        self.proc.wait_for(what, timeout=timeout, poll=0.1)

    def finish(self, timeout: float = 300) -> int:
        return self.proc.finish(timeout)

    def processes(self) -> list[int]:
        return self.proc.tree()

    def kill(self) -> None:
        self.proc.kill_tree()

    def send(self, cell: str) -> None:
        if cell == "SIGTERM to the launcher":
            os.kill(self.proc.pid, signal.SIGTERM)
        elif cell == "SIGINT to the process group":
            os.killpg(self.proc.pid, signal.SIGINT)
        else:  # as SLURM does: every process of the step at once, DataLoader workers included
            sig = signal.SIGTERM if cell.startswith("SIGTERM") else signal.SIGUSR1
            pids = self.processes()
            assert len(pids) >= 3, pids
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass


def complete_steps(run: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in run.glob("checkpoint-*") if (p / "COMPLETE").is_file())


def check_stopped(launch: Launch, cell: str, before: int) -> int:
    """The cell's outcome: exit 75, no traceback, a new complete checkpoint named in REQUEUE."""
    code = launch.finish()
    out, err = launch.text()
    assert code == 75, (cell, code, out[-3000:], err[-3000:])
    assert "Traceback" not in out + err, (cell, out[-3000:], err[-3000:])
    assert "exitcode: 75" not in out + err, (cell, out[-3000:])  # torchrun's error lines: launch.log only
    saved = complete_steps(launch.run)[-1]
    assert saved > before, (cell, saved, before)
    ckpt = launch.run / f"checkpoint-{saved}"
    assert json.loads((ckpt / "trainer_state.json").read_text())["step"] == saved
    assert "checksums" in json.loads((ckpt / "COMPLETE").read_text())
    assert json.loads((launch.run / "REQUEUE").read_text())["step"] == saved, cell
    assert json.loads((launch.run / "exit_status.json").read_text())["code"] == 75
    assert not list(launch.run.glob(".tmp-checkpoint-*")), cell
    return saved


@pytest.mark.parametrize("workers,ranks", CONFIGS, ids=[f"workers{w}-ranks{r}" for w, r in CONFIGS])
def test_signal_matrix(tmp_path, workers, ranks):
    # the uninterrupted reference runs beside the chain (its start-up is mostly single-threaded imports)
    ref_steps = REF_STEPS[ranks]
    ref = Launch(tmp_path, "ref", ranks, workers, "--set", f"max_train_steps={ref_steps}")
    launch = Launch(tmp_path, "pre", ranks, workers, "--set", f"max_train_steps={BIG}")
    launch.wait_for("checkpoint: checkpoint-2")
    saved = 2
    cells = RANK_CELLS[ranks]
    for i, cell in enumerate(cells):
        if i:  # the resumed run must have trained past the saved step before it is interrupted
            launch.wait_for(f"step {saved + 1}/")
        launch.send(cell)
        saved = check_stopped(launch, cell, saved)
        last = i == len(cells) - 1
        launch = Launch(
            tmp_path,
            "pre",
            ranks,
            workers,
            "--resume",
            "auto",
            *overrides(f"max_train_steps={saved + 1 if last else BIG}"),
        )
        launch.wait_for(f"at step {saved}")  # "resumed from .../checkpoint-<saved> at step <saved>"
        assert f"checkpoint-{saved} at step {saved}" in launch.text()[0], (cell, launch.text()[0][-2000:])
    assert launch.finish() == 0, launch.text()
    assert not (launch.run / "REQUEUE").exists()  # the requeued run has finished
    assert ref.finish() == 0, ref.text()
    reference = scalars(ref.run)["train/loss"]
    assert [s for s, _ in reference] == list(range(1, ref_steps + 1))
    final = saved + 1
    assert final <= ref_steps, f"the chain ran {final} steps, the reference {ref_steps}: raise REF_STEPS"
    got = scalars(launch.run)["train/loss"]
    assert [s for s, _ in got] == list(range(1, final + 1)), got  # every step once, none lost
    for (step, a), (_, b) in zip(got, reference):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-6), (step, a, b)


def test_second_signal_aborts_at_once(tmp_path):
    """SIGTERM then SIGINT to the launcher: exit 130 at once, nothing of the launch left running; at 1 and
    2 ranks, the two launches side by side (their start-up is mostly single-threaded imports)."""
    import psutil

    launches = {
        ranks: Launch(tmp_path, f"abort{ranks}", ranks, 2, "--set", f"max_train_steps={BIG}") for ranks in (1, 2)
    }
    try:
        for ranks, launch in launches.items():
            launch.wait_for("checkpoint: checkpoint-2")
            pids = launch.processes()
            launch.proc.send_signal(signal.SIGTERM)
            time.sleep(0.2)
            launch.proc.send_signal(signal.SIGINT)  # a person's Ctrl-C after the scheduler's SIGTERM
            t0 = time.time()
            assert launch.finish(timeout=60) == 130, (ranks, launch.text())
            assert time.time() - t0 < 15, ranks
            assert (
                "error: stopped at once by a second signal, nothing more was saved; --resume auto continues"
                in launch.text()[1]
            ), (ranks, launch.text()[1])
            time.sleep(1)
            alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
            assert not alive, f"processes of the {ranks}-rank launch left running: {alive}"  # ranks and workers too
    finally:
        for launch in launches.values():
            if launch.proc.poll() is None:
                launch.kill()


def test_a_worker_killed_for_another_reason_is_one_error_line(tmp_path):
    """SIGKILL (as the out-of-memory killer does) to a DataLoader worker: one `error:` line."""
    import psutil

    launch = Launch(tmp_path, "oom", 1, 2, "--set", f"max_train_steps={BIG}")
    launch.wait_for("step 2/")
    ranks = psutil.Process(launch.proc.pid).children()[0].children()
    workers = [w for r in ranks for w in r.children()]
    assert len(workers) == 2, workers
    workers[0].kill()
    code = launch.finish()
    out, err = launch.text()
    assert code == 1, (out[-2000:], err[-2000:])
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: a DataLoader worker (pid"), err
    # torch notices the death on one of two paths (its SIGCHLD handler, or the worker-status
    # check after a queue timeout) and words it differently; both are the same one line
    assert "killed by signal" in lines[0] or "exited unexpectedly" in lines[0], err
    assert "dataloader_num_workers" in lines[0], err
    assert "Traceback" not in out + err


TWICE = 10
HOWS = {"twice to the launcher": (), "GNU timeout: to the launcher and its group": ("timeout", "900")}  # wrapper


def test_one_signal_delivered_twice_is_one_stop(tmp_path):
    """GNU `timeout` (and schedulers that signal a job step and its process group) deliver one
    SIGTERM twice within milliseconds: it is one stop, 10 times out of 10 each way, with 2 DataLoader
    workers. Each way is a chain: each launch resumes the previous one's checkpoint and is stopped after
    one new step. The two chains run side by side (separate runs, each launch in a session of its own):
    a launch is mostly single-threaded start-up, so the pair takes little longer than one chain."""
    saved = dict.fromkeys(HOWS, 0)
    for i in range(TWICE):
        launches = {
            how: Launch(
                tmp_path,
                f"twice{k}",
                1,
                2,
                *overrides(f"max_train_steps={BIG}"),
                *(["--resume", "auto"] * bool(i)),
                wrapper=wrapper,
            )
            for k, (how, wrapper) in enumerate(HOWS.items())
        }
        try:
            for how, launch in launches.items():
                launch.wait_for(f"step {saved[how] + 1}/")
                if HOWS[how]:  # as when timeout's own limit runs out: it signals its child, then its process group
                    os.kill(launch.proc.pid, signal.SIGTERM)
                else:
                    launcher = launch.proc.pid
                    os.kill(launcher, signal.SIGTERM)
                    time.sleep(0.005)
                    os.kill(launcher, signal.SIGTERM)
            for how, launch in launches.items():
                saved[how] = check_stopped(launch, f"{how}, stop {i + 1}", saved[how])
                out, err = launch.text()
                assert "second signal" not in out + err, (how, i, err[-2000:])
                assert "counted once" in err or HOWS[how], err[-2000:]
        finally:  # a failure in one chain leaves nothing of the other running
            for launch in launches.values():
                if launch.proc.poll() is None:
                    launch.kill()
