"""Restart in place on several nodes (#39, run/together.py): the agreement's files and threads on real files
and a real process, and (slow) two launchers on this machine as two nodes (one CPU rank each, gloo): a
SIGKILLed rank on node 1 restarts both nodes together; a node that is gone ends the job on the other."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from conftest import Proc, clean_env, free_port, overrides, run_cli, start, start_cli
from taehv_launch.errors import EXIT_FAILED, EXIT_RESUMABLE
from taehv_launch.rundir.launches import read_lock
from taehv_launch.rundir.launchid import LAUNCH_ID
from taehv_launch.run.together import BEACON_STALE_S, Nodes, PeerWatch, root_failure
from test_restart import rank_pid
from trainrun import FAST


def report(node: int, code: int = EXIT_FAILED, ready: bool = True, **kw) -> dict:
    rec = {"node": node, "code": code, "message": None, "peer": None, "failed_at": 100.0 + node}
    return rec | {"restartable": True, "line": f"exit {code}", "ready": ready} | kw


@pytest.fixture
def pair(tmp_path):
    nodes = [Nodes(tmp_path, k, 2, period_s=0.1, stale_s=1.0).start() for k in (0, 1)]
    yield nodes
    for n in nodes:
        n.close()


def test_a_failure_report_stops_the_other_nodes_and_a_saved_stop_does_not(pair):
    n0, n1 = pair
    assert n0.peer_failure(0) is None
    n1.report(0, report(1, 137, ready=False))
    assert n0.peer_failure(0)["code"] == 137 and n1.peer_failure(0) is None  # not our own
    assert n0.peer_failure(1) is None  # another attempt's
    n1.report(1, report(1, EXIT_RESUMABLE, ready=False))  # every rank stops with a checkpoint by itself
    assert n0.peer_failure(1) is None


def test_node_0_decides_once_every_node_is_ready(pair):
    n0, n1 = pair
    n0.report(0, report(0, 137, ready=False, peer=1, failed_at=99.0))  # stopped for node 1: not the cause
    n1.report(0, report(1))
    reports, why = n0.gather(0, lambda: False, timeout_s=0.3)
    assert why is not None and "did not report ready" in why  # node 0's own report is not ready yet
    n0.report(0, report(0, 137, peer=1, failed_at=99.0))
    reports, why = n0.gather(0, lambda: False, timeout_s=5)
    assert why is None and sorted(reports) == [0, 1]
    assert root_failure(reports)[0] == 1  # the node whose own ranks failed, though node 0 reported earlier
    n0.decide(0, {"restart": True, "line": "exit 1", "checkpoint": "checkpoint-2", "count": 1})
    assert n1.wait_decision(0, lambda: False, timeout_s=5)["checkpoint"] == "checkpoint-2"
    # a stop asked for is never swallowed by a restart: not by "all ready", not by a decision already written
    assert n0.gather(0, lambda: True, timeout_s=5)[1] == "node 0's launcher was asked to stop"
    assert n1.wait_decision(0, lambda: True, timeout_s=5) == {
        "restart": False,
        "line": "node 1's launcher was asked to stop",
    }


def test_a_node_whose_own_verdict_is_no_ends_the_job(pair):
    n0, n1 = pair
    n0.report(0, report(0))
    n1.report(0, report(1, 2, restartable=False, line="a configuration or input error (exit 2)"))
    assert n0.gather(0, lambda: False, timeout_s=5)[1] == "node 1: a configuration or input error (exit 2)"


def test_a_node_whose_launcher_is_gone_ends_the_job_within_the_beacon_limit(tmp_path):
    n0 = Nodes(tmp_path, 0, 2, period_s=0.1, stale_s=1.0).start()
    n1 = Nodes(tmp_path, 1, 2, period_s=0.1, stale_s=1.0).start()
    try:
        n0.report(0, report(0))
        n1.close()  # node 1's launcher stops beating (killed with its node)
        t0 = time.monotonic()
        reports, why = n0.gather(0, lambda: False, timeout_s=30)
        assert why.startswith("node 1 is gone: its launcher has not answered for") and time.monotonic() - t0 < 5
        n0.close()
        d = n1.wait_decision(0, lambda: False, timeout_s=30)  # node 1's view of a gone node 0
        assert not d["restart"] and d["line"].startswith("node 0 is gone")
        assert n1.wait_decision(1, lambda: True, timeout_s=30)["line"] == "node 1's launcher was asked to stop"
    finally:
        n0.close()


def test_an_earlier_jobs_records_are_ignored_and_removed(tmp_path):
    first = Nodes(tmp_path, 1, 2).start()
    first.report(0, report(1))
    first.close()
    old = time.time() - 3600
    for p in (tmp_path / "restart").iterdir():
        os.utime(p, (old, old))
    (tmp_path / "restart" / "g0.decision.json").write_text('{"restart": true}')
    os.utime(tmp_path / "restart" / "g0.decision.json", (old, old))
    n0 = Nodes(tmp_path, 0, 2, period_s=0.1).start()  # a new job: node 0 first; node 1's old report stays
    try:
        assert n0.peer_failure(0) is None and n0.gather(0, lambda: False, timeout_s=0.3)[0] == {}
        assert not (tmp_path / "restart" / "g0.decision.json").exists()  # node 0 removed its own
        n1 = Nodes(tmp_path, 1, 2, period_s=0.1).start()
        assert not (tmp_path / "restart" / "g0.node1.json").exists()
        n1.close()
    finally:
        n0.close()


def test_the_peer_watch_kills_this_nodes_launch_on_a_peer_failure(pair):
    n0, n1 = pair
    launch = start(["sleep", "60"], capture=False, start_new_session=True)
    said: list[str] = []
    watch = PeerWatch(n0, 0)
    try:
        watch.attach(launch.pid, said.append)
        time.sleep(0.7)
        assert launch.poll() is None  # nothing reported: it runs on
        n1.report(0, report(1, 137, ready=False, message="boom"))
        assert launch.wait(timeout=10) == -signal.SIGKILL
        assert watch.fired["node"] == 1
        assert said == [
            "taehv-launch: node 1's ranks failed (a process was killed (exit 137, signal 9)): stopping this node's ranks too\n"
        ]
    finally:
        watch.end()
        launch.kill()
        launch.wait()


# ---------------------------------------------------------------- two launchers as two nodes (slow)


def _nodes(tmp: Path, *extra: str) -> list[Proc]:
    """`taehv-launch 2 cpu` as node 0 and node 1 of one job (one rank each), restarts on (tests/test_multinode.py
    runs the same two nodes with restarts off)."""
    env = clean_env(TAEHV_CACHE=str(tmp.parent / "taehv-cache"), OMP_NUM_THREADS="1")  # the demo data: once
    argv = ["2", "cpu", "--run-name", "mn", "--num-nodes", "2", "--gpus-per-node", "1"]
    argv += ["--master-addr", "127.0.0.1", "--master-port", str(free_port()), "--set", f"output_dir='{tmp / 'output'}'"]
    argv += [*FAST, *overrides("max_restarts=3 validation_steps=100"), *extra]
    return [start_cli(*argv, "--node-rank", str(k), env=env, cwd=tmp) for k in (0, 1)]


def _events(run: Path) -> list[dict]:
    path = run / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_a_sigkilled_rank_on_node_1_restarts_both_nodes_together(tmp_path):
    # a DataLoader worker per rank, as the cpu profile runs: the orphaned worker of the killed rank holds the
    # trainer lock until it notices; node 1's launcher waits for it before it reports ready
    procs = _nodes(tmp_path, *overrides("max_train_steps=4 dataloader_num_workers=1"))
    run = tmp_path / "output" / "mn"
    try:
        os.kill(rank_pid(run, 1, 2), signal.SIGKILL)  # node 1's only rank, once checkpoint-2 is complete
        killed_at = time.time()
        outs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for k, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, (k, out[-3000:], err[-3000:])
        assert "taehv-launch: restart 1 of 3 after " in err and "(all 2 nodes together)" in err, (k, err)
    assert "taehv-launch: node 1's ranks failed (" in outs[0][1]  # node 0 stopped its rank at once

    events = _events(run)
    restarts = [e for e in events if e["event"] == "restart"]
    assert len(restarts) == 1 and (restarts[0]["node"], restarts[0]["nodes"]) == (1, 2), events
    ckpt = restarts[0]["checkpoint"]
    assert ckpt == "checkpoint-2", ckpt  # the newest complete one when rank 1 died
    first = [e["first_step_at"] for e in events if e["event"] == "restarted"]
    assert [e["restart"] for e in events if e["event"] == "restarted"] == [1]
    print(f"\nCPU, 2 nodes x 1 rank: SIGKILL of node 1's rank to the first new step: {first[0] - killed_at:.1f} s")
    for log in ("launch.log", "launch.node1.log"):  # both nodes resumed the same checkpoint
        assert f"--resume {run / ckpt}" in (run / log).read_text(), log
    prog = json.loads((run / "progress.json").read_text())
    ids = [read_lock(run, k)[LAUNCH_ID] for k in (0, 1)]  # each node's launcher's own launch id
    assert prog["step"] == 4 and prog["attempt"] == 1, prog  # written by the restarted attempt (its number)
    assert None not in ids and ids[0] != ids[1] and prog["launch_ids"] == sorted(ids), (prog, ids)
    doc = json.loads(run_cli("status", "--json", str(run), timeout=120).stdout)["runs"][0]
    assert sorted(r["node"] for r in doc["heartbeat_ranks"]) == [0, 1], doc["heartbeat_ranks"]  # node 1 named

    status = run_cli("status", str(run), timeout=120)
    assert status.returncode == 0, status.stderr
    assert "restarts   1 in the job; last " in status.stdout, status.stdout


@pytest.mark.slow
def test_a_node_that_is_gone_ends_the_job_on_the_other_node(tmp_path):
    procs = _nodes(tmp_path, "--set", "max_train_steps=8")
    run = tmp_path / "output" / "mn"
    try:
        rank_pid(run, 1, 1, checkpoint=None)  # training runs on both nodes
        node1 = psutil.Process(procs[1].pid)
        for proc in [node1, *node1.children(recursive=True)]:  # its launcher and every process under it
            proc.kill()
        gone = time.monotonic()
        out, err = procs[0].communicate(timeout=600)
        took = time.monotonic() - gone
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    assert procs[0].returncode == EXIT_FAILED, (out[-3000:], err[-3000:])
    assert "taehv-launch: not restarting: node 1 is gone: its launcher has not answered for " in err, err
    # the rank's watchdog finds its dead peer (30 s stale limit), node 0's launcher its silent one
    assert took < 30 + BEACON_STALE_S + 30, took
    print(f"\nnode 1 gone: node 0 ended {took:.0f} s later")
    assert not [e for e in _events(run) if e["event"] == "restart"]
