"""The launch id (#40 step 6): made once per `taehv-launch` invocation, inherited by the trainer, stamped
by every run-directory writer on its record (rundir/launchid.py); `status` and `diff` tell one launch
from another by it (rundir/launches.py), and by the times the records were written only in a run
directory from before it. Fast cases write run directories with the formats' own writers; one slow case
runs the real launcher twice on one run."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from conftest import run_cli, run_cli_here
from taehv_launch.rundir.events import EVENTS_FILE, append_event
from taehv_launch.rundir.exitstatus import exit_status_path, write_exit_status
from taehv_launch.rundir.hanglimits import HANG_LIMITS_FILE, HangLimits, write_hang_limits
from taehv_launch.rundir.heartbeat import HANG_SUFFIX, heartbeat_dir, heartbeat_path, write_heartbeat
from taehv_launch.rundir.launches import current_launch, read_lock
from taehv_launch.rundir.launchid import LAUNCH_ID, LAUNCH_ID_ENV, begin_launch, launch_id, stamped
from taehv_launch.rundir.layout import launcher_lock_path
from taehv_launch.rundir.manifest import append_manifest, manifest_path
from taehv_launch.rundir.progress import PROGRESS_FILE, VALIDATION_FILE, write_progress, write_validation
from taehv_launch.rundir.requeue import REQUEUE_FILE, write_requeues
from taehv_launch.watch.diff import run_side
from taehv_launch.watch.status import collect
from trainrun import launch, ok

A, B, B1 = "20261126T100000Z-aaaaaaaa", "20261126T110000Z-bbbbbbbb", "20261126T110001Z-b1b1b1b1"


def test_one_id_per_launch_read_in_one_place_and_stamped_by_every_writer(tmp_path, monkeypatch):
    monkeypatch.delenv(LAUNCH_ID_ENV, raising=False)
    assert launch_id() is None and stamped({"a": 1}) == {"a": 1}  # a trainer started by hand: no id
    monkeypatch.setenv(LAUNCH_ID_ENV, "inherited")
    made = begin_launch()  # the launcher replaces an id it inherited
    assert made != "inherited" and os.environ[LAUNCH_ID_ENV] == made == launch_id()
    assert begin_launch() != made  # each invocation its own
    for bad in ("", "a b", "x\n", "-lead", "y" * 81):
        monkeypatch.setenv(LAUNCH_ID_ENV, bad)
        assert launch_id() is None, bad
    monkeypatch.setenv(LAUNCH_ID_ENV, A)
    record = {"step": 1}
    assert stamped(record) == {"step": 1, LAUNCH_ID: A} and record == {"step": 1}
    run = tmp_path
    heartbeat_dir(run).mkdir()
    append_event(run, {"event": "rollback"})
    write_progress(run, {"step": 1})
    write_validation(run, {"step": 1})
    write_exit_status(exit_status_path(run, 1), 0, "ok")
    append_manifest(run, {"launch": 1}, node=1)
    write_hang_limits(run, HangLimits(300.0, 1800.0))
    write_heartbeat(heartbeat_path(run, 0), {"rank": 0})
    write_heartbeat(heartbeat_path(run, 0, HANG_SUFFIX), {"line": "hung"})
    write_requeues(run, {"count": 1, "without_progress": 0})
    from taehv_launch.run.lock import RunLock

    lock = RunLock(run, 2)
    lock.acquire()
    lock.release()
    files = [
        EVENTS_FILE,
        PROGRESS_FILE,
        VALIDATION_FILE,
        "exit_status.node1.json",
        "manifest.node1.jsonl",
        HANG_LIMITS_FILE,
        "heartbeat/rank0",
        "heartbeat/rank0.hang",
        REQUEUE_FILE,
        ".lock.node2",
    ]
    for name in files:
        text = (run / name).read_text()
        assert json.loads(text.splitlines()[0] if name.endswith(".jsonl") else text)[LAUNCH_ID] == A, name
    assert read_lock(run, 2)[LAUNCH_ID] == A


def earlier_and_current(root: Path, now: float) -> Path:
    """A run whose earlier launch (id A) left every record, its files written *after* the current
    launch (id B) took node 0's lock: clocks that disagree, a copied run directory. By their times these
    are this launch's; by their ids they are not."""
    run = root / "output" / "r"
    (run / "heartbeat").mkdir(parents=True)
    (run / "config.py").write_text(
        "args.max_train_steps = 20\nargs.hang_timeout = 300\nargs.hang_timeout_slow = 1800\n"
    )
    (run / "launch.log").write_text("\n=== taehv-launch 2026-01-01 00:00:00: accelerate launch\n")
    plan = {"gpus": 1, "profile": "cpu", "num_machines": 1, "world_size": 1, "hash": "hash-a"}
    old = {"time": now - 100, "launch": 1, "plan": plan, "resume": None, LAUNCH_ID: A}
    (run / "manifest.jsonl").write_text(json.dumps(old) + "\n")
    lock = launcher_lock_path(run, 0)
    lock.write_text(json.dumps({"host": "elsewhere", "pid": 1, "since": "now", LAUNCH_ID: B}))
    os.utime(lock, (now - 60, now - 60))
    rec = {"step": 20, "total": 20, "samples_per_s": 1.5, "eta_s": 0.0, "time": now - 5, "started": now - 50}
    (run / PROGRESS_FILE).write_text(json.dumps({**rec, LAUNCH_ID: A}))
    hb = {"rank": 0, "node": 0, "host": "h", "step": 20, "phase": "forward", "time": now, LAUNCH_ID: A}
    (run / "heartbeat" / "rank0").write_text(json.dumps(hb))
    (run / "heartbeat" / f"rank0{HANG_SUFFIX}").write_text(json.dumps({"line": "old hang", LAUNCH_ID: A}))
    (run / "exit_status.json").write_text(json.dumps({"code": 1, "message": "old failure", LAUNCH_ID: A}))
    measured = {"step_s": 0.1, "steps": 20, "checkpoint_s": None, "validation_s": None}
    (run / HANG_LIMITS_FILE).write_text(json.dumps({"measured": measured, LAUNCH_ID: A}))
    return run


def test_status_tells_an_earlier_launchs_records_by_their_id_not_their_times(tmp_path):
    now = time.time()
    run = earlier_and_current(tmp_path, now)
    # launch B holds the lock but wrote no manifest record (yet, on another host): launch A is shown, and B
    # named (tests/test_current_launch.py)
    assert collect(run, now)["unstarted"][LAUNCH_ID] == B
    new = {"time": now - 1000, "launch": 2, "plan": {"hash": "hash-b"}, "resume": "/x/checkpoint-20", LAUNCH_ID: B}
    with open(run / "manifest.jsonl", "a") as out:
        out.write(json.dumps(new) + "\n")
    f = collect(run, now)  # B got going: A's records are not B's, however new their times
    assert f["progress_of"] == "previous launch" and f["eta_s"] is None and f["clips_per_s"] is None, f
    assert f["heartbeat_ranks"] == [] and f["hang"] is None and f["exit"] == [] and f["exit_code"] is None
    assert f["unstarted"] is None
    # launch B's records count, however old their times look (another host's clock, behind)
    (run / PROGRESS_FILE).write_text(
        json.dumps({"step": 3, "total": 30, "eta_s": 9.0, "time": now - 500, "started": now - 900, LAUNCH_ID: B})
    )
    hb = {"rank": 0, "node": 0, "host": "h", "step": 3, "phase": "forward", LAUNCH_ID: B}
    (run / "heartbeat" / "rank0").write_text(json.dumps(hb))
    (run / "heartbeat" / f"rank0{HANG_SUFFIX}").write_text(json.dumps({"line": "this hang", LAUNCH_ID: B}))
    (run / "exit_status.json").write_text(json.dumps({"code": 76, "message": "hung", LAUNCH_ID: B}))
    for name in (PROGRESS_FILE, "heartbeat/rank0", "heartbeat/rank0.hang", "exit_status.json", HANG_LIMITS_FILE):
        os.utime(run / name, (now - 900, now - 900))  # written before the lock, by the filesystem's clock
    f = collect(run, now)
    assert f["progress_of"] == "this launch" and f["step"] == 3 and f["total"] == 30, f
    assert [r["rank"] for r in f["heartbeat_ranks"]] == [0] and f["hang"] == "this hang"
    assert f["exit"] == [{"node": 0, "code": 76, "message": "hung"}] and f["state"] == "failed"
    assert f["plan_hash"] == "hash-b" and f["resume_from"] == "checkpoint-20" and f["launches"] == 2
    assert f["heartbeat_ranks"][0]["hang_limits"] is None  # hang_limits.json is launch A's
    text = run_cli_here("status", str(run)).stdout
    assert "hang       this hang" in text and "exit 76 (hung)" in text, text


def test_status_counts_the_restarts_of_this_launch_only(tmp_path):
    """A job that restarted twice, stopped and was requeued: the new launch has not restarted yet (review of
    #40 step 6: status counted every launch's restart records in events.jsonl)."""
    now = time.time()
    run = earlier_and_current(tmp_path, now)
    with open(run / "manifest.jsonl", "a") as out:  # launch B got going
        out.write(json.dumps({"time": now - 60, "launch": 2, LAUNCH_ID: B}) + "\n")
    with open(run / EVENTS_FILE, "w") as out:
        for e in (
            {"event": "restart", "time": now - 90, "reason": "exit 1", "count": 1, LAUNCH_ID: A},
            {"event": "restart", "time": now - 80, "reason": "exit 1", "count": 2, LAUNCH_ID: A},
            {"event": "restart_stop", "time": now - 70, "reason": "stopped by SIGTERM", LAUNCH_ID: A},
        ):
            out.write(json.dumps(e) + "\n")
    assert collect(run, now)["restarts"] is None
    append_event(run, {"event": "restart", "time": now - 10, "reason": "exit 1", "count": 1, LAUNCH_ID: B})
    got = collect(run, now)["restarts"]
    assert got["count"] == 1 and got["ended"] is None, got


def test_a_run_directory_from_before_launch_ids_is_read_by_the_times_its_records_were_written(tmp_path):
    """The one fallback: no record carries an id (nor the lock): a record is this launch's when it was
    written at or after the launch began: progress.json by its own start time against the newest
    manifest record's time, the others by their files' mtimes against node 0's .lock mtime."""
    now = time.time()
    run = tmp_path / "output" / "old"
    (run / "heartbeat").mkdir(parents=True)
    (run / "config.py").write_text("args.max_train_steps = 20\nargs.hang_timeout = 300\n")
    (run / "launch.log").write_text("\n=== taehv-launch 2026-01-01 00:00:00: accelerate launch\n")
    first = {"time": now - 100, "launch": 1, "plan": {"hash": "hash-a"}}
    second = {"time": now - 60, "launch": 2, "plan": {"hash": "hash-b"}, "resume": "/x/checkpoint-20"}
    (run / "manifest.jsonl").write_text(json.dumps(first) + "\n" + json.dumps(second) + "\n")
    lock = launcher_lock_path(run, 0)
    lock.write_text(json.dumps({"host": "elsewhere", "pid": 1, "since": "now"}))
    os.utime(lock, (now - 60, now - 60))

    def earlier_launch_wrote(at: float, started: float) -> None:
        rec = {"step": 20, "total": 20, "samples_per_s": 1.5, "eta_s": 5.0, "time": at, "started": started}
        (run / PROGRESS_FILE).write_text(json.dumps(rec))
        hb = {"rank": 0, "node": 0, "host": "h", "step": 20, "phase": "forward"}
        (run / "heartbeat" / "rank0").write_text(json.dumps(hb))
        (run / "heartbeat" / f"rank0{HANG_SUFFIX}").write_text(json.dumps({"line": "a hang"}))
        (run / "exit_status.json").write_text(json.dumps({"code": 1, "message": "a failure"}))
        for name in ("heartbeat/rank0", "heartbeat/rank0.hang", "exit_status.json"):
            os.utime(run / name, (at, at))

    earlier_launch_wrote(now - 70, started=now - 95)  # before the lock and the second record
    f = collect(run, now)
    assert f["progress_of"] == "previous launch" and f["eta_s"] is None, f
    assert f["heartbeat_ranks"] == [] and f["hang"] is None and f["exit"] == [] and f["exit_code"] is None
    assert f["plan_hash"] == "hash-b" and f["resume_from"] == "checkpoint-20"  # the newest record
    earlier_launch_wrote(now - 10, started=now - 30)  # now this launch's, by the same times
    f = collect(run, now)
    assert f["progress_of"] == "this launch" and f["state"] == "failed", f
    assert [r["rank"] for r in f["heartbeat_ranks"]] == [0] and f["hang"] == "a hang"
    assert f["exit"] == [{"node": 0, "code": 1, "message": "a failure"}]


def test_each_node_has_its_own_id_and_a_node_outside_this_launch_is_left_out(tmp_path):
    now = time.time()
    run = earlier_and_current(tmp_path, now)
    plan = {"gpus": 2, "profile": "cpu", "num_machines": 2, "world_size": 2, "hash": "h2"}
    for node, lid, host in ((0, B, "host0"), (1, B1, "host1")):
        rec = {"time": now - 60, "launch": 2, "plan": plan, "environment": {"host": host}, LAUNCH_ID: lid}
        with open(manifest_path(run, node), "a") as out:
            out.write(json.dumps(rec) + "\n")
    launcher_lock_path(run, 1).write_text(json.dumps({"host": "host1", "pid": 1, LAUNCH_ID: B1}))
    # node 2 of an earlier launch on three nodes: its lock and a manifest record are still there
    launcher_lock_path(run, 2).write_text(json.dumps({"host": "host2", "pid": 1, LAUNCH_ID: "old-node-2"}))
    manifest_path(run, 2).write_text(json.dumps({"environment": {"host": "host2"}, LAUNCH_ID: "old-node-2"}) + "\n")
    for rank, (node, lid) in enumerate(((0, B), (1, B1), (2, "old-node-2"))):
        hb = {"rank": rank, "node": node, "host": f"host{node}", "step": 3, "phase": "forward", LAUNCH_ID: lid}
        (run / "heartbeat" / f"rank{rank}").write_text(json.dumps(hb))
    (run / "exit_status.node1.json").write_text(json.dumps({"code": 0, "message": "ok", LAUNCH_ID: B1}))
    (run / "exit_status.node2.json").write_text(json.dumps({"code": 1, "message": "old", LAUNCH_ID: "old-node-2"}))
    # the trainer's first collective gathered every rank's launch id; rank 0 names them (rundir/launches.py)
    (run / PROGRESS_FILE).write_text(json.dumps({"step": 3, "total": 20, LAUNCH_ID: B, "launch_ids": [B, B1]}))
    launch_ = current_launch(run, [json.loads(x) for x in (run / "manifest.jsonl").read_text().splitlines()], False)
    assert launch_.ids == {0: B, 1: B1} and launch_.nodes == (0, 1) and launch_.id == B
    f = collect(run, now)
    assert [r["rank"] for r in f["heartbeat_ranks"]] == [0, 1]
    assert [e["node"] for e in f["exit"]] == [1]
    side = run_side("r", run)  # diff: the hosts of this launch's nodes, not node 2's of an earlier one
    assert side.rows["environment"]["hosts"] == "host0, host1"
    assert "launch 2 of 2" in side.title, side.title


@pytest.mark.slow
def test_two_launches_of_one_run_each_stamp_their_own_id_and_status_reads_the_newest(tmp_path):
    proc, run = launch(tmp_path, 1, "--set", "max_train_steps=2", run_name="ids")
    ok(proc)
    first = read_lock(run)[LAUNCH_ID]
    assert first is not None
    records = {
        "manifest.jsonl": json.loads((run / "manifest.jsonl").read_text().splitlines()[-1]),
        PROGRESS_FILE: json.loads((run / PROGRESS_FILE).read_text()),
        VALIDATION_FILE: json.loads((run / VALIDATION_FILE).read_text()),
        "exit_status.json": json.loads((run / "exit_status.json").read_text()),
        **{str(p.relative_to(run)): json.loads(p.read_text()) for p in (run / "heartbeat").glob("rank[0-9]*")},
    }
    assert {name: r.get(LAUNCH_ID) for name, r in records.items()} == dict.fromkeys(records, first)
    proc, run = launch(tmp_path, 1, "--set", "max_train_steps=4", "--resume", "auto", run_name="ids")
    ok(proc)
    second = read_lock(run)[LAUNCH_ID]
    assert second not in (None, first)
    lines = [json.loads(x) for x in (run / "manifest.jsonl").read_text().splitlines()]
    assert [r[LAUNCH_ID] for r in lines] == [first, second]
    assert json.loads((run / PROGRESS_FILE).read_text())[LAUNCH_ID] == second
    doc = json.loads(run_cli("status", "--json", str(run), cwd=tmp_path).stdout)["runs"][0]
    assert doc["state"] == "ended" and doc["progress_of"] == "this launch" and doc["step"] == 4, doc
    assert doc["launches"] == 2 and doc["resume_from"] == "checkpoint-2", doc
