"""A frozen rank that nobody else reports (#35 item 11): the launcher watches its node's heartbeats
(run/freeze.py) and `taehv-launch status` says `hung` once a heartbeat is older than the run's hang limit.

Fast: the launcher's watch on real heartbeat files of real processes (SIGSTOPped, or running with its
threads blocked: its faulthandler prints the stacks), no second report when the trainer reported, the
grace a live peer on the host gets, the job's limit; status on a run dir with a frozen rank.
Slow: `taehv-launch 1 cpu` with the cpu profile's DataLoader worker, the only rank SIGSTOPped: one
`error: job hung:` line, exit 76 within the limit, every process gone, status says so.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import textwrap
import time
from pathlib import Path

import pytest

from taehv_launch.errors import EXIT_HUNG
from taehv_launch.run.freeze import NodeWatch, freeze_line, recorded_code
from taehv_launch.rundir.hanglimits import HangLimits
from taehv_launch.rundir.heartbeat import (
    heartbeat_path,
    process_state,
    read_hang_reports,
    silence_limit,
    stacks_dir,
)
from taehv_launch.rundir.exitstatus import exit_status_path
from conftest import Proc, overrides, start, start_cli

HOST = socket.gethostname()


def beat(run: Path, rank: int, pid: int, age: float, *, node: int = 0, step: int = 5, phase: str = "forward", **kw):
    """A heartbeat as the trainer's watchdog writes it, last rewritten `age` seconds ago."""
    path = heartbeat_path(run, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    info = {"rank": rank, "node": node, "host": HOST, "pid": pid, "step": step, "phase": phase}
    info |= {"progress_age_s": 1.0, "collectives": 0, "warmup": False, "time": time.time() - age, **kw}
    path.write_text(json.dumps(info))
    os.utime(path, (time.time() - age, time.time() - age))


def watch(run: Path, calls: list, world: int = 1, **kw) -> NodeWatch:
    w = NodeWatch(
        run,
        0,
        world,
        exit_status_path(run, 0),
        kill=lambda: calls.append("kill"),
        note=calls.append,
        hang_timeout=kw.pop("hang_timeout", 10),
        hang_timeout_slow=kw.pop("hang_timeout_slow", 1800),
        **kw,
    )
    w.started -= 600  # the hand-made heartbeats are this launch's
    return w


def stopped_child() -> Proc:
    child = start([sys.executable, "-c", "import time; time.sleep(120)"], capture=False)
    os.kill(child.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while process_state(HOST, child.pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.05)
    return child


def test_a_stopped_rank_is_reported_by_the_launcher_once_its_limit_passes(tmp_path):
    child, calls = stopped_child(), []
    try:
        beat(tmp_path, 0, child.pid, age=4.0)  # progress 1 s + 4 s: under hang_timeout 10 s
        w = watch(tmp_path, calls)
        assert w.find_frozen() is None
        beat(tmp_path, 0, child.pid, age=10.0)  # stopped: no need to wait for a late heartbeat (15 s)
        frozen, limit = w.find_frozen()
        assert sorted(frozen) == [0] and frozen[0]["state"] == "T" and limit == (10, "hang_timeout")
        w.poll_s = 0.05
        w.start()
        deadline = time.monotonic() + 10
        while "kill" not in calls and time.monotonic() < deadline:
            time.sleep(0.05)
        w.end()
    finally:
        child.kill()
        child.wait()
    assert calls[-1] == "kill", calls
    line = json.loads(exit_status_path(tmp_path, 0).read_text())["message"]
    assert recorded_code(exit_status_path(tmp_path, 0)) == EXIT_HUNG
    assert line.startswith("job hung: rank 0 stuck in forward at step 5, no progress for 11 s (hang_timeout 10 s); ")
    assert "its process is stopped (SIGSTOP or job control)" in line
    assert "found by taehv-launch on node 0: the rank's own hang detector does not run" in line
    assert (
        f"stack dumps: {stacks_dir(tmp_path)} (none from rank 0: a stopped process cannot dump its own stacks)" in line
    )
    report = read_hang_reports(tmp_path)[0]  # what the job's other ranks read: they dump and stop with 76
    assert report["line"] == line and report["by"] == "taehv-launch node 0" and report["culprits"] == [0]
    assert report["missing"] == [0]


def test_no_second_report_once_the_trainer_reported_or_recorded_an_exit(tmp_path):
    child, calls = stopped_child(), []
    try:
        beat(tmp_path, 0, child.pid, age=30.0)
        w = watch(tmp_path, calls)
        assert w.find_frozen() is not None
        heartbeat_path(tmp_path, 1, ".hang").write_text(json.dumps({"line": "job hung: rank 0 ...", "by": 1}))
        assert w.find_frozen() is None  # the trainer's own detector reported: the launcher stays quiet
        heartbeat_path(tmp_path, 1, ".hang").unlink()
        exit_status_path(tmp_path, 0).write_text(json.dumps({"code": 75, "message": "ok"}))
        assert w.find_frozen() is None  # the trainer has ended
    finally:
        child.kill()
        child.wait()


def test_only_this_nodes_ranks_on_this_host_and_this_launch_are_judged(tmp_path):
    child, calls = stopped_child(), []
    try:
        w = watch(tmp_path, calls)
        beat(tmp_path, 0, child.pid, age=30.0, node=1)  # another node's launcher watches it
        assert w.find_frozen() is None
        beat(tmp_path, 0, child.pid, age=30.0, host="elsewhere")
        assert w.find_frozen() is None
        beat(tmp_path, 0, child.pid, age=30.0)
        w.started += 600  # an earlier launch's heartbeat
        assert w.find_frozen() is None
    finally:
        child.kill()
        child.wait()
    w.started -= 600
    beat(tmp_path, 0, child.pid, age=30.0)  # its process is gone: accelerate / torchrun see the exit
    assert w.find_frozen() is None


def test_a_live_peer_on_this_host_reports_first_and_a_slow_phase_holds_the_limit(tmp_path):
    child, calls = stopped_child(), []
    try:
        beat(tmp_path, 0, child.pid, age=12.0)
        beat(tmp_path, 1, os.getpid(), age=1.0, phase="collective")  # a live rank here: its watchdog reports
        w = watch(tmp_path, calls, world=2)
        assert w.find_frozen() is None  # 13 s of no progress: under 10 + 10 s (its peer's turn first)
        beat(tmp_path, 0, child.pid, age=20.0)
        assert sorted(w.find_frozen()[0]) == [0]
        beat(tmp_path, 1, os.getpid(), age=1.0, phase="checkpoint")  # a peer saving: the slow limit
        assert w.find_frozen() is None
    finally:
        child.kill()
        child.wait()


def test_the_jobs_limit_is_the_slow_one_while_a_running_rank_is_in_a_slow_phase():
    fast, slow, lim = {"phase": "forward"}, {"phase": "checkpoint"}, HangLimits(300, 1800)
    assert silence_limit([fast, fast], lim) == (300, "hang_timeout")
    assert silence_limit([fast, slow], lim) == (1800, "hang_timeout_slow")
    assert silence_limit([fast, {"phase": "data", "warmup": True}], lim) == (1800, "hang_timeout_slow")
    assert silence_limit([fast, {**slow, "state": "T"}], lim) == (300, "hang_timeout")  # stopped: no allowance
    assert silence_limit([fast], lim, world=2) == (1800, "hang_timeout_slow")  # a rank not beating yet
    assert silence_limit([{"phase": ["not", "text"]}], lim) == (300, "hang_timeout")  # a bad field


BLOCKED = textwrap.dedent("""
    import faulthandler, sys, time
    from taehv_launch.rundir.heartbeat import STACKS_SIGNAL
    faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True)  # as train/main.py does
    def stuck_in_native_code():
        print("ready", flush=True)
        time.sleep(120)
    stuck_in_native_code()
""")


def test_a_running_rank_whose_heartbeat_stopped_is_asked_for_its_stacks(tmp_path):
    err = tmp_path / "rank.err"
    with open(err, "w") as f:
        child = start([sys.executable, "-c", BLOCKED], stderr=f)  # stdout: a pipe
    calls = []
    try:
        assert child.stdout.readline() == "ready\n"
        beat(tmp_path, 0, child.pid, age=20.0)  # older than SILENT_S: its threads do not run
        w = watch(tmp_path, calls)
        w.poll_s = 0.05
        w.start()
        deadline = time.monotonic() + 15
        while "kill" not in calls and time.monotonic() < deadline:
            time.sleep(0.05)
        w.end()
        assert child.poll() is None  # alive: only asked for its stacks (kill is the launch's, here a list)
    finally:
        child.kill()
        child.wait()
    assert calls[-1] == "kill", calls
    assert "in stuck_in_native_code" in err.read_text()  # every thread's Python stack, from faulthandler
    line = json.loads(exit_status_path(tmp_path, 0).read_text())["message"]
    assert "its process sleeps but its threads are blocked" in line
    assert "rank 0: Python stacks in the launch log" in line


def test_the_line_names_every_frozen_rank():
    frozen = {
        r: {"step": s, "phase": p, "progress_age_s": 40.0, "beat_age_s": 35.0, "state": "T"}
        for r, s, p in [(2, 7, "forward"), (3, 7, "data")]
    }
    line = freeze_line(frozen, (30, "hang_timeout"), 1, Path("/r/heartbeat/stacks"))
    assert line.startswith("job hung: ranks 2, 3 stuck (rank 2 in forward at step 7; rank 3 in data at step 7), ")
    assert "found by taehv-launch on node 1" in line and "(none from ranks 2, 3: a stopped process" in line


# ----------------------------------------------------------------------------- status


def run_dir_with_a_frozen_rank(tmp_path: Path, pid: int, hang_timeout: int, age: float) -> Path:
    run = tmp_path / "output" / "r"
    run.mkdir(parents=True)
    (run / "config.py").write_text(f"args.hang_timeout = {hang_timeout}\nargs.hang_timeout_slow = 1800\n")
    (run / "launch.log").write_text("step 5/100 | loss 0.5\n")
    (run / ".lock").write_text(json.dumps({"host": HOST, "pid": os.getpid(), "since": "now"}))
    os.utime(run / ".lock", (time.time() - 120, time.time() - 120))
    beat(run, 0, pid, age=age)
    return run


def test_status_says_hung_when_a_heartbeat_is_older_than_the_runs_hang_limit(tmp_path):
    from taehv_launch.watch.status import collect
    from taehv_launch.watch.statustext import render, table

    child = stopped_child()
    try:
        run = run_dir_with_a_frozen_rank(tmp_path, child.pid, 30, age=45.0)
        f = collect(run)
        text = render([f], f["now"])
    finally:
        child.kill()
        child.wait()
    assert f["state"] == "hung", text
    assert f["heartbeat_ranks"][0]["not_responding"] and f["heartbeat_ranks"][0]["limit_s"] == 30
    assert "  state      hung: rank 0 not responding (heartbeat 45 s ago, past the hang limit of 30 s): frozen" in text
    assert "  rank 0     node 0 (" in text and "step 5, forward, not responding; heartbeat 45 s ago" in text
    assert table([f])[1].split()[1] == "hung"


def test_status_says_running_under_the_limit_with_hang_detection_off_or_once_the_process_is_gone(tmp_path):
    from taehv_launch.watch.status import collect

    child = stopped_child()
    try:
        assert collect(run_dir_with_a_frozen_rank(tmp_path / "a", child.pid, 60, age=45.0))["state"] == "running"
        assert collect(run_dir_with_a_frozen_rank(tmp_path / "b", child.pid, 0, age=45.0))["state"] == "running"
    finally:
        child.kill()
        child.wait()
    assert collect(run_dir_with_a_frozen_rank(tmp_path / "c", child.pid, 30, age=45.0))["state"] == "running"


# ----------------------------------------------------------------------------- the real launch


@pytest.mark.slow
def test_the_only_rank_sigstopped_is_reported_hung_exit_76_and_status_says_so(tmp_path):
    """`taehv-launch 1 cpu --set hang_timeout=10` (the cpu profile's DataLoader worker), the rank frozen with
    SIGSTOP after a few steps: its own watchdog is a thread of it, so only the launcher can tell."""
    import psutil

    from conftest import clean_env, run_cli

    run = tmp_path / "output" / "frozen"
    out, err = tmp_path / "out", tmp_path / "err"
    argv = ["1", "cpu", "--run-name", "frozen"]
    argv += overrides(f"output_dir='{tmp_path / 'output'}'", "log_every=1 max_train_steps=10000 hang_timeout=10")
    argv += ["--set", "max_restarts=0"]  # the freeze's exit 76 is checked here; restarts: test_restart.py
    argv += overrides("validation_steps=100000 checkpointing_steps=100000")
    env = clean_env(TAEHV_CACHE=str(tmp_path.parent / "taehv-cache"), OMP_NUM_THREADS="1")
    launcher = start_cli(*argv, env=env, cwd=tmp_path, out=out, err=err)
    try:
        launcher.wait_for("step 4/", timeout=300)
        agent = psutil.Process(launcher.pid).children()[0]
        rank = agent.children()[0]
        workers = rank.children()
        assert "main.py" in " ".join(rank.cmdline()) and len(workers) == 1, (rank.cmdline(), workers)
        os.kill(rank.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        code = launcher.wait(timeout=90)
        elapsed = time.monotonic() - t0
    finally:
        for p in psutil.Process().children(recursive=True):
            p.kill()
    text = out.read_text() + "\nSTDERR\n" + err.read_text()
    assert code == EXIT_HUNG, text
    assert elapsed < 10 + 10, (elapsed, text)  # hang_timeout, and the launcher's 1 s polls on a busy machine
    lines = [line for line in err.read_text().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: job hung: rank 0 stuck in "), text
    assert (
        "its process is stopped (SIGSTOP or job control)" in lines[0] and "found by taehv-launch on node 0" in lines[0]
    )
    assert "Traceback" not in text
    time.sleep(1)
    left = [p.pid for p in (agent, rank, *workers) if psutil.pid_exists(p.pid) and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, left
    status = run_cli("status", str(run), env=env)
    assert status.returncode == 0, status.stderr
    assert "  state      failed " in status.stdout and "exit 76 (job hung: rank 0 stuck in " in status.stdout
    assert "  hang       job hung: rank 0 " in status.stdout
