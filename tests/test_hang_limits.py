"""Hang limits from the run's own times (#39 item 4): the derivation (a pure function), what a rank
measures, rank 0 deriving and sharing them through <run>/hang_limits.json, and every judge (the
trainer's watchdog, the launcher's freeze watch, `status`) using that file's limits, this launch's only.
The real 2-rank run with a SIGSTOPped rank is in tests/test_hang.py (slow)."""

from __future__ import annotations

import json
import os
import time

import pytest

from taehv_launch.rundir.hanglimits import (
    FLOOR_S,
    ONCE_FLOOR_S,
    MEASURE_STEPS,
    HangLimits,
    combine,
    derived_line,
    hang_limits_path,
    job_limit,
    limit_text,
    p99,
    read_hang_limits,
    write_hang_limits,
)
from taehv_launch.train.durability.progress import WARMUP_STEPS, Progress
from taehv_launch.train.durability.watchdog import Watchdog, pid_namespace


def limits(step=None, checkpoint=None, validation=None, hang_timeout=300, slow=1800) -> HangLimits:
    times = {"step_s": step, "steps": MEASURE_STEPS if step is not None else None}
    return HangLimits(hang_timeout, slow, times | {"checkpoint_s": checkpoint, "validation_s": validation})


# ----------------------------------------------------------------------------- the derivation


def test_p99_is_the_nearest_rank_so_of_twenty_steps_the_slowest():
    assert p99([]) is None
    assert p99([0.3] * 19 + [0.9]) == 0.9
    assert p99(list(range(1, 201))) == 198  # of 200: two above it


@pytest.mark.parametrize(
    "kind,got,hang_timeout,want",
    [
        ("step", 0.4, 300, (FLOOR_S, True)),  # 5 x 0.4 s = 2 s: the floor
        ("step", 12.0, 300, (60.0, True)),  # 5 x 12 s
        ("step", 100.0, 300, (300, False)),  # 500 s: the configured value bounds it, and is named
        ("step", 0.4, 20, (20, False)),  # a configured value under the floor wins over it
        ("checkpoint", 45.0, 300, (450.0, True)),  # 10 x the one checkpoint measured
        ("checkpoint", 19.0, 300, (ONCE_FLOOR_S, True)),  # the first checkpoint is the smallest: 300 s at least
        ("checkpoint", 0.5, 300, (ONCE_FLOOR_S, True)),
        ("validation", 400.0, 300, (1800, False)),  # at most hang_timeout_slow
        ("validation", None, 300, (1800, False)),  # not measured: the configured value
        ("step", 0.4, 0, (0, False)),  # hang detection off: nothing derived
    ],
)
def test_each_limit_is_a_multiple_of_its_time_between_the_floor_and_the_configured_value(kind, got, hang_timeout, want):
    lim = HangLimits(hang_timeout, 1800, {f"{kind}_s": got})
    assert lim.limit(kind) == want


def test_a_phase_is_judged_by_its_own_limit_and_the_job_by_the_longest_of_its_ranks():
    lim = limits(step=0.4, checkpoint=45.0)  # step 30 s, checkpoint 450 s, validation not measured
    assert lim.for_phase("forward", False) == (FLOOR_S, "step")
    assert lim.for_phase("forward", True) == (1800, "hang_timeout_slow")  # warm-up
    assert lim.for_phase("checkpoint", False) == (450.0, "checkpoint")
    assert lim.for_phase("log", False) == (1800, "hang_timeout_slow")  # the log step's trackers: a slow phase
    assert lim.for_phase("validation", False) == (1800, "hang_timeout_slow")
    assert lim.for_phase("compile", False) == (1800, "hang_timeout_slow")  # no limit of its own
    assert job_limit([("data", False), ("collective", False)], False, lim) == (FLOOR_S, "step")
    assert job_limit([("data", False), ("checkpoint", False)], False, lim) == (450.0, "checkpoint")
    assert job_limit([("data", False)], True, lim) == (1800, "hang_timeout_slow")  # a rank not beating yet
    assert job_limit([(["bad"], "yes")], False, lim) == (FLOOR_S, "step")  # fields of another type: a step's
    # a fast first checkpoint: those waiting for the saving rank get ONCE_FLOOR_S, not the step limit
    short = limits(step=12.0, checkpoint=0.5)  # a checkpoint's limit is never under ONCE_FLOOR_S
    assert job_limit([("collective", False), ("checkpoint", False)], False, short) == (ONCE_FLOOR_S, "checkpoint")
    # configured only: as before (#25)
    assert job_limit([("data", False)], False, HangLimits(300, 1800)) == (300, "hang_timeout")


def test_the_hang_line_names_a_derived_limit_and_where_it_comes_from():
    assert limit_text((300, "hang_timeout")) == "hang_timeout 300 s"
    assert limit_text((30.0, "step")) == "step limit 30 s, from this run's step times"
    assert limit_text((190.0, "checkpoint")) == "checkpoint limit 190 s, from this run's checkpoint times"


def test_the_job_takes_each_time_from_every_rank_and_the_longest():
    fast = {"step_s": 0.3, "steps": MEASURE_STEPS, "checkpoint_s": 2.0, "validation_s": None}
    slow = {"step_s": 0.5, "steps": MEASURE_STEPS, "checkpoint_s": None, "validation_s": None}
    got = combine([fast, slow], world=2)
    assert got == {"step_s": 0.5, "checkpoint_s": None, "validation_s": None, "steps": MEASURE_STEPS}
    assert combine([fast], world=2)["step_s"] is None  # rank 1 has no heartbeat (with times) yet
    assert combine([fast, {**slow, "steps": 5}], world=2)["step_s"] is None  # still measuring
    assert combine([fast, {**slow, "checkpoint_s": 3.0}], world=2)["checkpoint_s"] == 3.0
    assert combine([fast, {**slow, "step_s": "x"}, None], world=2)["step_s"] is None  # a bad field
    assert combine([], world=0)["step_s"] is None


# ----------------------------------------------------------------------------- the file


def test_the_file_holds_the_measured_times_and_readers_recompute_the_limits_within_their_bounds(tmp_path):
    lim = limits(step=0.41, validation=4.5)
    write_hang_limits(tmp_path, lim)
    record = json.loads(hang_limits_path(tmp_path).read_text())
    assert record["limits"] == {"step_s": FLOOR_S, "checkpoint_s": 1800, "validation_s": ONCE_FLOOR_S}
    assert record["configured"] == {"hang_timeout": 300, "hang_timeout_slow": 1800}
    back = read_hang_limits(tmp_path, None, 300, 1800)
    assert back.limit("step") == (FLOOR_S, True) and back.limit("validation") == (ONCE_FLOOR_S, True)
    assert read_hang_limits(tmp_path, time.time() + 60, 300, 1800) == HangLimits(300, 1800)  # an earlier launch's
    assert read_hang_limits(tmp_path, None, 0, 1800) == HangLimits(0, 1800)  # detection off
    assert read_hang_limits(tmp_path / "none", None, 300, 1800) == HangLimits(300, 1800)
    record["measured"] = {"step_s": 1e-6, "steps": MEASURE_STEPS, "checkpoint_s": -3, "validation_s": "45"}
    hang_limits_path(tmp_path).write_text(json.dumps(record))  # a hand edit: never under the floor
    edited = read_hang_limits(tmp_path, None, 300, 1800)
    assert edited.limit("step") == (FLOOR_S, True) and edited.limit("checkpoint") == (1800, False)
    hang_limits_path(tmp_path).write_text("[1, 2")  # torn or not JSON: the configured values
    assert read_hang_limits(tmp_path, None, 300, 1800) == HangLimits(300, 1800)


def test_the_printed_line_says_each_limit_what_it_comes_from_and_the_bounds(tmp_path):
    line = derived_line(limits(step=0.41, validation=4.5), tmp_path)
    assert line == (
        "hang limits from this run's times: step 30 s (measured p99 0.41 s of 20 steps), checkpoint 1800 s "
        "(not measured yet), validation 300 s (measured 4.5 s); configured bounds hang_timeout 300 s, "
        f"hang_timeout_slow 1800 s, floors 30 s / 300 s (kept in {tmp_path / 'hang_limits.json'})"
    )


# ----------------------------------------------------------------------------- what a rank measures


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run_steps(p: Progress, clock: Clock, first: int, last: int, seconds: float) -> None:
    for step in range(first, last + 1):
        clock.now += seconds
        p.set_step(step)


def test_a_rank_measures_its_steps_after_warm_up_without_the_slow_phases_inside_them():
    clock = Clock()
    p = Progress(clock)
    p.set_phase("train")  # set up (train/loop/run.py)
    run_steps(p, clock, 1, WARMUP_STEPS, 60.0)  # compile: not measured
    assert p.times() == {"step_s": None, "steps": 0, "checkpoint_s": None, "validation_s": None}
    clock.now += 0.2
    with p.phase("validation"):
        clock.now += 7.0
        with p.phase("collective"):
            clock.now += 1.0  # inside the validation: part of it
    clock.now += 0.3
    p.set_step(WARMUP_STEPS + 1)
    assert p.step_times == [pytest.approx(0.5)] and p.phase_times == {"validation": 8.0}
    with p.phase("checkpoint"):
        clock.now += 3.0
    run_steps(p, clock, WARMUP_STEPS + 2, WARMUP_STEPS + 4, 0.4)
    with p.phase("checkpoint"):
        clock.now += 9.0  # a later checkpoint: the first one stays the measured one
    p.set_step(2)  # a rollback: no step time
    p.compile_started()  # a recompile mid-step: a slow phase
    assert p.phase_name == "compile"
    clock.now += 40.0
    p.compile_ended()
    assert p.phase_name == "train"  # back to the phase it interrupted
    clock.now += 0.6
    p.set_step(3)
    run_steps(p, clock, 4, 100, 0.3)
    assert len(p.step_times) == MEASURE_STEPS and max(p.step_times) == pytest.approx(0.6)
    assert p.times() == {"step_s": pytest.approx(0.6), "steps": 20, "checkpoint_s": 3.0, "validation_s": 8.0}
    assert p.snapshot()["times"] == p.times()


# ----------------------------------------------------------------------------- rank 0 derives, every rank reads


def measured_progress(step_s: float, validation_s: float | None = None) -> Progress:
    clock = Clock()
    p = Progress(clock)
    p.set_phase("train")
    run_steps(p, clock, 1, WARMUP_STEPS + MEASURE_STEPS, step_s)
    if validation_s is not None:
        with p.phase("validation"):
            clock.now += validation_s
    p.clock = time.monotonic  # from here on the real clock: the ranks are busy, not hung
    p.since = time.monotonic()
    return p


def dog(tmp_path, rank, progress, notes):
    return Watchdog(
        tmp_path,
        rank,
        2,
        0,
        lambda why: None,
        period_s=0.1,
        stale_s=30.0,
        hang_timeout=300,
        hang_timeout_slow=1800,
        on_hang=lambda report, decided: None,
        progress=progress,
        note=notes.append,
    )


def wait_until(what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not what() and time.monotonic() < deadline:
        time.sleep(0.05)
    return what()


def test_rank_0_derives_from_every_ranks_times_writes_them_once_and_every_rank_judges_by_them(tmp_path):
    notes0, notes1 = [], []
    w1 = dog(tmp_path, 1, measured_progress(0.5, validation_s=6.0), notes1).start()
    w0 = dog(tmp_path, 0, measured_progress(0.3), notes0).start()
    try:
        assert wait_until(lambda: w1.limits.limit("step") == (FLOOR_S, True)), w1.limits
        assert w0.limits.measured["step_s"] == 0.5  # the slower rank's
        assert w0.limits.limit("validation") == (1800, False)  # rank 0 has not validated: not derived
        time.sleep(0.5)
        assert len(notes0) == 1 and notes1 == []
        assert notes0[0].startswith("hang limits from this run's times: step 30 s (measured p99 0.5 s of 20 steps)")
        record = json.loads(hang_limits_path(tmp_path).read_text())
        assert record["measured"]["step_s"] == 0.5 and record["limits"]["step_s"] == FLOOR_S
        w0.stop(clean=False)
        # a restarted launch's rank 0 removes the file: the configured values until it has measured again
        again = dog(tmp_path, 0, Progress(), []).start()
        assert not hang_limits_path(tmp_path).exists() and again.limits == HangLimits(300, 1800)
        assert wait_until(lambda: w1.limits == HangLimits(300, 1800))
        again.stop(clean=False)
    finally:
        w0.stop(clean=False)
        w1.stop(clean=False)


# ----------------------------------------------------------------------------- the launcher and status read them


def test_the_launchers_freeze_watch_and_status_use_this_launchs_derived_limits(tmp_path):
    from test_freeze import run_dir_with_a_frozen_rank, stopped_child, watch

    from taehv_launch.watch.status import collect
    from taehv_launch.watch.statustext import render

    child = stopped_child()
    try:
        run = run_dir_with_a_frozen_rank(tmp_path, child.pid, 300, age=45.0)  # 45 s: under 300 s, over 30 s
        assert collect(run)["state"] == "running"
        w = watch(run, [], hang_timeout=300)
        assert w.find_frozen() is None
        write_hang_limits(run, limits(step=0.4))
        frozen, limit = w.find_frozen()
        assert sorted(frozen) == [0] and limit == (FLOOR_S, "step")
        f = collect(run)
        text = render([f], f["now"])
        old = json.loads(hang_limits_path(run).read_text())
        later = watch(run, [], hang_timeout=300)  # a later launch: the file is an earlier one's
        os.utime(hang_limits_path(run), (later.started - 60, later.started - 60))
        assert later.find_frozen() is None
    finally:
        child.kill()
        child.wait()
    assert f["state"] == "hung", text
    row = f["heartbeat_ranks"][0]
    assert row["limit_s"] == FLOOR_S and row["hang_limits"]["step_s"] == FLOOR_S
    assert "past the hang limit of 30 s" in text
    assert "  hang limit step 30 s (measured p99 0.4 s of 20 steps), checkpoint 1800 s (not measured yet)" in text
    assert old["measured"]["step_s"] == 0.4


@pytest.mark.slow
def test_a_torch_compile_is_a_compile_phase_once_the_watchdog_watches_compiles():
    """A recompile mid-run must not fire the step limit: with torch.compile in use (torch._dynamo
    imported), dynamo's callbacks make each compile a "compile" phase (hang_timeout_slow), outside the
    step's time. Slow: importing dynamo and compiling take seconds."""
    import torch

    p = Progress()
    p.set_phase("forward")
    import torch._dynamo  # noqa: F401  (what torch.compile imports: the trainer's compile set-up)
    from torch._dynamo.callback import callback_handler

    seen: list[str] = []
    assert p.watch_compiles() and p.watch_compiles()  # once
    mine = callback_handler.register_start_callback(lambda *a: seen.append(p.phase_name))
    try:
        torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.ones(3))
    finally:
        callback_handler.remove_start_callback(mine)
        callback_handler.remove_start_callback(p.compile_started)
        callback_handler.remove_end_callback(p.compile_ended)
    assert seen and set(seen) == {"compile"} and p.phase_name == "forward"
    assert p._slow_s > 0  # left out of the step's time


def test_a_peer_whose_process_is_gone_is_reported_dead_not_hung_when_the_hang_limit_passes_first(tmp_path):
    """A SIGKILLed rank: its heartbeat stops and its process is gone. The hang limit (from the run's
    times: 30 s at least, so under stale_s + a period of progress) may pass before the heartbeat is
    stale_s old; it is still the dead peer (exit 1, "stopped responding"), as documented, not a hang."""
    import socket
    import sys

    from conftest import start

    child = start([sys.executable, "-c", "pass"], capture=False)
    child.wait()  # reaped: its pid names no process
    deads, hangs = [], []
    p = Progress()
    p.set_phase("backward")
    w0 = Watchdog(
        tmp_path,
        0,
        2,
        0,
        deads.append,
        period_s=0.1,
        stale_s=2.0,
        hang_timeout=0.5,
        hang_timeout_slow=0.5,
        on_hang=lambda report, decided: hangs.append(report),
        progress=p,
    )
    peer = {"rank": 1, "node": 0, "host": socket.gethostname(), "pid": child.pid, "step": 5, "phase": "backward"}
    peer["pidns"] = pid_namespace()  # a rank of this PID namespace: its pid is looked up here
    (tmp_path / "heartbeat").mkdir()
    (tmp_path / "heartbeat" / "rank1").write_text(json.dumps(peer | {"progress_age_s": 0.1, "warmup": False}))
    w0.start()
    try:
        assert wait_until(lambda: deads, timeout=30), hangs
        assert deads[0].startswith("rank 1 (node 0") and "stopped responding" in deads[0] and hangs == []
    finally:
        w0.stop(clean=False)
