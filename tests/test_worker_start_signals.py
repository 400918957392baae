"""A scheduler's stop signal to the whole process group while a rank starts DataLoader workers (issue #40).

SLURM signals every process of a job step, GNU `timeout` and a terminal's Ctrl-C signal the process group,
so fresh workers get the signal too: at the run's start, at each epoch of a loader without persistent
workers, when a rollback opens a new loader (a respawn), and during the whole start of a spawned worker.
Before WorkerLoader (train/data/workers.py) such a worker died before its worker_init_fn could ignore the
signal, and the rank crashed instead of stopping with a checkpoint: with fork, SIGTERM (torch's worker
handler); with spawn, all four (Python's defaults); with forkserver, all four (the server itself died, or
its children). Here a real rank-like process (stop handlers installed as main.py does, the product's
loader and worker_init_fn, 2 workers) starts workers while the test sends bursts of one real signal to
its process group; the rank must come through, count the stop once and read every batch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import start

RANK = textwrap.dedent("""
    import sys, time
    import torch
    from torch.utils.data import Dataset
    from taehv_launch.train.data.clips import worker_init_fn
    from taehv_launch.train.data.workers import WorkerLoader
    from taehv_launch.train.durability.stop import install, requested

    class Items(Dataset):
        def __len__(self): return 8
        def __getitem__(self, i): return torch.tensor([i])

    def loader(method, persistent):
        return WorkerLoader(Items(), batch_size=2, num_workers=2, worker_init_fn=worker_init_fn,
                            multiprocessing_context=method, persistent_workers=persistent)

    if __name__ == "__main__":
        method, epochs = (None if sys.argv[1] == "default" else sys.argv[1]), int(sys.argv[2])
        install()
        fresh, respawn = loader(method, False), loader(method, True)
        print("ready", flush=True)
        deadline = time.monotonic() + 30
        while not requested() and time.monotonic() < deadline:   # the burst has begun
            time.sleep(0.0005)
        n = 0
        for _ in range(epochs):           # new workers every epoch (no persistent workers)
            n += sum(1 for _ in fresh)
        del fresh
        for _ in range(2):                # a new loader, as a rollback opens one: new workers again
            n += sum(1 for _ in respawn)
        print("batches", n, "stop requested", requested(), flush=True)
        sys.stdin.read()                  # until the burst is over: Python's exit restores the default handlers
""")

BURST_S = 1.2  # one signal, repeated: within REPEAT_WINDOW_S (2 s) of the first, so the rank counts it once


def run_rank(tmp_path, method: str, epochs: int, sig: int) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    proc = start(
        [sys.executable, str(script), method, str(epochs)],
        stdin=subprocess.PIPE,
        start_new_session=True,  # its own process group, as a job step's
    )
    sent = 0
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        end = time.monotonic() + BURST_S
        while time.monotonic() < end and proc.poll() is None:
            os.killpg(proc.pid, sig)  # the rank and every worker it has started so far
            sent += 1
            time.sleep(0.001)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert sent > 100, sent
    assert proc.returncode == 0, (sent, err[-3000:])
    assert f"batches {4 * epochs + 8} stop requested True" in out, (out, err[-3000:])
    assert "killed by signal" not in err and "exited unexpectedly" not in err and "Traceback" not in err, err


def test_fresh_workers_outlive_a_group_sigterm(tmp_path):
    """The interpreter's default start method (fork before Python 3.14). With a plain DataLoader instead of
    WorkerLoader this failed in each of 4 runs ("killed by signal: Terminated" or "exited unexpectedly")."""
    run_rank(tmp_path, "default", 12, signal.SIGTERM)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP], ids=lambda s: s.name)
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_fresh_workers_outlive_group_signals_under_every_start_method(tmp_path, method, sig):
    """forkserver is the default on Linux from Python 3.14; spawn and forkserver start the resource tracker and
    the server with the signals blocked too (their death took the workers or the next start with them)."""
    run_rank(tmp_path, method, 12 if method == "fork" else 1, sig)
