"""Restart attempts told apart by their number, not by time (#40 step 6): the launcher puts each attempt's
number in its trainer's environment (TAEHV_LAUNCH_ATTEMPT, run/launch.py), the trainer's writers stamp it
as "attempt" beside "launch_id" (rundir/launchid.py), and the launcher's restart bookkeeping (run/restart.py:
the first new step, whether the attempt stepped) reads only the records of the attempt and the launch it
asks about. Times (the files' mtimes) only measure the recovery. Fast: the records are written here."""

from __future__ import annotations

import json
import os

from taehv_launch.rundir.heartbeat import heartbeat_path, write_heartbeat
from taehv_launch.rundir.launchid import ATTEMPT, ATTEMPT_ENV, LAUNCH_ID, LAUNCH_ID_ENV, begin_launch, stamped
from taehv_launch.rundir.progress import PROGRESS_FILE, read_progress, write_progress
from taehv_launch.run.restart import first_new_step, fs_now, progress_at

L, OTHER = "20261127T060000Z-aaaaaaaa", "20261126T060000Z-bbbbbbbb"


def test_the_trainers_records_carry_its_attempt_and_the_launchers_none(monkeypatch):
    monkeypatch.setenv(LAUNCH_ID_ENV, L)
    monkeypatch.setenv(ATTEMPT_ENV, "2")
    assert stamped({"a": 1}) == {"a": 1, LAUNCH_ID: L, ATTEMPT: 2}
    for bad in ("", "-1", "x", "99999999999"):
        monkeypatch.setenv(ATTEMPT_ENV, bad)
        assert stamped({"a": 1}) == {"a": 1, LAUNCH_ID: L}
    monkeypatch.setenv(ATTEMPT_ENV, "3")
    monkeypatch.delenv(LAUNCH_ID_ENV)
    assert stamped({"a": 1}) == {"a": 1}  # no launch (a trainer by hand): as before #40
    lid = begin_launch()  # a launcher started from a trainer's environment: its own records carry no attempt
    assert ATTEMPT_ENV not in os.environ and stamped({}) == {LAUNCH_ID: lid}


def test_the_new_attempts_first_step_is_told_by_its_number_not_by_its_time(tmp_path, monkeypatch):
    """The failed attempt's last heartbeat past the checkpoint, with a file time at or after the new
    attempt's start (its rank's writer thread outlived the kill; an NFS server's clock; a coarse mtime), and
    an earlier launch's leftover rank file of the same attempt number: neither is the new attempt's first
    step. The old code took any record with a new enough mtime (the third argument was `since`, a time)."""
    monkeypatch.setenv(LAUNCH_ID_ENV, L)
    monkeypatch.delenv(ATTEMPT_ENV, raising=False)
    now = fs_now(tmp_path, 0)
    (tmp_path / "heartbeat").mkdir()
    monkeypatch.setenv(ATTEMPT_ENV, "0")  # the failed attempt's rank 0 and its progress.json
    write_heartbeat(heartbeat_path(tmp_path, 0), {"rank": 0, "step": 7})
    write_progress(tmp_path, {"step": 7, "time": now})
    monkeypatch.setenv(LAUNCH_ID_ENV, OTHER)  # an earlier launch's rank 1, attempt 1 of that launch
    monkeypatch.setenv(ATTEMPT_ENV, "1")
    write_heartbeat(heartbeat_path(tmp_path, 1), {"rank": 1, "step": 9})
    monkeypatch.setenv(LAUNCH_ID_ENV, L)
    monkeypatch.delenv(ATTEMPT_ENV)  # back to the launcher's own environment
    for name in ("heartbeat/rank0", "heartbeat/rank1", PROGRESS_FILE):
        os.utime(tmp_path / name, (now + 5, now + 5))  # newer than anything: times would take them
    assert read_progress(tmp_path)[ATTEMPT] == 0
    assert first_new_step(tmp_path, 5, 1) is None
    assert progress_at(tmp_path, 1) is None and progress_at(tmp_path, 0) == (7, now + 5)

    monkeypatch.setenv(ATTEMPT_ENV, "1")  # the new attempt's rank 2 steps past the checkpoint
    write_heartbeat(heartbeat_path(tmp_path, 2), {"rank": 2, "step": 6})
    monkeypatch.delenv(ATTEMPT_ENV)
    os.utime(tmp_path / "heartbeat/rank2", (now + 9, now + 9))
    assert first_new_step(tmp_path, 5, 1) == now + 9  # its mtime: the filesystem's clock, as failed_at
    assert json.loads((tmp_path / "heartbeat/rank2").read_text())[ATTEMPT] == 1
