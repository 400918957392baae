"""Preemption with real signals: the launcher relays, the trainer saves and exits resumable."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import CLI, clean_env, free_port
from trainrun import FAST, scalars

pytestmark = pytest.mark.slow


def start(tmp: Path, run_name: str) -> tuple[subprocess.Popen, Path]:
    env = clean_env(TAEHV_CACHE=str(tmp.parent / "taehv-cache"), OMP_NUM_THREADS="1")
    argv = [*CLI, "1", "cpu", "--run-name", run_name, "--master-port", str(free_port()),
            "--set", f"output_dir='{tmp / 'output'}'", *FAST, "--set", "max_train_steps=500",
            "--set", "checkpointing_steps=500", "--set", "validation_steps=500"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp)
    return proc, tmp / "output" / run_name


def wait_for_step(run: Path, step: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    log = run / "launch.log"
    while time.time() < deadline:
        if log.exists() and f"step {step}/" in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise AssertionError(f"exited early: {proc.communicate()}")
        time.sleep(0.5)
    proc.kill()
    raise AssertionError(f"step {step} not reached: {log.read_text(errors='replace')[-2000:]}")


def trainer_pid(run: Path) -> int:
    import psutil

    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if any(c.endswith("train/main.py") for c in cmd) and str(run) in " ".join(cmd) and "launch" not in cmd:
            return p.pid
    raise AssertionError("trainer process not found")


@pytest.mark.parametrize("target,sig", [("launcher", signal.SIGTERM), ("launcher", signal.SIGINT),
                                        ("trainer", signal.SIGUSR1)])
def test_signal_saves_a_checkpoint_and_exits_resumable(tmp_path, target, sig):
    proc, run = start(tmp_path, "pre")
    wait_for_step(run, 3, proc)
    pid = proc.pid if target == "launcher" else trainer_pid(run)
    import os

    os.kill(pid, sig)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 75, (out[-3000:], err[-3000:])       # EXIT_RESUMABLE: requeue me
    assert "Traceback" not in out + err
    ckpts = sorted(run.glob("checkpoint-*"))
    assert len(ckpts) == 1 and (ckpts[0] / "COMPLETE").is_file()
    saved = json.loads((ckpts[0] / "trainer_state.json").read_text())["step"]
    assert saved >= 3
    assert json.loads((run / "REQUEUE").read_text())["step"] == saved
    assert json.loads((run / "exit_status.json").read_text())["code"] == 75
    # the requeued job continues from there
    env = clean_env(TAEHV_CACHE=str(tmp_path.parent / "taehv-cache"), OMP_NUM_THREADS="1")
    again = subprocess.run([*CLI, "1", "cpu", "--run-name", "pre", "--resume", "auto", "--master-port",
                            str(free_port()), "--set", f"output_dir='{tmp_path / 'output'}'", *FAST,
                            "--set", f"max_train_steps={saved + 2}"], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"at step {saved}" in again.stdout
    steps = [s for s, _ in scalars(run)["train/loss"]]
    assert steps[-2:] == [saved + 1, saved + 2] and len(steps) == len(set(steps))


def test_second_signal_aborts_at_once(tmp_path):
    proc, run = start(tmp_path, "abort")
    wait_for_step(run, 2, proc)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == 130
