"""rundir/records.py (#40 step 6): one declarative reader for the run directory's records. A record type
declares its fields; reading gives the checked record or one line saying why not; the readers built on
it (progress.json, validation.json, the exit status, requeue.json, a rollback record, a COMPLETE marker,
hang_limits.json's times, a heartbeat as status shows it) read valid and damaged files as before."""

from __future__ import annotations

import json
import math
import os
import time

import pytest

from taehv_launch.rundir.checkpoint import COMPLETE, checkpoint_dir, incomplete_reason, write_complete
from taehv_launch.rundir.events import rollback_problem, restarts_summary
from taehv_launch.rundir.exitstatus import exit_status_path, read_exit_status
from taehv_launch.rundir.hanglimits import clean_measured
from taehv_launch.rundir.progress import read_progress, validation_of
from taehv_launch.rundir.records import TIME, Field, ListOf, Number, OrNull, Record, Text, Whole
from taehv_launch.rundir.requeue import REQUEUE_FILE, load_requeues, read_requeues

KIND = Record(
    "kind.json",
    (
        Field("step", Whole(), required=True),
        Field("rate", Number(high=10.0)),
        Field("name", Text(3), default="?"),
        Field("tags", ListOf(Text()), default=[]),
        Field("time", TIME),
    ),
)


def test_a_declared_record_reads_checked_or_says_why_in_one_line(tmp_path):
    assert KIND.parse({"step": 3, "rate": 2, "name": "abcdef", "extra": 1}) == (
        {"step": 3, "rate": 2.0, "name": "abc", "tags": [], "time": None},
        "",
    )
    # an optional field of another kind reads as its default; a required one makes the record unusable
    assert KIND.parse({"step": 0, "rate": math.nan, "name": 5, "time": 1e20}).record == {
        "step": 0,
        "rate": None,
        "name": "?",
        "tags": [],
        "time": None,
    }
    assert KIND.parse({"step": True}) == (None, "step is true, not a whole number >= 0")
    assert KIND.parse({"step": -1}).why == "step is -1, not a whole number >= 0"
    assert KIND.parse({}).why == "step is missing, not a whole number >= 0"
    assert KIND.parse([1]).why == "kind.json is not a JSON object"
    a, b = KIND.parse({"step": 1}).record, KIND.parse({"step": 2}).record
    a["tags"].append("x")
    assert b["tags"] == []  # a default list is each record's own
    # strict: a value of another kind (null included, unless OrNull) makes the record unusable
    strict = Record("s", (Field("n", Whole()), Field("note", OrNull(Text()))), strict=True)
    assert strict.parse({"note": None}).record == {"n": None, "note": None}
    assert strict.parse({"n": None}).why == "n is null, not a whole number >= 0"
    assert strict.parse({"note": ["x"]}).why == "note is a JSON list, not text"
    assert strict.loose().parse({"n": "x", "note": 5}).record == {"n": None, "note": None}
    # from a file: missing is (None, ""); anything else unusable names the file
    path = tmp_path / "kind.json"
    assert KIND.read(path) == (None, "")
    path.write_text('{"step": "3"}')
    assert KIND.read(path) == (None, f'{path}: its step is "3", not a whole number >= 0')
    path.write_text("{torn")
    assert KIND.read(path).why.startswith(f"{path} is not JSON")
    os.unlink(path)
    os.mkfifo(path)  # nobody writes it: read as no record, never blocking
    assert KIND.read(path) == (None, f"{path} is not a regular file")


def test_progress_and_validation_read_as_before(tmp_path):
    raw = {"step": 7, "total": 0, "samples_per_s": "fast", "samples_per_s_avg": 1, "global_batch": True}
    raw |= {"eta_s": 2e9, "time": 1.7e9, "started": math.inf, "tflops_per_gpu": 3, "mfu": 11, "mfu_note": "n" * 300}
    (tmp_path / "progress.json").write_text(json.dumps(raw))
    assert read_progress(tmp_path) == {
        "step": 7,
        "total": None,  # 0: unknown
        "samples_per_s": None,
        "samples_per_s_avg": 1.0,
        "global_batch": None,
        "eta_s": None,  # over LONGEST_S
        "time": 1.7e9,
        "started": None,
        "launch_id": None,  # none written: a record of a trainer started without a launcher (rundir/launchid.py)
        "attempt": None,  # the same: no launcher, no restart attempt
        "flops": {"tflops_per_gpu": 3.0, "mfu": None, "peak_tflops_per_gpu": None, "mfu_note": "n" * 200},
    }
    (tmp_path / "progress.json").write_text('{"step": 3.0}')
    assert read_progress(tmp_path) is None
    (tmp_path / "validation.json").write_text(json.dumps({"step": 4, "psnr": 1e4, "ssim": -0.5, "model": "m" * 50}))
    v = validation_of(tmp_path, "", "launch.log")
    assert v["step"] == 4 and v["psnr"] is None and v["ssim"] == -0.5 and v["model"] == "m" * 40
    assert v["from"] == "validation.json" and v["best_step"] is None
    (tmp_path / "validation.json").unlink()
    line = "validation at step 9: psnr 12.5 dB, ssim 0.31, flicker n/a, lpips 0.2\n"
    v = validation_of(tmp_path, line, "launch.log")
    assert (v["step"], v["psnr"], v["ssim"], v["flicker"], v["lpips"], v["from"]) == (
        9,
        12.5,
        0.31,
        None,
        0.2,
        "launch.log",
    )


def test_the_exit_status_requeue_count_and_rollbacks_read_as_before(tmp_path):
    path = exit_status_path(tmp_path, 0)
    for text, want in (
        ('{"code": 75, "message": "saved"}', {"code": 75, "message": "saved"}),
        ('{"code": -9, "message": 3, "repeats": 1}', {"code": -9, "message": None}),
        ('{"code": 1, "repeats": true, "launch_id": "L-1"}', {"code": 1, "message": None, "repeats": True}),
        ('{"code": true}', None),
        ('{"code": "1"}', None),
        ("[1]", None),
    ):
        path.write_text(text)
        assert read_exit_status(path) == want, text
    assert read_exit_status(path := exit_status_path(tmp_path, 1), launch=True) is None
    path.write_text('{"code": 0, "launch_id": "L-1"}')
    assert read_exit_status(path, launch=True) == {"code": 0, "message": None, "launch_id": "L-1"}
    req = tmp_path / REQUEUE_FILE
    req.write_text('{"count": "3", "without_progress": 0}')
    rec, note = load_requeues(tmp_path)
    assert rec is None and f'({req}: its count is "3", not a whole number >= 0)' in note  # docs quote it
    assert (tmp_path / f"{REQUEUE_FILE}.corrupt-1").exists()
    req.write_text('{"count": 2, "without_progress": 1, "stopped": 5}')
    assert load_requeues(tmp_path)[0] is None  # strict: a field not null and not text
    req.write_text('{"count": 2, "without_progress": [1], "stopped": "why"}')
    assert read_requeues(tmp_path) == {  # what status shows of it
        "count": 2,
        "without_progress": 0,
        "last_checkpoint": None,
        "stopped": "why",
        "job": None,
    }
    ok = {"to_step": 10, "lr_until": 20, "data_seed": 7, "lr_factor": 0.5, "checkpoint": "checkpoint-10"}
    assert rollback_problem(ok) is None and rollback_problem({**ok, "lr_factor": 1}) is None
    assert rollback_problem({**ok, "lr_factor": math.nan}) == "lr_factor is NaN, not a number in (0, 1]"
    assert rollback_problem({**ok, "lr_factor": 0}) == "lr_factor is 0, not a number in (0, 1]"
    assert rollback_problem({**ok, "data_seed": 2**40}) == (
        "data_seed is 1099511627776, not a whole number of magnitude below 2**40"
    )
    assert rollback_problem({**ok, "to_step": -1}) == "to_step is -1, not a step number (a whole number >= 0)"
    assert rollback_problem({k: v for k, v in ok.items() if k != "checkpoint"}) == (
        "checkpoint is missing, not a checkpoint name"
    )


def test_a_restart_record_whose_time_is_not_a_clock_reading_no_longer_crashes_status():
    """The one behaviour change of the restart summary, a bug: a time of NaN (or a time lost of
    Infinity) in events.jsonl made `taehv-launch status` end in a traceback (int(round(nan)))."""
    events = [{"event": "restart", "time": math.nan, "reason": "x"}, {"event": "restarted", "recovery_s": math.inf}]
    got = restarts_summary(events)
    assert got["last_time"] is None and got["lost_s"] is None and got["last_reason"] == "x"
    now = time.time()
    got = restarts_summary([{"event": "restart", "time": now, "reason": 5}, {"event": "restarted", "recovery_s": 3}])
    assert got["last_time"] == now and got["last_reason"] == "?" and got["lost_s"] == 3.0


def test_measured_times_and_a_complete_marker(tmp_path):
    assert clean_measured({"step_s": 1, "steps": 20, "checkpoint_s": -1, "validation_s": "x"}) == {
        "step_s": 1.0,
        "checkpoint_s": None,
        "validation_s": None,
        "steps": 20,
    }
    assert clean_measured(None) == {"step_s": None, "checkpoint_s": None, "validation_s": None, "steps": None}
    ckpt = checkpoint_dir(tmp_path, 10)
    ckpt.mkdir()
    (ckpt / "a.bin").write_bytes(b"abc")
    meta = write_complete(ckpt, 10)
    assert incomplete_reason(ckpt) is None
    for sizes in (None, {}):  # no sizes to check: complete (a marker of an earlier version)
        (ckpt / COMPLETE).write_text(json.dumps({**meta, "sizes": sizes}))
        assert incomplete_reason(ckpt) is None
    # not a marker we wrote: unreadable (before, [] and 0 read as "no sizes": the checkpoint was taken for complete)
    for sizes in ([], 0, {"a.bin": True}):
        (ckpt / COMPLETE).write_text(json.dumps({**meta, "sizes": sizes}))
        assert incomplete_reason(ckpt) == "unreadable COMPLETE marker", sizes


@pytest.mark.parametrize("files", [None, "a.bin", [1]])
def test_a_marker_whose_files_are_not_a_list_of_names_is_unreadable(tmp_path, files):
    ckpt = checkpoint_dir(tmp_path, 10)
    ckpt.mkdir()
    (ckpt / COMPLETE).write_text(json.dumps({"files": files}))
    assert incomplete_reason(ckpt) == "unreadable COMPLETE marker"
