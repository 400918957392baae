"""The launcher's freeze watch (run/freeze.py NodeWatch) tells this attempt's heartbeats, hang limits and
hang reports by the launch id and attempt number its trainer stamps (rundir/launchid.py), never by a file's
time: a stale record with a newer mtime does not count, this attempt's with an older one does. Another
node's ranks count once progress.json of this attempt names their launcher's id ("launch_ids").

Fast: real files written by the run directory's own writers under the trainer's environment, a real
SIGSTOPped process as the frozen rank.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from taehv_launch.run.freeze import NodeWatch
from taehv_launch.rundir.exitstatus import exit_status_path
from taehv_launch.rundir.hanglimits import HangLimits, hang_limits_path, write_hang_limits
from taehv_launch.rundir.heartbeat import HANG_SUFFIX, heartbeat_path, process_state, write_heartbeat
from taehv_launch.rundir.launchid import ATTEMPT_ENV, LAUNCH_ID_ENV
from taehv_launch.rundir.progress import PROGRESS_FILE, write_progress
from conftest import start

HOST = socket.gethostname()
THIS = "20261127T063000Z-0000aaaa"  # this launcher's launch id (node 0)
OTHER_NODE = "20261127T063001Z-0000bbbb"  # node 1's launcher's, of the same launch
EARLIER = "20261126T101502Z-3f9a2c1b"  # an earlier launch's


@pytest.fixture
def frozen_pid():
    child = start([sys.executable, "-c", "import time; time.sleep(120)"], capture=False)
    os.kill(child.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while process_state(HOST, child.pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.05)
    yield child.pid
    child.kill()
    child.wait()


def as_trainer(monkeypatch, lid: str, attempt: int) -> None:
    """This test process writes records as the trainer of attempt `attempt` of launch `lid` does."""
    monkeypatch.setenv(LAUNCH_ID_ENV, lid)
    monkeypatch.setenv(ATTEMPT_ENV, str(attempt))


def age(path: Path, seconds: float) -> None:
    """Set the file's time `seconds` ago (negative: ahead)."""
    os.utime(path, (time.time() - seconds, time.time() - seconds))


def beat(run: Path, rank: int, pid: int, seconds_ago: float, *, node: int = 0, host: str = HOST, progress: float = 1.0):
    path = heartbeat_path(run, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    info = {"rank": rank, "node": node, "host": host, "pid": pid, "step": 5, "phase": "forward"}
    write_heartbeat(path, info | {"progress_age_s": progress, "collectives": 0, "warmup": False, "time": time.time()})
    age(path, seconds_ago)


def watch(monkeypatch, run: Path, attempt: int = 1, world: int = 1, hang_timeout: float = 10) -> NodeWatch:
    """The launcher's watch of attempt `attempt` of launch THIS, as run/launch.py builds it (the launcher's
    environment: its launch id, no attempt)."""
    monkeypatch.setenv(LAUNCH_ID_ENV, THIS)
    monkeypatch.delenv(ATTEMPT_ENV, raising=False)
    return NodeWatch(
        run,
        0,
        world,
        exit_status_path(run, 0),
        kill=lambda: None,
        note=lambda text: None,
        hang_timeout=hang_timeout,
        hang_timeout_slow=1800,
        attempt=attempt,
    )


def test_a_stale_heartbeat_with_a_newer_mtime_does_not_count_and_this_attempts_older_one_does(
    tmp_path, monkeypatch, frozen_pid
):
    w = watch(monkeypatch, tmp_path)
    for lid, attempt in ((THIS, 0), (EARLIER, 1)):  # the failed attempt's, an earlier launch's: written after the start
        as_trainer(monkeypatch, lid, attempt)
        beat(tmp_path, 0, frozen_pid, -5.0, progress=100.0)
        assert heartbeat_path(tmp_path, 0).stat().st_mtime > w.started
        monkeypatch.setenv(LAUNCH_ID_ENV, THIS)
        assert w.find_frozen() is None, (lid, attempt)
    as_trainer(monkeypatch, THIS, 1)
    beat(tmp_path, 0, frozen_pid, 20.0)  # this attempt's, its file's time long before the watch started
    assert heartbeat_path(tmp_path, 0).stat().st_mtime < w.started - 1
    frozen, limit = w.find_frozen()
    assert sorted(frozen) == [0] and frozen[0]["state"] == "T" and limit == (10, "hang_timeout")
    assert 20 <= frozen[0]["beat_age_s"] < 40  # the age still measured by the file's time


def test_another_nodes_rank_counts_once_progress_json_of_this_attempt_names_its_launcher(
    tmp_path, monkeypatch, frozen_pid
):
    w = watch(monkeypatch, tmp_path, world=2)
    as_trainer(monkeypatch, THIS, 1)
    beat(tmp_path, 0, frozen_pid, 20.0)  # progress 1 + 20 s: past hang_timeout 10 s, under hang_timeout_slow
    as_trainer(monkeypatch, OTHER_NODE, 1)
    beat(tmp_path, 1, 4242, 0.0, node=1, host="node1-host")  # a running rank of node 1
    assert w.find_frozen() is None  # no progress.json: node 1's rank does not count, 1 of 2 ranks: slow limit
    for lid, attempt, ids in (
        (THIS, 0, [THIS, OTHER_NODE]),  # the failed attempt's progress.json
        (EARLIER, 1, [EARLIER, OTHER_NODE]),  # an earlier launch's (this launcher's id not among them)
    ):
        as_trainer(monkeypatch, lid, attempt)
        write_progress(tmp_path, {"step": 5, "launch_ids": ids})
        age(tmp_path / PROGRESS_FILE, -5.0)
        assert w.find_frozen() is None, (lid, attempt)
    as_trainer(monkeypatch, THIS, 1)
    write_progress(tmp_path, {"step": 5, "launch_ids": [THIS, OTHER_NODE]})
    age(tmp_path / PROGRESS_FILE, 30.0)
    frozen, limit = w.find_frozen()
    assert sorted(frozen) == [0] and limit == (10, "hang_timeout")


def test_hang_limits_and_hang_reports_are_told_by_their_ids(tmp_path, monkeypatch, frozen_pid):
    w = watch(monkeypatch, tmp_path, hang_timeout=100)
    as_trainer(monkeypatch, THIS, 1)
    beat(tmp_path, 0, frozen_pid, 40.0)  # 41 s: under hang_timeout 100 s, past a step limit of 30 s
    measured = HangLimits(100, 1800, {"step_s": 1.0, "steps": 20})  # step limit: 30 s (FLOOR_S)
    as_trainer(monkeypatch, THIS, 0)
    write_hang_limits(tmp_path, measured)  # the failed attempt's, newer than the watch's start
    age(hang_limits_path(tmp_path), -5.0)
    assert w.find_frozen() is None
    as_trainer(monkeypatch, THIS, 1)
    write_hang_limits(tmp_path, measured)  # this attempt's, older than the watch's start
    age(hang_limits_path(tmp_path), 30.0)
    frozen, limit = w.find_frozen()
    assert sorted(frozen) == [0] and limit == (30, "step")

    report = heartbeat_path(tmp_path, 1, HANG_SUFFIX)
    as_trainer(monkeypatch, EARLIER, 1)
    write_heartbeat(report, {"line": "job hung: an earlier launch's", "by": 1})
    age(report, -5.0)
    assert w.find_frozen() is not None  # an earlier launch's report: the watch still reports
    as_trainer(monkeypatch, THIS, 1)
    write_heartbeat(report, {"line": "job hung: rank 0 ...", "by": 1})
    age(report, 30.0)
    assert w.find_frozen() is None  # this attempt's trainer reported: no second report


def test_the_launchers_own_report_carries_its_attempt(tmp_path, monkeypatch, frozen_pid):
    w = watch(monkeypatch, tmp_path, attempt=2)
    as_trainer(monkeypatch, THIS, 2)
    beat(tmp_path, 0, frozen_pid, 20.0)
    monkeypatch.setenv(LAUNCH_ID_ENV, THIS)
    monkeypatch.delenv(ATTEMPT_ENV)
    w._report(*w.find_frozen())
    report = json.loads(heartbeat_path(tmp_path, 0, HANG_SUFFIX).read_text())
    assert report["launch_id"] == THIS and report["attempt"] == 2
    exit_status_path(tmp_path, 0).unlink()
    assert w.find_frozen() is None  # its own report is this attempt's: no second one
