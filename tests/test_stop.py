"""Stop signals at the process level, with real processes: DataLoader workers leave them to their
rank, the launcher's relay never counts as a second signal, and only rank processes are relayed to."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import start

WORKERS_SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    import torch
    from torch.utils.data import Dataset
    from taehv_launch.train.data.clips import worker_init_fn
    from taehv_launch.train.data.workers import WorkerLoader

    class Slow(Dataset):
        def __len__(self): return 10**6
        def __getitem__(self, i):
            time.sleep(0.01)
            return torch.tensor([i])

    def init(worker_id):
        worker_init_fn(worker_id)                                # the product's
        Path(os.environ["INIT_DIR"], str(os.getpid())).touch()   # then: this worker is initialised

    if __name__ == "__main__":
        method = None if sys.argv[1] == "default" else sys.argv[1]
        loader = WorkerLoader(Slow(), batch_size=1, num_workers=2, worker_init_fn=init, persistent_workers=True,
                              multiprocessing_context=method)
        it = iter(loader)
        workers = it._workers
        pids = sorted(w.pid for w in workers)
        deadline = time.monotonic() + 120                        # both workers ran their worker_init_fn
        while sorted(int(p.name) for p in Path(os.environ["INIT_DIR"]).iterdir()) != pids:
            assert time.monotonic() < deadline, "workers not initialised"
            time.sleep(0.01)
        print(" ".join(map(str, pids)), flush=True)
        sys.stdin.readline()            # the test signals the workers now
        for _ in range(20):
            next(it)
        print("alive", all(w.is_alive() for w in workers), flush=True)
        os.kill(workers[0].pid, signal.SIGTERM)   # from its own rank: the worker exits, as torch's terminate()
        workers[0].join(30)
        it._shutdown_workers()          # torch's own shutdown of the other
        print("exited", [w.exitcode for w in workers], flush=True)
""")


def run_workers(tmp_path, method: str) -> None:
    """Signals from elsewhere (a scheduler, a terminal) to both workers once they are initialised: ignored;
    SIGTERM from their rank: the worker exits 0."""
    (tmp_path / "init").mkdir()
    script = tmp_path / "workers.py"
    script.write_text(WORKERS_SCRIPT)
    proc = start(
        [sys.executable, str(script), method],
        stdin=subprocess.PIPE,
        env={**os.environ, "INIT_DIR": str(tmp_path / "init")},
    )
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2, proc.stderr.read()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGTERM):
            for pid in pids:
                os.kill(pid, sig)
        time.sleep(0.5)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "alive True" in out, (out, err)
    assert "exited [0, 0]" in out, (out, err)
    assert "Traceback" not in err and "killed by signal" not in err


def test_dataloader_workers_ignore_stop_signals_but_not_their_rank(tmp_path):
    run_workers(tmp_path, "default")


@pytest.mark.slow
def test_forkserver_workers_know_their_rank(tmp_path):
    """Under forkserver (the default on Linux from Python 3.14) a worker's parent is the server, not its rank: SIGTERM from
    the rank still ends it, and other stop signals are still ignored."""
    run_workers(tmp_path, "forkserver")


RANK_SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from taehv_launch.train.durability.stop import StopFlag, install
    install()
    flag = StopFlag()
    print("ready", flush=True)
    deadline = time.time() + 20
    while not flag.local and time.time() < deadline:
        time.sleep(0.05)
    sys.stdin.read()           # more signals may come until the test closes stdin: only a second direct one aborts
    print("stopping once", flag.local, flush=True)
""")


@pytest.mark.parametrize(
    "sequence,gap,code",
    [
        ((signal.SIGTERM, signal.SIGUSR2), 0.1, 0),  # direct and through the launcher: once
        ((signal.SIGUSR2, signal.SIGUSR1), 0.1, 0),  # through the launcher, then SLURM's direct one: once
        ((signal.SIGUSR2, signal.SIGUSR2), 0.1, 0),
        ((signal.SIGTERM, signal.SIGTERM), 0.005, 0),  # one stop delivered twice (GNU timeout): once
        ((signal.SIGTERM, signal.SIGTERM, signal.SIGTERM), 0.3, 0),  # repeats within the window: once
        ((signal.SIGUSR1, signal.SIGTERM), 0.1, 130),  # two different direct signals: abort at once
        ((signal.SIGTERM, signal.SIGINT), 0.005, 130),  # a person's Ctrl-C after a SIGTERM: abort
        ((signal.SIGTERM, signal.SIGTERM), 2.3, 130),  # the same signal again, later: abort
    ],
)
def test_relay_never_counts_as_a_second_signal(sequence, gap, code):
    proc = start([sys.executable, "-c", RANK_SCRIPT], stdin=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "ready"
    for i, sig in enumerate(sequence):
        time.sleep(gap if i else 0)
        proc.send_signal(sig)
    time.sleep(0.5)  # the last signal is handled before stdin closes (the rank's wait ends)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == code, (out, err)
    if code == 0:
        assert "stopping once True" in out
    else:
        # signals pending together (5 ms apart on a loaded machine) are handled in signal-number order, so
        # SIGINT can be handled before a SIGTERM sent first: the second handled is named
        names = {signal.Signals(s).name for s in (sequence if gap < 0.05 else sequence[-1:])}
        assert any(f"second signal ({n}): exiting without a checkpoint" in err for n in names), err


def test_counts_once_rule():
    from taehv_launch.rundir.signals import REPEAT_WINDOW_S, counts_once

    first = (signal.SIGTERM, 100.0)
    assert counts_once(first, signal.SIGTERM, 100.001)
    assert counts_once(first, signal.SIGTERM, 100.0 + REPEAT_WINDOW_S)
    assert not counts_once(first, signal.SIGTERM, 100.1 + REPEAT_WINDOW_S)
    assert not counts_once(first, signal.SIGINT, 100.001)
    assert not counts_once(first, signal.SIGUSR1, 100.001)


def test_worker_death_message_is_one_line():
    from taehv_launch.train.durability.stop import worker_death_message

    msg = worker_death_message(RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. "))
    assert msg.startswith("a DataLoader worker (pid 4242) is killed by signal: Killed: usually the out-of-memory")
    assert "\n" not in msg
    assert worker_death_message(RuntimeError("DataLoader worker (pid(s) 7, 8) exited unexpectedly")).startswith(
        "a DataLoader worker (pid 7, 8) exited unexpectedly:"
    )
    assert worker_death_message(RuntimeError("Caught ValueError in DataLoader worker process 0.")) is None


def test_launcher_relays_to_rank_processes_only(tmp_path):
    """trainer_pids: the agent's direct children that run main.py, not the workers forked from them."""
    import psutil

    from taehv_launch.run.launch import launch_pids, trainer_pids
    from taehv_launch.run.render import TRAINER_SCRIPT

    fake_rank = textwrap.dedent("""
        import os, sys, time
        if os.fork() == 0:        # a forked "worker": same command line
            time.sleep(60); os._exit(0)
        time.sleep(60)
    """)
    script = tmp_path / "agent.py"
    script.write_text(
        f"import subprocess, sys, time\n"
        f"ps = [subprocess.Popen([sys.executable, '-c', {fake_rank!r}, {str(TRAINER_SCRIPT)!r}])"
        f" for _ in range(2)]\ntime.sleep(60)\n"
    )
    agent = start([sys.executable, str(script)], capture=False, start_new_session=True)  # kill_launch kills its group
    try:
        deadline = time.time() + 20
        while len(launch_pids(agent.pid)) < 5 and time.time() < deadline:
            time.sleep(0.1)
        everything = launch_pids(agent.pid)
        assert len(everything) == 5, everything  # agent, 2 ranks, 2 workers
        ranks = trainer_pids(agent.pid)
        assert sorted(ranks) == sorted(p.pid for p in psutil.Process(agent.pid).children())
        assert len(ranks) == 2
    finally:
        from taehv_launch.run.launch import kill_launch

        kill_launch(agent.pid, launch_pids(agent.pid))
        agent.wait(timeout=10)
