"""Review of #39: a stop signal between two restart attempts (run/supervise.py). It used to meet the default
handler wherever the launcher was not waiting for the old ranks (the checkpoint's verification, begin, the next
launch.run before its relay): the launcher died with 143 and the stop's requeue semantics were lost; where it
was caught, the job ended with the failure's code. Now catching_stops is held across the whole loop and hands
what it caught to the next launch.run: a stop between attempts starts no attempt, and the job ends as a
stopped job ends (exit 75, REQUEUE, the exit status saying why).

Also the restart's clock (fs_now, first_new_step's times: the filesystem's, one clock) and the first-wins g<g>.failed
of several nodes (run/together.py)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import threading
import time

import psutil
import pytest

from conftest import CLI, clean_env, free_port, start
from taehv_launch.errors import EXIT_ABORTED, EXIT_FAILED, EXIT_RESUMABLE
from taehv_launch.run.restart import first_new_step, fs_now, wait_lock_free
from taehv_launch.run.supervise import catching_stops
from taehv_launch.run.together import Nodes
from trainrun import FAST


# ---------------------------------------------------------------- the pieces, in this process (fast)


def test_a_stop_caught_between_attempts_is_noted_not_fatal_and_the_old_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM)
    noted: list[int] = []
    with catching_stops(noted):
        os.kill(os.getpid(), signal.SIGTERM)  # the default handler would end this process (143)
        os.kill(os.getpid(), signal.SIGUSR1)
        deadline = time.monotonic() + 5
        while len(noted) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert noted == [signal.SIGTERM, signal.SIGUSR1]
    assert signal.getsignal(signal.SIGTERM) == before


def test_launch_run_starts_nothing_for_a_stop_noted_before_it(tmp_path):
    """The hand-off: the supervisor's list of caught stops goes into launch.run, which looks at it last thing
    before it starts `accelerate launch`: a stop there starts nothing (no process to kill, nothing to save)."""
    from taehv_launch.run import launch
    from taehv_launch.run.render import render
    from taehv_launch.run.request import Request, build_plan

    req = Request(gpus="1", profile="cpu", sets=[f"output_dir={str(tmp_path / 'output')!r}"])
    plan = build_plan(req, env=clean_env())
    run_dir = tmp_path / "output" / "r"
    run_dir.mkdir(parents=True)
    rendered = render(plan, run_dir)
    started: list[int] = []
    outcome: dict = {}
    t0 = time.monotonic()
    code = launch.run(plan, rendered, run_dir, outcome=outcome, on_start=lambda pid, say: started.append(pid),
                      held=[signal.SIGTERM])  # fmt: skip
    assert code == EXIT_ABORTED and started == [] and time.monotonic() - t0 < 5
    assert outcome == {"stop_requested": True, "not_started": "SIGTERM"}
    log = (run_dir / "launch.log").read_text().strip().splitlines()
    assert len(log) == 1 and log[0].startswith("=== taehv-launch ")  # the header only: no child ever wrote


def test_the_wait_for_the_old_ranks_ends_at_once_on_a_stop(tmp_path):
    lock = tmp_path / ".lock.trainer"
    held = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(held, fcntl.LOCK_SH)  # as an old rank (or its orphaned DataLoader worker) holds it
    try:
        t0 = time.monotonic()
        assert not wait_lock_free(lock, timeout_s=0.5, poll_s=0.05)
        assert time.monotonic() - t0 >= 0.5
        t0 = time.monotonic()
        assert not wait_lock_free(lock, timeout_s=60, poll_s=0.05, stopped=lambda: True)
        assert time.monotonic() - t0 < 1
    finally:
        os.close(held)
    assert wait_lock_free(lock, timeout_s=5, poll_s=0.05, stopped=lambda: False)


def test_a_restarts_times_are_all_on_the_filesystems_clock(tmp_path, monkeypatch):
    """failed_at (the exit status's mtime, or fs_now) and the first new step are file times: progress.json's
    own "time" field (its writer's clock, here an hour off) is not mixed in. Which records are the new
    attempt's is their attempt number's to say (tests/test_attempt_id.py), not these times."""
    monkeypatch.delenv("TAEHV_LAUNCH_ID", raising=False)
    (tmp_path / "heartbeat").mkdir()
    now = fs_now(tmp_path, 0)
    assert now == (tmp_path / ".lock.trainer").stat().st_mtime  # the node's trainer lock file, touched
    assert fs_now(tmp_path, 1) == (tmp_path / ".lock.node1.trainer").stat().st_mtime
    (tmp_path / "progress.json").write_text(json.dumps({"step": 5, "time": now - 3600, "attempt": 1}))
    at = now - 5
    os.utime(tmp_path / "progress.json", (at, at))
    assert first_new_step(tmp_path, 4, 1) == at  # its mtime, not its writer's "time"
    assert first_new_step(tmp_path, 5, 1) is None  # no step past the checkpoint's
    (tmp_path / "heartbeat" / "rank1").write_text(json.dumps({"rank": 1, "step": 6, "attempt": 1}))
    beat = now - 7
    os.utime(tmp_path / "heartbeat" / "rank1", (beat, beat))
    assert first_new_step(tmp_path, 5, 1) == beat


def test_the_first_failure_report_of_an_attempt_stands_and_a_second_is_said(tmp_path):
    said: list[str] = []
    n0 = Nodes(tmp_path, 0, 2, period_s=0.1, say=said.append).start()
    n1 = Nodes(tmp_path, 1, 2, period_s=0.1, say=said.append).start()
    try:
        failure = {"message": None, "peer": None, "ready": False, "restartable": True}
        assert n1.report(0, {**failure, "node": 1, "code": 137, "failed_at": 1.0})
        assert n0.report(0, {**failure, "node": 0, "code": EXIT_FAILED, "message": "boom", "failed_at": 2.0})
        first = json.loads((tmp_path / "restart" / "g0.failed").read_text())
        assert first["node"] == 1 and first["code"] == 137  # not overwritten by node 0's later report
        assert n1.peer_failure(0) is None and n0.peer_failure(0)["node"] == 1
        assert len(said) == 1 and said[0].startswith("node 0's ranks failed too (exit 1: boom), after node 1 ")
        assert "that first report stands" in said[0] and "g0.node0.json" in said[0]
        assert json.loads((tmp_path / "restart" / "g0.node0.json").read_text())["message"] == "boom"  # kept there
        assert n1.report(0, {**failure, "node": 1, "code": 137, "restartable": False})  # our own again: silent
        assert len(said) == 1
        # an earlier job's g1.failed (older than this job's start) is replaced, not taken for the first
        stale = tmp_path / "restart" / "g1.failed"
        stale.write_text(json.dumps({"node": 1, "code": 9}))
        os.utime(stale, (time.time() - 3600,) * 2)
        assert n0.report(1, {**failure, "node": 0, "code": EXIT_FAILED, "failed_at": 3.0})
        assert json.loads(stale.read_text())["node"] == 0 and len(said) == 1
    finally:
        n0.close()
        n1.close()


def _supervisor(tmp_path, node: int):
    """Node `node`'s Supervisor of a real 2-node cpu plan (one rank a node, restarts on), its Nodes started."""
    from taehv_launch.run.render import render
    from taehv_launch.run.request import Request, build_plan
    from taehv_launch.run.supervise import Supervisor

    sets = [f"output_dir={str(tmp_path / 'output')!r}", "max_restarts=3"]
    req = Request(gpus="2", profile="cpu", sets=sets, num_nodes=2, node_rank=node, master_addr="127.0.0.1",
                  master_port=free_port(), gpus_per_node=1)  # fmt: skip
    plan = build_plan(req, env=clean_env())
    run_dir = tmp_path / "output" / "r"
    run_dir.mkdir(parents=True, exist_ok=True)
    sup = Supervisor(plan, render(plan, run_dir), run_dir)
    sup.sync.start()
    return sup


def test_on_several_nodes_a_stop_between_attempts_ends_every_node_as_stopped(tmp_path):
    """Node 1's launcher got SIGTERM after its ranks failed: its report says "stopped"; node 0, whose own ranks
    were stopped for that failure, decides no restart with "stopped", and both end with 75 and REQUEUE. A node
    that says no for another reason (exit 2) makes no "stopped" decision."""
    from taehv_launch.run.supervise import Ended

    (tmp_path / "output" / "r" / "checkpoint-4").mkdir(parents=True)  # incomplete: not the newest complete one
    lead, other = _supervisor(tmp_path, 0), _supervisor(tmp_path, 1)
    try:
        other.stops.append(signal.SIGTERM)
        code1 = other.after_nodes(Ended(EXIT_FAILED, {"message": "boom"}, 1.0, True, False))
        assert code1 == EXIT_RESUMABLE
        report = json.loads((other.sync.report_path(0, 1)).read_text())
        assert report["stopped"] and not report["restartable"]
        code0 = lead.after_nodes(Ended(137, {}, 2.0, True, False, peer=report))
        assert code0 == EXIT_RESUMABLE
        decision = json.loads(lead.sync.decision_path(0).read_text())
        assert decision["restart"] is False and decision["stopped"] is True
        run = tmp_path / "output" / "r"
        assert json.loads((run / "REQUEUE").read_text()) == {"step": 0}  # no complete checkpoint yet
        for name in ("exit_status.json", "exit_status.node1.json"):
            status = json.loads((run / name).read_text())
            assert status["code"] == EXIT_RESUMABLE and "between restart attempts" in status["message"], name
        assert "there is no complete checkpoint yet" in status["message"]
        # attempt 1: node 1 says no for exit 2 (no stop): the decision is no restart, not "stopped"
        lead.count = other.count = 1
        other.stops.clear()
        lead.stops.append(signal.SIGTERM)  # node 0 was asked to stop too, but exit 2 ends the job anyway
        other.sync.report(1, {"node": 1, "code": 2, "restartable": False, "line": "exit 2", "stopped": False})
        assert lead.lead(1)["stopped"] is False
    finally:
        lead.sync.close()
        other.sync.close()


def test_a_stop_on_one_node_after_it_said_ready_stops_the_attempt_node_0_already_restarted(tmp_path):
    """Review finding: node 1 reported "ready" for a restart, node 0's gather returned and it decided to restart;
    then only node 1's launcher got SIGTERM (a pod eviction). Node 1 ends with 75 and says no to the next attempt
    as a failure of it (g1.failed): node 0's PeerWatch stops that attempt and its lead ends the job as stopped."""
    from taehv_launch.run.supervise import Ended
    from taehv_launch.run.together import PeerWatch

    lead, other = _supervisor(tmp_path, 0), _supervisor(tmp_path, 1)
    try:
        lead.sync.decide(0, {"restart": True, "line": "exit 1", "code": 1, "node": 1, "count": 1})  # already decided

        def ready_then_stopped() -> bool:  # the SIGTERM lands after node 1's "ready" report is written
            other.stops.append(signal.SIGTERM)
            return True

        other.wait_old_ranks = ready_then_stopped
        assert other.after_nodes(Ended(EXIT_FAILED, {"message": "boom"}, 1.0, True, False)) == EXIT_RESUMABLE
        failed = json.loads(other.sync.failed_path(1).read_text())
        assert failed["node"] == 1 and failed["stopped"] and failed["restartable"] is False
        watch = PeerWatch(lead.sync, 1)  # node 0's watch over the attempt it restarted
        try:
            deadline = time.monotonic() + 10
            while watch.fired is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert watch.fired is not None and watch.fired["node"] == 1
        finally:
            watch.end()
        lead.count = 1
        assert lead.after_nodes(Ended(137, {}, 2.0, True, False, peer=watch.fired)) == EXIT_RESUMABLE
        assert json.loads(lead.sync.decision_path(1).read_text())["stopped"] is True
        # killed for a peer while its own relay had caught a stop too: stopped, not the kill's code
        lead.count = other.count = 2
        other.sync.report(2, {"node": 1, "code": 1, "restartable": True, "ready": True, "stopped": False})
        assert lead.after_nodes(Ended(137, {}, 3.0, True, True, peer={"node": 1, "code": 1})) == EXIT_RESUMABLE
    finally:
        lead.sync.close()
        other.sync.close()


# ---------------------------------------------------------------- a real launcher (slow: it starts a trainer)


def _rank(launcher: int) -> int | None:
    """The pid of the trainer's rank under the launcher: the agent's child running main.py (launch.trainer_pids)."""
    from taehv_launch.run.launch import trainer_pids

    try:
        agents = psutil.Process(launcher).children(recursive=False)
    except psutil.NoSuchProcess:
        return None
    pids = [pid for agent in agents for pid in trainer_pids(agent.pid)]
    return pids[0] if pids else None


@pytest.mark.slow
def test_a_sigterm_while_the_restart_window_is_held_open_ends_with_75_and_the_requeue_marker(tmp_path):
    """One rank on the CPU, restarts on. Once checkpoint-2 is complete the rank is SIGKILLed; this test holds the
    trainer lock (as an orphaned DataLoader worker of the dead rank would), so the launcher sits between the
    attempts, waiting for the old processes. SIGTERM there: no restart, exit 75, REQUEUE at the newest complete
    checkpoint, the exit status and the console say why (before: the failure's 137 with no marker, and 143 where
    the launcher was verifying the checkpoint or starting the next attempt)."""
    env = clean_env(TAEHV_CACHE=str(tmp_path / "taehv-cache"), OMP_NUM_THREADS="1")
    argv = [*CLI, "1", "cpu", "--run-name", "w", "--master-port", str(free_port())]
    argv += ["--set", f"output_dir='{tmp_path / 'output'}'", *FAST, "--set", "max_restarts=2"]
    argv += ["--set", "max_train_steps=40", "--set", "validation_steps=100"]
    proc = start(argv, env=env, cwd=tmp_path)  # pipes, text
    run = tmp_path / "output" / "w"
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    lock_fd = None
    try:
        deadline = time.monotonic() + 300
        while not (run / "checkpoint-2" / "COMPLETE").exists() or _rank(proc.pid) is None:
            assert proc.poll() is None and time.monotonic() < deadline, "".join(err)[-3000:]
            time.sleep(0.1)
        lock_fd = os.open(run / ".lock.trainer", os.O_RDWR)
        fcntl.flock(lock_fd, fcntl.LOCK_SH)
        os.kill(_rank(proc.pid), signal.SIGKILL)
        while not any("taehv-launch: restart 1 of 2 after " in line for line in err):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(err)[-3000:]
            time.sleep(0.05)
        time.sleep(0.5)  # inside the wait for the old processes (it polls every 0.2 s)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        if lock_fd is not None:
            os.close(lock_fd)
        proc.kill()
        proc.wait()
        reader.join(timeout=10)
    stderr = "".join(err)
    assert code == EXIT_RESUMABLE, (code, stderr[-3000:])
    from taehv_launch.rundir.checkpoint import checkpoint_step, newest_complete

    newest, _ = newest_complete(run)
    assert newest is not None
    assert json.loads((run / "REQUEUE").read_text()) == {"step": checkpoint_step(newest)}
    status = json.loads((run / "exit_status.json").read_text())
    assert status["code"] == EXIT_RESUMABLE and status["message"].startswith("stopped by SIGTERM between restart")
    assert f"{newest.name} is the newest complete checkpoint" in status["message"]
    assert "taehv-launch: stopped by SIGTERM between restart attempts, none started after it" in stderr
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert not [e for e in events if e.get("event") == "restart"]  # the restart was never begun
    assert (run / "launch.log").read_text().count("=== taehv-launch ") == 1  # one attempt only
