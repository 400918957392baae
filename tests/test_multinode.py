"""Two "nodes" on one machine (two launchers, loopback master): the multi-node path for real,
and a dead rank on one node taking the other node down within 60 s."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import CLI, clean_env, free_port
from trainrun import FAST, scalars, trainer_state

pytestmark = pytest.mark.slow


def start_nodes(tmp: Path, steps: int, port: int) -> list[subprocess.Popen]:
    env = clean_env(TAEHV_CACHE=str(tmp.parent / "taehv-cache"), OMP_NUM_THREADS="1")
    procs = []
    for rank in (0, 1):
        argv = [*CLI, "2", "cpu", "--num-nodes", "2", "--node-rank", str(rank), "--gpus-per-node", "1",
                "--master-addr", "127.0.0.1", "--master-port", str(port), "--run-name", "mn",
                "--set", f"output_dir='{tmp / 'output'}'", *FAST, "--set", f"max_train_steps={steps}"]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                      cwd=tmp))
        time.sleep(1.0)
    return procs


def test_two_nodes_train_together(tmp_path):
    procs = start_nodes(tmp_path, 4, free_port())
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out[-3000:] + err[-3000:]
    run = tmp_path / "output" / "mn"
    assert "processes 2" in outs[0][0]
    assert trainer_state(run / "checkpoint-4")["world_size"] == 2
    assert (run / "launch.log").exists() and (run / "launch.node1.log").exists()
    assert (run / "env.json").exists() and (run / "env.node1.json").exists()
    assert [s for s, _ in scalars(run)["train/loss"]] == [1, 2, 3, 4]


def test_a_dead_rank_on_another_node_stops_the_job_within_60s(tmp_path):
    import psutil

    procs = start_nodes(tmp_path, 500, free_port())
    run = tmp_path / "output" / "mn"
    deadline = time.time() + 300
    while time.time() < deadline and "step 2/" not in ((run / "launch.log").read_text(errors="replace")
                                                       if (run / "launch.log").exists() else ""):
        time.sleep(0.5)
    victim = None
    for p in psutil.Process(procs[1].pid).children(recursive=True):
        if any(c.endswith("train/main.py") for c in p.cmdline()) and "launch" not in p.cmdline():
            victim = p
    assert victim is not None, "node 1's trainer not found"
    victim.send_signal(signal.SIGKILL)               # OOM-killer style: no cleanup, no marker
    t0 = time.time()
    out0, err0 = procs[0].communicate(timeout=120)
    elapsed = time.time() - t0
    procs[1].communicate(timeout=60)
    assert procs[0].returncode not in (0, None)
    assert elapsed < 60, elapsed
    assert "rank 1" in err0, err0[-2000:]
    assert "Traceback" not in err0
