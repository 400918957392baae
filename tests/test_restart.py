"""Restart in place (#39): the verdict (run/restart.py decide, pure), the restart command line, the status
summary, and a real 2-rank CPU job whose rank 1 is SIGKILLed mid-run."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from conftest import Proc, clean_env, overrides, reaped, run_cli
from taehv_launch.errors import EXIT_ABORTED, EXIT_FAILED, EXIT_HUNG, EXIT_OK, EXIT_RESUMABLE, EXIT_USAGE
from taehv_launch.rundir.events import restarts_summary
from taehv_launch.run.restart import decide, restart_argv
from trainrun import scalars, start_launch

CAPS = {"max_restarts": 3, "max_without_progress": 2}


def verdict(code, message=None, **kw):
    args = {"started_from": None, "newest": "checkpoint-2", "stepped": True, "count": 0, "without_progress": 0}
    args.update(CAPS)
    args.update(kw)
    return decide(code, message, **args)


@pytest.mark.parametrize("code", [EXIT_FAILED, EXIT_HUNG, 137, 139])
def test_failures_and_hangs_restart(code):
    v = verdict(code)
    assert v.restart and v.without_progress == 0
    assert ("hang" in v.line) == (code == EXIT_HUNG)


@pytest.mark.parametrize("code", [EXIT_OK, EXIT_USAGE, EXIT_RESUMABLE, EXIT_ABORTED])
def test_clean_ends_config_errors_preemption_and_aborts_do_not(code):
    assert not verdict(code).restart


def test_a_user_error_that_a_restart_would_meet_again_is_not_restarted(tmp_path):
    """Diverging again or a full disk (a UserError of exit 1) is recorded with "repeats" by the trainer's
    main.py; a dead peer (PeerFailure) and a crash are not, and restart."""
    from taehv_launch.rundir.exitstatus import read_exit_status, write_exit_status

    v = verdict(EXIT_FAILED, "diverged again 120 steps after the rollback", repeats=True)
    assert not v.restart and "a restart would meet again (exit 1)" in v.line
    write_exit_status(tmp_path / "s.json", EXIT_FAILED, "diverged again", repeats=True)
    assert read_exit_status(tmp_path / "s.json") == {"code": 1, "message": "diverged again", "repeats": True}
    write_exit_status(tmp_path / "p.json", EXIT_FAILED, "rank 1 died")
    assert read_exit_status(tmp_path / "p.json") == {"code": 1, "message": "rank 1 died"}
    assert verdict(EXIT_FAILED, "rank 1 died").restart


def test_a_stop_the_launcher_was_asked_for_and_restarts_off_do_not():
    """(Several nodes restart too, together: tests/test_restart_nodes.py.)"""
    assert not verdict(EXIT_FAILED, stop_requested=True).restart
    assert not verdict(EXIT_FAILED, max_restarts=0).restart


def test_out_of_memory_before_the_first_step_is_not_restarted_but_later_is():
    msg = "CUDA out of memory. Tried to allocate 2.00 GiB"
    assert not verdict(EXIT_FAILED, msg, stepped=False).restart
    assert verdict(EXIT_FAILED, msg, stepped=True).restart


def test_the_restart_cap():
    assert verdict(EXIT_FAILED, count=2).restart
    v = verdict(EXIT_FAILED, count=3)
    assert not v.restart and "max_restarts=3" in v.line


def test_the_no_progress_cap_counts_restarts_that_got_past_no_checkpoint():
    # the first failure of a launch never counts, even without a checkpoint
    assert verdict(EXIT_FAILED, newest=None, count=0).without_progress == 0
    # a restart from checkpoint-2 that fails with checkpoint-2 still the newest: one without progress
    v = verdict(EXIT_FAILED, started_from="checkpoint-2", newest="checkpoint-2", count=1)
    assert v.restart and v.without_progress == 1
    v = verdict(EXIT_FAILED, started_from="checkpoint-2", newest="checkpoint-2", count=2, without_progress=1)
    assert not v.restart and v.without_progress == 2 and "max_restarts_without_progress=2" in v.line
    # progress resets it
    v = verdict(EXIT_FAILED, started_from="checkpoint-2", newest="checkpoint-4", count=2, without_progress=1)
    assert v.restart and v.without_progress == 0
    # 0 = no limit
    assert verdict(
        EXIT_FAILED, started_from="c", newest="c", count=2, without_progress=5, max_without_progress=0
    ).restart


def test_restart_argv_replaces_the_resume():
    argv = ["accelerate", "launch", "main.py", "--run-dir", "r", "--resume", "r/checkpoint-2", "--debug"]
    assert restart_argv(argv, Path("r/checkpoint-4")) == [*argv[:5], "--debug", "--resume", "r/checkpoint-4"]
    assert restart_argv(argv, None) == argv


def test_restarts_summary():
    assert restarts_summary([{"event": "rollback"}]) is None
    events = [
        {"event": "restart", "time": 10.0, "reason": "exit 1: boom", "restart": 1},
        {"event": "restarted", "restart": 1, "recovery_s": 12.5},
        {"event": "restart", "time": 20.0, "reason": "hang (exit 76)", "restart": 2},
        {"event": "restarted", "restart": 2, "recovery_s": 30.0},
    ]
    s = restarts_summary(events)
    assert (s["count"], s["last_reason"], s["lost_s"], s["ended"]) == (2, "hang (exit 76)", 42.5, None)


def _launch(tmp: Path, name: str, *extra: str, **kw) -> Proc:
    """`taehv-launch 2 cpu` (FAST, restarts on) in the background, its output in pipes (or start_launch's
    out/err files in kw); the demo data under tmp."""
    env = clean_env(TAEHV_CACHE=str(tmp / "taehv-cache"), OMP_NUM_THREADS="1")
    return start_launch(tmp, 2, "--set", "max_restarts=3", *extra, run_name=name, env=env, **kw)


def rank_pid(run: Path, rank: int, min_step: int, timeout: float = 300, checkpoint: str | None = "checkpoint-2") -> int:
    """The pid of `rank` once progress.json shows min_step and `checkpoint` is complete."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            prog = json.loads((run / "progress.json").read_text())
            hb = json.loads((run / "heartbeat" / f"rank{rank}").read_text())
            if prog["step"] >= min_step and (checkpoint is None or (run / checkpoint).is_dir()):
                return int(hb["pid"])
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.1)
    raise AssertionError("the run never reached the step to kill at")


@pytest.mark.slow
def test_a_sigkilled_rank_is_restarted_in_place_and_the_curve_joins(tmp_path):
    common = overrides("max_train_steps=8 validation_steps=100")
    # the uninterrupted curve, run beside the killed one (output into files: nobody reads a pipe meanwhile)
    full = _launch(tmp_path, "full", *common, out=tmp_path / "full.out", err=tmp_path / "full.err")
    part = _launch(tmp_path, "part", *common)
    run = tmp_path / "output" / "part"
    with reaped(full, part):
        os.kill(rank_pid(run, 1, 3), signal.SIGKILL)
        killed_at = time.time()
        out, err = part.communicate(timeout=600)
        assert part.returncode == 0, (out[-3000:], err[-3000:])
        assert full.finish(600) == 0, full.text()[-6000:]
    assert "taehv-launch: restart 1 of 3 after" in err

    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    restarts = [e for e in events if e["event"] == "restart"]
    assert len(restarts) == 1 and restarts[0]["checkpoint"].startswith("checkpoint-")
    assert [e["restart"] for e in events if e["event"] == "restarted"] == [1]
    start = int(restarts[0]["checkpoint"].split("-")[1])
    first = next(e for e in events if e["event"] == "restarted")["first_step_at"]
    # the restarted trainer's records carry its attempt (1) beside the launch id (rundir/launchid.py)
    written = [json.loads(p.read_text()) for p in (run / "progress.json", *(run / "heartbeat").glob("rank[01]"))]
    assert [(r.get("attempt"), r.get("launch_id")) for r in written] == [(1, written[0]["launch_id"])] * 3
    print(f"\nCPU, 2 ranks: SIGKILL of rank 1 to the first new step: {first - killed_at:.1f} s")

    a = dict(scalars(tmp_path / "output" / "full")["train/loss"])
    b = dict(scalars(run)["train/loss"])  # the restart's values are read last: they stand
    assert sorted(b) == sorted(a) == list(range(1, 9))
    for step in range(start + 1, 9):
        assert b[step] == pytest.approx(a[step], rel=1e-4, abs=1e-6), step

    status = run_cli("status", str(run), timeout=120)
    assert status.returncode == 0, status.stderr
    assert "restarts   1 in the job; last " in status.stdout, status.stdout
    assert not (run / "requeue.json").exists()
