"""The trainer dies with its launcher (#35 item 2): SIGKILL the launcher (or close its terminal) and
its trainer must not train on beside a relaunch of the same run.

Fast: a rank process with the cpu profile's kind of DataLoader workers watches the pid of the process
that started it (train/durability/stop.py): killed, the rank prints into the launch log instead of the
dead pipe, asks for the checkpoint stop, and it and its workers exit, releasing the trainer lock; a
launch of the run is refused (one line, exit 2) while an earlier launch's trainer holds that lock.
Slow: the real `taehv-launch 1 cpu` with 2 DataLoader workers, its launcher SIGKILLed: every process of
the launch (agent, rank, workers) ends, with a checkpoint, exit status 75 and REQUEUE, and a relaunch
continues from it; and the launcher in a terminal that is closed (SIGHUP): checkpoint, exit 75, the last
lines kept in launch.log.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from conftest import assert_one_line_error, clean_env, overrides, run_cli, start
from trainrun import start_launch

RANK = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import torch
    from torch.utils.data import DataLoader, Dataset
    from taehv_launch.train.data.clips import worker_init_fn
    from taehv_launch.train.durability import stop

    stop.install()
    stop.hold_trainer_lock(Path(sys.argv[1]), 0)   # as train/main.py does, first thing
    stop.watch_launcher("0")

    class Slow(Dataset):
        def __len__(self): return 10**6
        def __getitem__(self, i):
            time.sleep(0.02)
            return torch.tensor([i])

    loader = DataLoader(Slow(), batch_size=1, num_workers=2, worker_init_fn=worker_init_fn, persistent_workers=True)
    it = iter(loader)
    next(it)
    print("pids", os.getpid(), *[w.pid for w in it._workers], flush=True)
    while not stop.requested():
        next(it)
        print("step", flush=True)   # into the launcher's pipe; once it is dead, into the launch log
    print("stopping:", stop.launcher_gone(), flush=True)
    sys.exit(75)
""")

LAUNCHER = textwrap.dedent("""
    import os, subprocess, sys
    from taehv_launch.run.console import start_time
    from taehv_launch.run.launch import LAUNCHER_ENV

    env = {**os.environ, LAUNCHER_ENV: f"{os.getpid()} {start_time()} {sys.argv[2]}"}
    child = subprocess.Popen([sys.executable, "-c", sys.argv[3], sys.argv[1]], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    for line in child.stdout:       # as the launcher's tee does
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
""")


def gone(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def locked(path: Path) -> bool:
    """Whether some process holds a flock on path (probed with an exclusive one, released at once)."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_a_rank_whose_launcher_was_killed_stops_and_its_workers_do_not_outlive_it(tmp_path):
    from taehv_launch.rundir.layout import trainer_lock_path

    log = tmp_path / "launch.log"
    launcher = start([sys.executable, "-c", LAUNCHER, str(tmp_path), str(log), RANK], stderr=subprocess.STDOUT)
    pids: list[int] = []
    try:
        for line in launcher.stdout:
            if line.startswith("pids "):
                pids = [int(p) for p in line.split()[1:]]
                break
        assert len(pids) == 3, pids  # the rank and its 2 DataLoader workers
        assert locked(trainer_lock_path(tmp_path, 0))
        launcher.kill()  # SIGKILL: no handler, no relay
        launcher.wait()
        deadline = time.monotonic() + 30
        while not all(gone(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [p for p in pids if not gone(p)]
    finally:
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert not left, f"still running after the launcher died: {left}"  # the rank, and its workers after it
    assert not locked(trainer_lock_path(tmp_path, 0))  # a relaunch may take the run now
    text = log.read_text()
    assert f"[rank 0] taehv-launch (pid {launcher.pid}) ended while the trainer ran (killed?): stopping" in text
    assert f"stopping: taehv-launch (pid {launcher.pid}) ended" in text  # its prints went to the log
    assert "BrokenPipeError" not in text and "Traceback" not in text


def test_a_launcher_that_is_already_gone_or_another_process_is_a_stop_at_once(tmp_path):
    log = tmp_path / "launch.log"
    script = "import time; from taehv_launch.train.durability import stop; stop.watch_launcher('3'); "
    script += "time.sleep(1); print('requested', stop.requested(), flush=True)"
    env = clean_env(TAEHV_LAUNCHER=f"{os.getpid()} 1 {log}")  # our pid, but not our start time: pid reused
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "", proc
    assert f"[rank 3] taehv-launch (pid {os.getpid()}) ended" in log.read_text()
    assert "requested True" in log.read_text()
    proc = subprocess.run([sys.executable, "-c", script], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert proc.stdout == "requested False\n", proc  # run by hand, without a launcher: nothing to watch


def test_a_launch_is_refused_while_an_earlier_launchs_trainer_still_holds_the_run(tmp_path):
    from taehv_launch.run.lock import RunLock

    run = tmp_path / "output" / "r"
    run.mkdir(parents=True)
    holder = start(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from taehv_launch.train.durability import stop; "
            "stop.hold_trainer_lock(Path(sys.argv[1]), 0); print('held', flush=True); time.sleep(120)",
            str(run),
        ],
        stderr=None,  # stdout: a pipe
    )
    try:
        assert holder.stdout.readline() == "held\n"
        env = clean_env(TAEHV_CACHE=str(tmp_path / "cache"))
        out = run_cli(
            "1", "cpu", "--run-name", "r", "--set", f"output_dir='{tmp_path / 'output'}'", env=env, cwd=tmp_path
        )
        assert_one_line_error(
            out, rf"^error: {run} is still in use by the trainer of an earlier launch \(pid {holder.pid}\)"
        )
        assert "wait for it to end (or kill it), or pass another --run-name" in out.stderr
        assert not (run / "config.py").exists() and not (run / "launch.log").exists()  # nothing written
    finally:
        holder.kill()
        holder.wait()
    lock = RunLock(run, 0)
    lock.acquire()  # the old trainer has gone: the run is free again
    lock.release()


# ----------------------------------------------------------------------------- the real launch


class Launch:
    """`taehv-launch RANKS cpu` with 2 DataLoader workers a rank, output into files (or a terminal: `tty`)."""

    def __init__(self, tmp: Path, *args: str, tty: bool = False, ranks: int = 1):
        self.run, self.out = tmp / "output" / "o", tmp / f"out.{len(list(tmp.glob('out.*')))}"
        settings = overrides("log_every=1 dataloader_num_workers=2 validation_steps=100000 checkpointing_steps=100000")
        if tty:  # the launcher leads a session whose controlling terminal is a pty we hold the master of
            self.master, slave = os.openpty()
            self.proc = start_launch(
                tmp,
                ranks,
                *settings,
                *args,
                run_name="o",
                fast=False,
                capture=False,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                start_new_session=True,
                preexec_fn=lambda: fcntl.ioctl(0, __import__("termios").TIOCSCTTY, 0),
            )
            os.close(slave)
            self.seen = bytearray()
            threading.Thread(target=self._drain, daemon=True).start()
        else:  # stdout and stderr into one file
            self.proc = start_launch(tmp, ranks, *settings, *args, run_name="o", fast=False, out=self.out)

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.seen += data

    def step(self) -> int:
        try:
            return json.loads((self.run / "progress.json").read_text())["step"]
        except (OSError, ValueError, KeyError):
            return 0

    def wait_for_step(self, step: int, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while self.step() < step:
            assert self.proc.poll() is None, self.text()
            assert time.monotonic() < deadline, self.text()
            time.sleep(0.2)

    def text(self) -> str:
        log = self.run / "launch.log"
        return log.read_text(errors="replace")[-4000:] if log.exists() else ""

    def processes(self) -> list:
        import psutil

        return psutil.Process(self.proc.pid).children(recursive=True)


def complete(run: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in run.glob("checkpoint-*") if (p / "COMPLETE").is_file())


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_the_trainer_of_a_sigkilled_launcher_saves_stops_and_the_run_continues(tmp_path, ranks):
    """1 rank: accelerate's simple launcher in between; 2: torchrun's agent, each rank in a session of its own."""
    launch = Launch(tmp_path, "--set", "max_train_steps=100000", ranks=ranks)
    launch.wait_for_step(3)
    procs = launch.processes()  # the agent, each rank and its 2 DataLoader workers
    assert len(procs) == 1 + 3 * ranks, procs
    launch.proc.kill()  # SIGKILL: the launcher can do nothing
    launch.proc.wait()
    deadline = time.monotonic() + 120
    while not all(gone(p.pid) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(gone(p.pid) for p in procs), [p.pid for p in procs if not gone(p.pid)]
    status = json.loads((launch.run / "exit_status.json").read_text())
    assert status.pop("launch_id")  # the launch's, inherited by the trainer (rundir/launchid.py)
    assert status.pop("attempt") == 0  # the launch's first attempt (restarts so far), inherited too
    why = f"taehv-launch (pid {launch.proc.pid}) ended while the trainer ran (killed?)"
    assert status == {"code": 75, "message": f"{why}: the trainer saved a checkpoint and stopped"}
    saved = complete(launch.run)[-1]
    assert saved >= 3 and json.loads((launch.run / "REQUEUE").read_text())["step"] == saved
    text = launch.text()
    for rank in range(ranks):
        assert f"[rank {rank}] {why}: stopping after this step with a checkpoint" in text, text
    assert "Traceback" not in text.split(why, 1)[1].replace("CalledProcessError", ""), text  # none of the trainer's
    again = Launch(tmp_path, "--resume", "auto", "--set", f"max_train_steps={saved + 1}", ranks=ranks)  # free
    assert again.proc.wait(timeout=300) == 0, again.out.read_text()[-3000:]
    assert f"checkpoint-{saved} at step {saved}" in again.out.read_text()


@pytest.mark.slow
def test_closing_the_launchers_terminal_saves_a_checkpoint_and_exits_75(tmp_path):
    launch = Launch(tmp_path, "--set", "max_train_steps=100000", tty=True)
    launch.wait_for_step(2)
    before = complete(launch.run)
    os.close(launch.master)  # the terminal window closes: SIGHUP to the launcher, writes to it fail (EIO)
    assert launch.proc.wait(timeout=180) == 75, launch.text()
    text = launch.text()
    assert "taehv-launch: got SIGHUP: asking the trainer to save a checkpoint and stop" in text
    assert "taehv-launch: trainer exited with code 75" in text  # printed after the terminal was gone
    # launch.log keeps accelerate's own traceback for the rank's exit 75, as always; none of ours
    assert "Error" not in text.replace("CalledProcessError", "") and "taehv_launch/cli" not in text, text
    assert complete(launch.run) and complete(launch.run) != before
    assert json.loads((launch.run / "exit_status.json").read_text())["code"] == 75
