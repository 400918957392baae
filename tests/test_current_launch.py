"""Which launch `status` and `diff` read (rundir/launches.py current_launch), two cases the launch ids of #40
step 6 left open, each with the run directory's files written here (fast):

- a launch that took node 0's .lock (rewritten with its id) and ended before it wrote its manifest record:
  status shows the launch before it, whose records there are, and names the one that never started;
- on several nodes, node k's .lock / records left by an earlier launch while node k of the current launch
  has not started: not this launch's. A node's id counts once node 0's launch names it (the trainer gathers
  every rank's launch id at its start; rank 0 writes them in progress.json as "launch_ids")."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

from conftest import run_cli_here, start
from taehv_launch.rundir.launches import current_launch
from taehv_launch.rundir.launchid import LAUNCH_ID
from taehv_launch.rundir.layout import launcher_lock_path
from taehv_launch.rundir.manifest import manifest_path
from taehv_launch.rundir.progress import PROGRESS_FILE
from taehv_launch.watch.diff import run_side
from taehv_launch.watch.status import collect

A, B, B1, OLD1 = "20261126T100000Z-aaaaaaaa", "20261127T110000Z-bbbbbbbb", "20261127T110001Z-b1b1b1b1", "old-node-1"


def dead_pid() -> int:
    p = start(["true"], capture=False)
    p.wait()
    return p.pid


def ended_launch(root: Path, now: float) -> Path:
    """Launch A ran to the end: its manifest record, progress.json, heartbeat and exit status."""
    run = root / "output" / "r"
    (run / "heartbeat").mkdir(parents=True)
    (run / "config.py").write_text("args.max_train_steps = 20\n")
    (run / "launch.log").write_text("\n=== taehv-launch 2026-01-01 00:00:00: accelerate launch\n")
    plan = {"gpus": 1, "profile": "cpu", "num_machines": 1, "world_size": 1, "hash": "hash-a"}
    rec = {"time": now - 100, "launch": 1, "plan": plan, "environment": {"host": "host0"}, LAUNCH_ID: A}
    manifest_path(run).write_text(json.dumps(rec) + "\n")
    prog = {"step": 20, "total": 20, "samples_per_s": 2.0, "time": now - 20, "started": now - 90, LAUNCH_ID: A}
    (run / PROGRESS_FILE).write_text(json.dumps(prog))
    (run / "exit_status.json").write_text(json.dumps({"code": 0, "message": "finished", LAUNCH_ID: A}))
    return run


def test_a_launch_that_ended_before_its_manifest_record_leaves_the_one_before_it_shown(tmp_path):
    """The old reading took node 0's .lock for the current launch whatever it left: every record of the run
    was an earlier launch's, status showed no state, step or exit (and said nothing of why)."""
    now = time.time()
    run = ended_launch(tmp_path, now)
    lock = {"host": socket.gethostname(), "pid": dead_pid(), "since": "2026-11-27 11:00:00", LAUNCH_ID: B}
    launcher_lock_path(run, 0).write_text(json.dumps(lock))  # launch B took the lock, then failed (on this host)
    f = collect(run, now)
    assert f["unstarted"] == {LAUNCH_ID: B, "host": socket.gethostname(), "since": "2026-11-27 11:00:00", "ended": True}
    assert f["state"] == "ended" and f["exit_code"] == 0 and f["step"] == 20, f
    assert f["progress_of"] == "this launch" and f["plan_hash"] == "hash-a" and f["launches"] == 1, f
    text = run_cli_here("status", str(run)).stdout
    assert (
        f"newest     launch {B} (since 2026-11-27 11:00:00) wrote no manifest record: it ended before it started "
        "(launch.log says why); shown: the launch before it" in text
    ), text
    assert "state      ended" in text, text
    assert run_side("r", run).rows["environment"]["hosts"] == "host0"

    lock["host"] = "elsewhere"  # its launcher ran on another machine: status cannot tell whether it still starts
    launcher_lock_path(run, 0).write_text(json.dumps(lock))
    f = collect(run, now)
    assert f["unstarted"]["ended"] is None and f["state"] == "ended", f
    text = run_cli_here("status", str(run)).stdout
    assert "it ended before it started, or is starting on elsewhere (launch.log says why)" in text, text

    with open(manifest_path(run), "a") as out:  # B got going: its record; A's records are no longer this launch's
        out.write(json.dumps({"time": now - 5, "launch": 2, "plan": {"hash": "hash-b"}, LAUNCH_ID: B}) + "\n")
    f = collect(run, now)
    assert f["unstarted"] is None and f["exit"] == [] and f["progress_of"] == "previous launch", f
    assert "newest " not in run_cli_here("status", str(run)).stdout


def test_the_first_launch_of_a_run_that_never_started_is_said(tmp_path):
    now = time.time()
    run = tmp_path / "output" / "r"
    run.mkdir(parents=True)
    (run / "config.py").write_text("args.max_train_steps = 20\n")
    lock = {"host": socket.gethostname(), "pid": dead_pid(), "since": "2026-11-27 11:00:00", LAUNCH_ID: B}
    launcher_lock_path(run, 0).write_text(json.dumps(lock))
    f = collect(run, now)
    assert f["unstarted"][LAUNCH_ID] == B and f["launches"] is None, f
    text = run_cli_here("status", str(run)).stdout
    assert "it ended before it started (launch.log says why); no launch before it" in text, text


def two_node_launch(root: Path, now: float) -> Path:
    """Launch B on two nodes, node 0 started; node 1's .lock.node1, manifest record, heartbeat and exit status
    are an earlier launch's (OLD1): node 1 of launch B has not started yet."""
    run = ended_launch(root, now)
    plan = {"gpus": 2, "profile": "cpu", "num_machines": 2, "world_size": 2, "hash": "h2"}
    rec = {"time": now - 10, "launch": 2, "plan": plan, "environment": {"host": "host0"}, LAUNCH_ID: B}
    with open(manifest_path(run), "a") as out:
        out.write(json.dumps(rec) + "\n")
    launcher_lock_path(run, 0).write_text(json.dumps({"host": "host0", "pid": 1, "since": "now", LAUNCH_ID: B}))
    launcher_lock_path(run, 1).write_text(json.dumps({"host": "host1", "pid": 1, "since": "then", LAUNCH_ID: OLD1}))
    old = {"time": now - 100, "environment": {"host": "oldhost1"}, LAUNCH_ID: OLD1}
    manifest_path(run, 1).write_text(json.dumps(old) + "\n")
    for rank, (node, lid) in enumerate(((0, B), (1, OLD1))):
        hb = {"rank": rank, "node": node, "host": f"host{node}", "step": 3, "phase": "forward", LAUNCH_ID: lid}
        (run / "heartbeat" / f"rank{rank}").write_text(json.dumps(hb))
    (run / "exit_status.json").unlink()
    (run / "exit_status.node1.json").write_text(json.dumps({"code": 1, "message": "old", LAUNCH_ID: OLD1}))
    return run


def test_node_ks_lock_of_an_earlier_launch_is_not_this_launchs(tmp_path):
    """The old reading trusted .lock.node1 whatever launch wrote it: status showed the earlier launch's rank
    1 and node 1's exit as this launch's, diff its host."""
    now = time.time()
    run = two_node_launch(tmp_path, now)
    launch = current_launch(run, [json.loads(x) for x in manifest_path(run).read_text().splitlines()], False)
    assert launch.ids == {0: B} and launch.nodes == (0, 1), launch
    f = collect(run, now)
    assert [r["rank"] for r in f["heartbeat_ranks"]] == [0] and f["exit"] == [], f
    assert run_side("r", run).rows["environment"]["hosts"] == "host0"

    # an earlier launch's progress.json naming OLD1 does not link it either: only launch B's own
    (run / PROGRESS_FILE).write_text(json.dumps({"step": 3, LAUNCH_ID: A, "launch_ids": [A, OLD1]}))
    assert [r["rank"] for r in collect(run, now)["heartbeat_ranks"]] == [0]

    # node 1 of launch B starts (its own id), and the trainer's ranks meet: rank 0 names both nodes' ids
    launcher_lock_path(run, 1).write_text(json.dumps({"host": "host1", "pid": 1, "since": "now", LAUNCH_ID: B1}))
    with open(manifest_path(run, 1), "a") as out:
        out.write(json.dumps({"time": now - 9, "environment": {"host": "host1"}, LAUNCH_ID: B1}) + "\n")
    hb = {"rank": 1, "node": 1, "host": "host1", "step": 4, "phase": "forward", LAUNCH_ID: B1}
    (run / "heartbeat" / "rank1").write_text(json.dumps(hb))
    assert [r["rank"] for r in collect(run, now)["heartbeat_ranks"]] == [0]  # not named yet: its first log line
    (run / PROGRESS_FILE).write_text(json.dumps({"step": 4, "total": 20, LAUNCH_ID: B, "launch_ids": [B, B1]}))
    launch = current_launch(run, [json.loads(x) for x in manifest_path(run).read_text().splitlines()], False)
    assert launch.ids == {0: B, 1: B1}
    f = collect(run, now)
    assert [r["rank"] for r in f["heartbeat_ranks"]] == [0, 1] and f["exit"] == [], f
    assert run_side("r", run).rows["environment"]["hosts"] == "host0, host1"
