"""What the launcher says and returns around its stop signals (#35 item 7), with the real launcher.

Fast: one SIGTERM before the trainer started is reported as that (exit 130, nothing to save), not as
"stopped at once by a second signal". Slow: a second Ctrl-C while the launch shuts down after the trainer
recorded exit 75 (its checkpoint saved) ends what is left and keeps 75.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from conftest import Proc, overrides
from trainrun import start_launch


def start(tmp: Path, *args: str) -> tuple[Proc, Path, Path]:
    out, err = tmp / "out", tmp / "err"
    settings = overrides("log_every=1 validation_steps=100000 checkpointing_steps=100000")
    proc = start_launch(tmp, 1, *settings, *args, run_name="s", fast=False, out=out, err=err)
    return proc, out, err


def test_one_sigterm_before_the_trainer_started_is_not_called_a_second_signal(tmp_path):
    import psutil

    proc, out, err = start(tmp_path)
    deadline = time.monotonic() + 120
    while not psutil.Process(proc.pid).children() and time.monotonic() < deadline:  # the agent has started
        assert proc.poll() is None, out.read_text() + err.read_text()
        time.sleep(0.02)
    time.sleep(0.3)  # the relay is installed; accelerate is still importing (seconds): no trainer yet
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130
    lines = [line for line in err.read_text().splitlines() if line.strip()]
    assert lines == [
        "taehv-launch: got SIGTERM before the trainer started: stopping, nothing to save",
        "error: stopped by SIGTERM before the trainer started, nothing to save; --resume auto continues from the "
        "newest complete checkpoint",
    ], lines
    run = tmp_path / "output" / "s"
    status = json.loads((run / "exit_status.json").read_text())  # `taehv-launch status` says the same
    assert status.pop("launch_id")  # stamped by the launcher that wrote it (rundir/launchid.py)
    assert status == {"code": 130, "message": "stopped by SIGTERM before the trainer started, nothing to save"}


@pytest.mark.slow
def test_a_second_ctrl_c_while_the_launch_shuts_down_keeps_the_saved_75(tmp_path):
    import psutil

    proc, out, err = start(tmp_path, "--set", "max_train_steps=100000")
    run = tmp_path / "output" / "s"
    proc.wait_for("step 2/", timeout=300)
    agent = psutil.Process(proc.pid).children()[0]
    rank = agent.children()[0]
    agent.suspend()  # the launch's shutdown, held open: the agent cannot end before the second signal
    proc.send_signal(signal.SIGINT)  # Ctrl-C: relayed to the rank, which saves and exits 75
    deadline = time.monotonic() + 120
    while not (run / "exit_status.json").exists():
        assert time.monotonic() < deadline, out.read_text() + err.read_text()
        time.sleep(0.1)
    time.sleep(3)  # past the 2 s in which a repeat counts as the same stop
    proc.send_signal(signal.SIGINT)  # a second Ctrl-C, impatient
    code = proc.wait(timeout=60)
    text = out.read_text() + "\nSTDERR\n" + err.read_text()
    assert code == 75, text
    assert "taehv-launch: SIGINT: the trainer already exited (75); ending what is left" in err.read_text()
    assert "second signal" not in text and "error:" not in err.read_text(), text
    assert json.loads((run / "exit_status.json").read_text())["code"] == 75
    assert (run / "REQUEUE").exists()
    time.sleep(1)
    for p in (agent, rank):
        assert not psutil.pid_exists(p.pid) or p.status() == psutil.STATUS_ZOMBIE, p
