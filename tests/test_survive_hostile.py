"""Hostile run directories for the survive features (#25): hand-edited events.jsonl rollback records,
corrupt requeue.json, heartbeat paths of the wrong kind. Each is a note (the run goes on) or one
error line (exit 2), never a traceback, and nothing already written is lost.

Real files and processes: the guard reads a real events.jsonl, the watchdog makes its real folders,
`taehv-launch requeue-check` runs as the CLI (in-process, and once as a process under a file size
limit); the slow test resumes a real 1-rank CPU run whose events.jsonl holds bad records."""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import assert_one_line_error, clean_env, overrides, run_cli_here
from taehv_launch.errors import LaunchError
from taehv_launch.rundir.checkpoint import COMPLETE
from taehv_launch.rundir.events import EVENTS_FILE, append_event, rollback_problem, rollbacks
from taehv_launch.rundir.requeue import REQUEUE_FILE, after_stop, at_start, read_requeues
from taehv_launch.run.inputs import check_inputs, check_run_dir
from taehv_launch.train.durability.watchdog import Watchdog
from taehv_launch.train.loop.guard import Guard


def good(to_step=10, **over):
    rec = {
        "event": "rollback",
        "time": 1.0,
        "step": to_step + 5,
        "to_step": to_step,
        "checkpoint": f"checkpoint-{to_step}",
        "reason": "x",
        "rollback": 1,
        "data_seed": 7961,
        "lr_factor": 0.5,
        "lr_until": to_step + 100,
    }
    return {**rec, **over}


def guard(run: Path, step: int, lines: list[str]) -> Guard:
    from test_divergence import make_guard  # the divergence tests' config: window 4, tolerance 3, seed 42

    return make_guard(run, step=step, lines=lines)


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under root with its bytes (None for folders and others): 'nothing written' checks."""
    out = {}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root))] = p.read_bytes() if p.is_file() and not p.is_symlink() else None
    return out


# ------------------------------------------------------------------------------ events.jsonl
BAD_RECORDS = [
    ('"to_step": "abc"', 'to_step is "abc"'),
    ('"to_step": null', "to_step is null"),
    ('"to_step": [10]', "to_step is a JSON list"),
    ('"to_step": Infinity', "to_step is Infinity"),
    ('"to_step": -1', "to_step is -1"),
    ('"to_step": true', "to_step is true"),
    ('"lr_until": 1.5', "lr_until is 1.5"),
    ('"data_seed": "7"', 'data_seed is "7"'),
    ('"data_seed": 1e300', "data_seed is 1e+300"),
    ('"data_seed": 99999999999999999999999', "data_seed is 99999999999999999999999"),
    ('"lr_factor": NaN', "lr_factor is NaN"),
    ('"lr_factor": "0.5"', 'lr_factor is "0.5"'),
    ('"lr_factor": 0', "lr_factor is 0"),
    ('"lr_factor": 1.5', "lr_factor is 1.5"),
    ('"lr_factor": -Infinity', "lr_factor is -Infinity"),
    ('"checkpoint": 10', "checkpoint is 10"),
]


@pytest.mark.parametrize("field,why", BAD_RECORDS)
def test_a_rollback_record_with_a_bad_field_is_left_out_with_a_note_naming_its_line(tmp_path, field, why):
    key = field.split(":")[0].strip('"')
    rec = {k: v for k, v in good().items() if k != key}
    line = json.dumps(rec)[:-1] + ", " + field + "}"
    (tmp_path / EVENTS_FILE).write_text(json.dumps(good(4, data_seed=1)) + "\n\nnot json\n" + line + "\n")
    lines: list[str] = []
    g = guard(tmp_path, 20, lines)  # resumed after both rollbacks: only the good one applies
    assert g.active is not None and g.active["data_seed"] == 1 and g.left_out == 1
    assert g.lr_scale(20) == 0.5 and g.data_seed(42) == 1 and math.isfinite(g.lr_scale(20))
    assert len(lines) == 1 and lines[0].startswith("note: 1 rollback record in "), lines
    assert f"{tmp_path / EVENTS_FILE}" in lines[0] and f"line 4: {why}" in lines[0], lines[0]


@pytest.mark.parametrize("missing", ["to_step", "lr_until", "data_seed", "lr_factor", "checkpoint"])
def test_a_rollback_record_without_a_field_is_left_out(tmp_path, missing):
    rec = {k: v for k, v in good().items() if k != missing}
    assert rollback_problem(rec).startswith(f"{missing} is missing, not ") and rollback_problem(good()) is None
    append_event(tmp_path, rec)
    lines: list[str] = []
    g = guard(tmp_path, 20, lines)
    assert g.active is None and g.data_seed(42) == 42 and g.lr_scale(20) == 1.0  # was KeyError 'data_seed'
    assert len(lines) == 1 and f"line 1: {missing} is missing" in lines[0]


def test_the_audits_minimal_record_and_several_bad_ones_make_one_note(tmp_path):
    for rec in (
        {"event": "rollback", "to_step": 10},
        good(lr_factor=float("nan")),
        {**good(), "to_step": "abc"},
        good(),
        good(),
    ):
        append_event(tmp_path, rec)
    lines: list[str] = []
    g = guard(tmp_path, 20, lines)
    assert len(g.history) == 2 and g.left_out == 3 and g.lr_scale(20) == 0.5
    assert len(lines) == 1 and "3 rollback records in" in lines[0] and "line 1:" in lines[0] and "line 3:" in lines[0]
    good_records, left_out, note = rollbacks(tmp_path)
    assert (len(good_records), left_out) == (2, 3) and note and note in lines[0]


def test_valid_records_give_no_note_and_an_unusable_file_reads_as_none(tmp_path):
    append_event(tmp_path, good(lr_factor=1))  # an int factor of 1 is fine
    assert rollbacks(tmp_path)[1:] == (0, "")
    (tmp_path / EVENTS_FILE).unlink()
    (tmp_path / EVENTS_FILE).mkdir()
    lines: list[str] = []
    g = guard(tmp_path, 20, lines)  # the launcher refuses this before a launch (below); the trainer goes on
    assert g.active is None and len(lines) == 1 and "cannot be read" in lines[0]


# ------------------------------------------------------------------------------ the launcher's check
def run_dir_like_a_finished_run(tmp_path) -> Path:
    run = tmp_path / "out" / "r"
    (run / "heartbeat" / "stacks").mkdir(parents=True)
    (run / "heartbeat" / "rank0").write_text("{}")
    (run / "checkpoint-20").mkdir()
    (run / "checkpoint-20" / COMPLETE).write_text("{}")
    return run


@pytest.mark.parametrize(
    "make,name,kind",
    [
        (lambda r: (_rm(r / "heartbeat"), (r / "heartbeat").write_text("x")), "heartbeat", "a file"),
        (lambda r: (_rm(r / "heartbeat"), (r / "heartbeat").symlink_to(r / "nowhere")), "heartbeat", "a symlink"),
        (
            lambda r: (_rm(r / "heartbeat/stacks"), (r / "heartbeat/stacks").write_text("x")),
            "heartbeat/stacks",
            "a file",
        ),
        (lambda r: (_rm(r / "heartbeat/rank0"), (r / "heartbeat/rank0").mkdir()), "heartbeat/rank0", "a folder"),
        (lambda r: (r / "heartbeat/rank3.hang").mkdir(), "heartbeat/rank3.hang", "a folder"),
        (lambda r: (r / EVENTS_FILE).mkdir(), EVENTS_FILE, "a folder"),
        (lambda r: os.mkfifo(r / EVENTS_FILE), EVENTS_FILE, "a special file"),
    ],
)
def test_the_launch_refuses_a_run_dir_path_of_the_wrong_kind_in_one_line_writing_nothing(tmp_path, make, name, kind):
    run = run_dir_like_a_finished_run(tmp_path)
    make(run)
    before = tree(run)
    with pytest.raises(LaunchError) as err:
        check_run_dir(run)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{run / name} is {kind}") and "move it away or remove it" in msg
    assert tree(run) == before


def _rm(path: Path) -> None:
    import shutil

    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def test_the_launch_notes_bad_rollback_records_and_goes_on(tmp_path):
    run = run_dir_like_a_finished_run(tmp_path)
    append_event(run, {**good(), "to_step": "abc"})
    before = tree(run)
    notes = check_run_dir(run)
    assert len(notes) == 1 and f"{run / EVENTS_FILE}" in notes[0] and "line 1: to_step" in notes[0]
    assert check_run_dir(tmp_path / "no-such-run") == [] and tree(run) == before
    config = {
        "trackers": "tensorboard",
        "latent_cache": "",
        "latent_cache_encode": "auto",
        "annotation_file": "",
        "data_root": "",
        "use_ref_vae": False,
        "ref_vae_path": "",
        "pretrained_model_path": "",
    }
    assert check_inputs(config, ("", ""), "train", run_dir=run) == notes  # what the launch prints as a note
    assert check_inputs(config, ("", ""), "train") == []


def test_the_launcher_and_its_dry_run_make_the_run_dir_checks(tmp_path):
    """Through the CLI, as a user meets them: `--run-name x` again on a run dir whose heartbeat path is a
    file is refused by the dry run and by the launch, in one line, before anything is written; bad
    rollback records are a note of the dry run."""
    out = tmp_path / "out"
    run = out / "x"
    run.mkdir(parents=True)
    (run / "heartbeat").write_text("not a folder")
    append_event(run, {**good(), "to_step": "abc"})
    before = tree(out)
    argv = ["1", "cpu", "--run-name", "x", "--set", f"output_dir='{out}'"]
    for extra in (["--dry-run"], []):
        assert_one_line_error(run_cli_here(*argv, *extra, cwd=tmp_path), r"heartbeat is a file, where the trainer")
        assert tree(out) == before
    (run / "heartbeat").unlink()
    proc = run_cli_here(*argv, "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "note      1 rollback record in" in proc.stdout and "line 1: to_step is" in proc.stdout, proc.stdout


# ------------------------------------------------------------------------------ the watchdog
@pytest.mark.parametrize(
    "make,name",
    [
        (lambda r: (r / "heartbeat").write_text("x"), "heartbeat"),
        (lambda r: ((r / "heartbeat").mkdir(), (r / "heartbeat/stacks").write_text("x")), "heartbeat/stacks"),
        (lambda r: (r / "heartbeat/rank0").mkdir(parents=True), "heartbeat/rank0"),
        (lambda r: (r / "heartbeat/rank0.done").mkdir(parents=True), "heartbeat/rank0.done"),
    ],
)
def test_the_watchdog_says_which_heartbeat_path_is_in_the_way(tmp_path, make, name):
    make(tmp_path)
    dog = Watchdog(tmp_path, 0, 1, 0, lambda why: None, hang_timeout=60.0, on_hang=lambda r, d: None)
    with pytest.raises(LaunchError) as err:
        dog.start()
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{tmp_path / name} is ") and "remove it" in msg, msg
    assert not dog._thread.is_alive()


# ------------------------------------------------------------------------------ requeue.json
DEEP = "[" * 100000 + "]" * 100000
CORRUPT = {
    "empty": b"",
    "garbage": b"not json{",
    "binary": bytes(range(256)) * 4,
    "list": b"[]",
    "null": b"null",
    "string count": b'{"count": "3", "without_progress": 2, "last_checkpoint": null, "stopped": null, "job": "812"}',
    "infinite count": b'{"count": Infinity, "without_progress": 0}',
    "list job": b'{"count": 3, "without_progress": 2, "job": [1]}',
    "no count": b'{"without_progress": 2}',
    "nested": DEEP.encode(),
}


def ckpt(run: Path, step: int) -> None:
    (run / f"checkpoint-{step}").mkdir(parents=True)
    (run / f"checkpoint-{step}" / COMPLETE).write_text(json.dumps({"step": step, "files": []}))


@pytest.mark.parametrize("kind", sorted(CORRUPT))
@pytest.mark.parametrize("check", ["after_stop", "at_start"])
def test_an_unreadable_requeue_json_is_kept_aside_counted_afresh_and_said(tmp_path, kind, check):
    run = tmp_path / "job-812"
    ckpt(run, 20)
    (run / REQUEUE_FILE).write_bytes(CORRUPT[kind])
    fn = after_stop if check == "after_stop" else at_start
    go, out = fn(run, 3, job="812", again="x")
    note, line = out.split("\n")
    assert go and note.startswith("taehv-launch: note: the requeue count is unreadable (") and str(run) in note
    assert "kept as requeue.json.corrupt-1; the count starts afresh" in note
    assert (run / "requeue.json.corrupt-1").read_bytes() == CORRUPT[kind]  # kept, byte for byte
    rec = read_requeues(run)
    assert rec["count"] == (1 if check == "after_stop" else 0) and rec["stopped"] is None and line
    go, out = fn(run, 3, job="812", again="x")  # the next check reads the new record: no note
    assert go and "\n" not in out and read_requeues(run)["count"] == rec["count"] + 1


def test_corrupt_records_are_kept_under_the_next_free_name(tmp_path):
    run = tmp_path / "job-812"
    run.mkdir()
    (run / "requeue.json.corrupt-1").write_text("older")
    (run / REQUEUE_FILE).symlink_to("/dev/zero")  # once an unbounded read
    go, out = after_stop(run, 3, job="812", again="x")
    assert go and "is not a regular file" in out and "kept as requeue.json.corrupt-2" in out
    assert (
        os.readlink(run / "requeue.json.corrupt-2") == "/dev/zero"
        and (run / "requeue.json.corrupt-1").read_text() == "older"
    )
    (run / REQUEUE_FILE).unlink()
    (run / REQUEUE_FILE).mkdir()
    (run / REQUEUE_FILE / "x").write_text("y")  # a folder in the way: moved aside whole
    go, out = after_stop(run, 3, job="812", again="x")
    assert go and "kept as requeue.json.corrupt-3" in out and (run / "requeue.json.corrupt-3" / "x").read_text() == "y"
    assert read_requeues(run)["count"] == 1


def test_a_record_over_the_size_limit_is_kept_aside_without_reading_it(tmp_path):
    run = tmp_path / "job-812"
    run.mkdir()
    with open(run / REQUEUE_FILE, "wb") as f:
        f.truncate(200 << 20)  # sparse: 200 MB on paper
    go, out = after_stop(run, 3, job="812", again="x")
    assert go and "more than a record ever is" in out and (run / "requeue.json.corrupt-1").stat().st_size == 200 << 20


def test_the_command_with_a_deeply_nested_record_exits_0_with_a_note(tmp_path):
    out = tmp_path / "out"
    (out / "job-812").mkdir(parents=True)
    (out / "job-812" / REQUEUE_FILE).write_text(DEEP)
    proc = run_cli_here("requeue-check", "--output-dir", str(out), "--job-id", "812", "--limit", "3", env=clean_env())
    assert proc.returncode == 0 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    lines = proc.stdout.splitlines()
    assert (
        len(lines) == 2 and "nests too deeply" in lines[0] and lines[1].startswith("taehv-launch: requeueing job 812")
    )
    env = clean_env(JOB_COMPLETION_INDEX="0")
    (out / "job-812" / REQUEUE_FILE).write_text("null")
    proc = run_cli_here(
        "requeue-check", "--output-dir", str(out), "--job-id", "812", "--limit", "3", "--at-start", env=env
    )
    assert proc.returncode == 0 and "kept as requeue.json.corrupt-2" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_output_dir_is_an_error(tmp_path, value):
    proc = run_cli_here("requeue-check", "--output-dir", value, "--job-id", "812", "--limit", "3", env=clean_env())
    assert_one_line_error(proc, "--output-dir is empty")


def test_at_start_makes_the_missing_output_dir_on_a_fresh_volume(tmp_path):
    out = tmp_path / "volume" / "runs"
    env = clean_env(JOB_COMPLETION_INDEX="0")
    proc = run_cli_here(
        "requeue-check", "--output-dir", str(out), "--job-id", "j-1", "--limit", "3", "--at-start", env=env
    )
    assert proc.returncode == 0 and "first start of this run" in proc.stdout
    assert read_requeues(out / "job-j-1")["count"] == 0


def test_a_record_that_cannot_be_written_does_not_stop_the_run_nor_exit_1(tmp_path):
    """The file size limit (`ulimit -f 0`, as a full quota) makes the write fail in a real process."""
    out = tmp_path / "out"
    (out / "job-812").mkdir(parents=True)
    (out / "job-812" / REQUEUE_FILE).write_text("garbage")

    def no_writes():
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    proc = subprocess.run(
        [sys.executable, "-m", "taehv_launch.cli", "requeue-check", "--output-dir", str(out), "--job-id", "812"]
        + ["--limit", "3"],
        env=clean_env(),
        capture_output=True,
        text=True,
        preexec_fn=no_writes,
        timeout=120,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    note, line = proc.stdout.splitlines()
    assert "kept as requeue.json.corrupt-1" in note and "could not record it in" in line
    assert (out / "job-812" / "requeue.json.corrupt-1").read_text() == "garbage"


# ------------------------------------------------------------------------------ a real resume
@pytest.mark.slow
def test_a_resume_with_bad_rollback_records_notes_them_and_trains_at_a_finite_lr(tmp_path):
    from trainrun import launch, ok

    first, run = launch(tmp_path, 1, *overrides("max_train_steps=4 checkpointing_steps=4"))
    ok(first)
    append_event(run, {"event": "rollback", "to_step": 2})  # the audit's KeyError 'data_seed'
    with open(run / EVENTS_FILE, "a") as f:
        f.write('{"event": "rollback", "to_step": "abc"}\n{"event": "rollback", "to_step": 3, "lr_factor": NaN}\n')
    proc, _ = launch(tmp_path, 1, *overrides("max_train_steps=6 checkpointing_steps=4"), "--resume", "auto")
    ok(proc)
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text and "lr nan" not in text
    notes = [line for line in text.splitlines() if "3 rollback records in" in line]
    assert notes and all("line 1:" in n and "line 2:" in n and "line 3:" in n for n in notes), text
