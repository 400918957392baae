"""Hang detection (#25): a rank that makes no progress for hang_timeout becomes a report naming it, a
stack dump from every live rank, and exit 76 (EXIT_HUNG).

Fast: who is named as stuck (hand-made heartbeats), the line, the limits, process states, the launch
environment for the flight recorder, a real gloo flight-recorder dump, and real watchdog threads with
real heartbeat files and a real SIGSTOPped process. Slow: the real launcher and 2 CPU ranks with the cpu
profile's DataLoader worker, one rank frozen with SIGSTOP (with the configured limit, and with the
limit derived from the run's step times, #39 item 4: the rest of that is tests/test_hang_limits.py),
and one sleeping inside the stop vote's collective (the TAEHV_LAUNCH_TEST_HANG hook).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from conftest import start
from taehv_launch.errors import EXIT_HUNG
from taehv_launch.rundir.hanglimits import HangLimits
from taehv_launch.rundir.heartbeat import read_hang_reports, stack_path, stacks_dir
from taehv_launch.train.durability.hang import (
    hang_line,
    job_limit,
    name_culprits,
    process_state,
    rank_view,
    ranks_text,
    unsettled,
)
from taehv_launch.train.durability.progress import WARMUP_STEPS, Progress
from taehv_launch.train.durability.watchdog import Watchdog


def view(step=10, phase="collective", collectives=20, age=400.0, late=False, state=None, beat=1.0, warmup=False):
    return {
        "step": step,
        "phase": phase,
        "collectives": collectives,
        "warmup": warmup,
        "progress_age_s": age,
        "beat_age_s": beat,
        "late": late,
        "state": state,
        "host": "h",
        "pid": 1,
        "node": 0,
    }


# ----------------------------------------------------------------------------- who is stuck


def test_a_frozen_rank_is_the_culprit_whatever_the_others_do():
    views = {0: view(phase="backward"), 1: view(phase="forward", late=True, state="T", beat=33.0), 2: view()}
    assert name_culprits(views) == ([1], "late")


def test_the_rank_behind_in_step_is_the_culprit():
    """GPU collectives are asynchronous: ranks 0 and 2 went on into step 11 and wait there."""
    views = {0: view(step=11, phase="forward"), 1: view(step=10, phase="collective"), 2: view(step=11)}
    assert name_culprits(views) == ([1], "behind")


def test_the_rank_that_has_not_issued_the_collective_the_others_wait_in_is_the_culprit():
    """All in "collective" at the same step: rank 1 issued one collective fewer (the test hook's case)."""
    views = {0: view(collectives=21), 1: view(collectives=20), 2: view(collectives=21), 3: view(collectives=21)}
    assert name_culprits(views) == ([1], "behind")


def test_ranks_outside_a_collective_while_the_others_wait_in_one_are_the_culprits():
    views = {0: view(), 1: view(phase="checkpoint"), 2: view(), 3: view(phase="validation")}
    assert name_culprits(views) == ([1, 3], "outside")


def test_when_every_rank_waits_in_a_collective_all_are_named():
    views = {r: view() for r in range(4)}
    culprits, why = name_culprits(views)
    assert (culprits, why) == ([0, 1, 2, 3], "all-collective")
    line = hang_line(views, culprits, why, (300, "hang_timeout"), Path("/r/heartbeat/stacks"))
    assert line.startswith("job hung: ranks 0-3 stuck in collective at step 10, no progress for 400 s")
    assert "every rank waits in a collective that never completed" in line and "waiting:" not in line


def test_a_rank_stuck_in_its_data_loading_is_the_culprit_when_no_rank_is_in_a_collective():
    views = {0: view(phase="backward"), 1: view(phase="data"), 2: view(phase="backward")}
    assert name_culprits(views) == ([1], "local")


def test_ranks_stuck_each_on_its_own_are_all_named():
    views = {0: view(phase="forward"), 1: view(phase="backward")}
    assert name_culprits(views) == ([0, 1], "all")
    line = hang_line(views, [0, 1], "all", (300, "hang_timeout"), Path("/s"))
    assert line.startswith("job hung: ranks 0-1 stuck (rank 0 in forward at step 10; rank 1 in backward at step 10)")


def test_the_line_names_the_stuck_rank_its_phase_step_the_waiting_ranks_and_the_dumps():
    views = {0: view(collectives=21, age=23.4), 1: view(collectives=20, age=25.2), 2: view(collectives=21, age=22.0)}
    culprits, why = name_culprits(views)
    line = hang_line(views, culprits, why, (20, "hang_timeout"), Path("/runs/x/heartbeat/stacks"))
    assert line == (
        "job hung: rank 1 stuck in collective at step 10, no progress for 25 s (hang_timeout 20 s); "
        "behind the others: it has not reached the step or collective they wait in; "
        "waiting: ranks 0, 2 (collective, step 10); stack dumps: /runs/x/heartbeat/stacks; "
        "resume with --resume auto once the cause is fixed"
    )


def test_the_line_says_why_a_frozen_rank_does_not_answer():
    views = {0: view(phase="backward", age=31), 1: view(phase="forward", late=True, state="T", beat=29.6, age=33)}
    line = hang_line(views, [1], "late", (1800, "hang_timeout_slow"), Path("/s"))
    assert line.startswith(
        "job hung: rank 1 stuck in forward at step 10, no progress for 33 s (hang_timeout_slow 1800 s); "
        "not responding since its last heartbeat 30 s ago (its phase and step then), its process is stopped "
        "(SIGSTOP or job control); "
        "waiting: rank 0 (backward, step 10)"
    )
    views[1]["state"] = None
    assert "its process is gone or on another node" in hang_line(views, [1], "late", (20, "hang_timeout"), Path("/s"))


def test_one_rank_alone_is_named_without_comparisons():
    line = hang_line({0: view(phase="data")}, [0], "all", (20, "hang_timeout"), Path("/s"))
    assert line.startswith(
        "job hung: rank 0 stuck in data at step 10, no progress for 400 s (hang_timeout 20 s); stack"
    )


@pytest.mark.parametrize(
    "ranks,text",
    [([3], "rank 3"), ([0, 1, 2, 5], "ranks 0-2, 5"), ([7, 1, 3, 2], "ranks 1-3, 7"), ([4, 6], "ranks 4, 6")],
)
def test_ranks_text(ranks, text):
    assert ranks_text(ranks) == text


def test_the_slow_limit_holds_while_any_rank_is_in_a_slow_phase_warm_up_or_not_started():
    fast = {0: view(phase="data"), 1: view()}
    assert job_limit(fast, 0, HangLimits(300, 1800)) == (300, "hang_timeout")
    assert job_limit({**fast, 1: view(phase="checkpoint")}, 0, HangLimits(300, 1800)) == (1800, "hang_timeout_slow")
    assert job_limit({**fast, 0: view(warmup=True)}, 0, HangLimits(300, 1800)) == (1800, "hang_timeout_slow")
    assert job_limit(fast, 1, HangLimits(300, 1800)) == (1800, "hang_timeout_slow")  # a rank with no heartbeat yet
    frozen = view(phase="checkpoint", warmup=True, late=True, state="T")
    assert job_limit({**fast, 1: frozen}, 0, HangLimits(300, 1800)) == (300, "hang_timeout")  # stopped: no allowance
    frozen["state"] = "D"  # but a rank stuck writing (its heartbeat on the same filesystem) keeps it
    assert job_limit({**fast, 1: frozen}, 0, HangLimits(300, 1800)) == (1800, "hang_timeout_slow")
    assert job_limit({0: view(phase="setup")}, 0, HangLimits(600, 100)) == (600, "hang_timeout_slow")  # never below


def test_rank_view_ages_a_silent_rank_from_its_last_heartbeat():
    info = {"step": 4, "phase": "forward", "progress_age_s": 2.0, "collectives": 9, "mtime": 1000.0}
    info |= {"host": "elsewhere", "pid": 5, "node": 1, "warmup": False}
    fresh, silent = rank_view(info, 1003.0, 5.0), rank_view(info, 1030.0, 5.0)
    assert (fresh["progress_age_s"], fresh["late"], fresh["state"]) == (5.0, False, None)
    assert (silent["progress_age_s"], silent["beat_age_s"], silent["late"]) == (32.0, 30.0, True)
    assert silent["state"] is None  # another host: nothing can be told


def test_the_verdict_waits_until_every_rank_beat_after_the_limit_or_is_late():
    """#35 item 12: hang_timeout 10 s with 5 s beats, a rank frozen in backward next to a peer blocked in
    DDP's all-reduce (the same step, phase and count): when the limit passes its heartbeat is a few
    seconds old, not late (15 s). Deciding then said "every rank is stuck"; the verdict waits until
    each rank beat after the limit passed (live) or is late (frozen: the culprit)."""
    live, frozen = view(phase="backward", age=10.4, beat=0.0), view(phase="backward", age=10.6, beat=4.0)
    assert unsettled({0: live, 1: frozen}, 10, 5.0)  # its beat is older than the limit's passing (0.6 s ago)
    assert not unsettled({0: live, 1: {**frozen, "beat_age_s": 0.5}}, 10, 5.0)  # beat since: live
    assert name_culprits({0: live, 1: frozen}) == ([0, 1], "all")  # what deciding now would say
    assert not unsettled({0: live, 1: {**frozen, "late": True}}, 10, 5.0)  # late: the culprit
    assert name_culprits({0: live, 1: {**frozen, "late": True}}) == ([1], "late")
    assert not unsettled({0: live, 1: {**frozen, "progress_age_s": 25.1}}, 10, 5.0)  # bounded: 3 periods


def test_no_verdict_on_a_heartbeat_older_than_the_newest_progress_of_the_job():
    """Review of #39 item 4: rank 0 leaves a slow phase (its rank-0-only work after validation) while
    rank 1's last heartbeat still shows its wait, 54 s old by then; the job's limit has dropped to the
    step's 30 s. Judging on that heartbeat reported a healthy job hung: the verdict waits for a beat
    newer than rank 0's progress. A frozen rank turns late and is not waited for."""
    moved_on = view(phase="forward", age=0.5, beat=0.2)
    waited = view(phase="collective", age=54.0, beat=4.0)
    assert unsettled({0: moved_on, 1: waited}, 30, 5.0)
    assert not unsettled({0: moved_on, 1: {**waited, "late": True}}, 30, 5.0)
    stuck = view(phase="collective", age=54.0, beat=1.0)  # both beating, no progress anywhere: a real hang
    assert not unsettled({0: {**stuck, "phase": "forward"}, 1: stuck}, 30, 5.0)


def test_a_stopped_process_is_late_at_once_whatever_its_heartbeats_age(tmp_path):
    host = socket.gethostname()
    child = start([sys.executable, "-c", "import time; time.sleep(60)"], capture=False)
    try:
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while process_state(host, child.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.05)
        info = {"step": 4, "phase": "backward", "progress_age_s": 9.0, "collectives": 9, "mtime": 1000.0}
        info |= {"host": host, "pid": child.pid, "node": 0, "warmup": True}
        v = rank_view(info, 1001.0, 5.0)  # one second old: no beat missed yet
        assert (v["late"], v["state"], v["beat_age_s"]) == (True, "T", 1.0)
        limits = HangLimits(10, 1800)
        assert job_limit({0: view(phase="backward"), 1: v}, 0, limits) == (10, "hang_timeout")  # no warm-up grace
    finally:
        child.kill()
        child.wait()
    v = rank_view(info | {"pid": os.getpid()}, 1001.0, 5.0)
    assert (v["late"], v["state"] in ("R", "S")) == (False, True)  # a live process on this host


def test_process_state_sees_stopped_live_and_gone_processes():
    host = socket.gethostname()
    assert process_state(host, os.getpid()) in ("R", "S")
    assert process_state("another-host", os.getpid()) is None
    child = start([sys.executable, "-c", "import time; time.sleep(60)"], capture=False)
    try:
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while process_state(host, child.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process_state(host, child.pid) == "T"
    finally:
        child.kill()
        child.wait()
    assert process_state(host, child.pid) is None  # reaped: gone


def test_progress_counts_warm_up_steps_and_collectives():
    p = Progress()
    assert p.snapshot()["phase"] == "setup" and p.warmup
    for step in range(1, WARMUP_STEPS + 1):
        assert p.warmup
        p.set_step(step)
        p.set_step(step)  # the same step again does not count
    assert not p.warmup
    with p.phase("collective"):
        p.count_collective()
        snap = p.snapshot()
        assert (snap["phase"], snap["collectives"], snap["step"]) == ("collective", 1, WARMUP_STEPS)
    assert p.phase_name == "setup"


# ----------------------------------------------------------------------------- the launch's environment


def test_the_launch_keeps_the_flight_recorder_and_dumps_it_into_the_run_at_the_nccl_timeout(tmp_path):
    from taehv_launch.compat import flight_recorder_buffer_var, torch_version
    from taehv_launch.plan.resolve import resolve
    from taehv_launch.plan.topology import detect_topology
    from taehv_launch.run.render import render

    run = tmp_path / "run"
    env = render(resolve(8, "h100", detect_topology(8, {})), run, env={}, cpu_count=8).exported()
    prefix = str(run / "heartbeat" / "stacks" / "nccl_trace_rank_")  # as our own dumps: torchfrtrace reads both
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == prefix
    buffer = flight_recorder_buffer_var(torch_version())
    assert env[buffer] == "2000" and buffer == "TORCH_FR_BUFFER_SIZE"  # torch 2.13 here: the new name
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env  # the old one warns on every rank
    cpu = render(resolve(2, "cpu", detect_topology(2, {})), run, env={}, cpu_count=8).exported()
    assert cpu[buffer] == "2000" and "TORCH_NCCL_DUMP_ON_TIMEOUT" not in cpu  # gloo records too; no NCCL
    user = {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/mine/trace_", "TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}
    r = render(resolve(8, "h100", detect_topology(8, {})), run, env=user, cpu_count=8)
    assert "TORCH_FR_DUMP_TEMP_FILE" not in r.env and "TORCH_FR_BUFFER_SIZE" not in r.env  # theirs wins
    assert (
        r.env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"].kept
        and r.env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"].value == "/mine/trace_"
    )


def test_the_buffer_size_goes_under_the_name_the_installed_torch_reads():
    from taehv_launch.compat import flight_recorder_buffer_var

    assert flight_recorder_buffer_var((2, 13)) == flight_recorder_buffer_var((2, 11)) == "TORCH_FR_BUFFER_SIZE"
    assert flight_recorder_buffer_var((2, 6)) == flight_recorder_buffer_var(None) == "TORCH_NCCL_TRACE_BUFFER_SIZE"


GLOO_DUMP = textwrap.dedent("""
    import os, pickle, sys, torch, torch.distributed as dist
    from taehv_launch.compat import flight_recorder_dumps
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=0, world_size=1)
    before = flight_recorder_dumps()
    dist.all_reduce(torch.ones(3))
    after = flight_recorder_dumps()
    entry = pickle.loads(after["fr"])["entries"][-1]
    print(sorted(before), sorted(after), entry["profiling_name"], entry["input_sizes"])
    dist.destroy_process_group()
""")


@pytest.mark.slow
def test_a_gloo_process_groups_flight_recorder_dump_holds_its_collectives():
    from conftest import free_port

    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000"}
    proc = subprocess.run(
        [sys.executable, "-c", GLOO_DUMP, str(free_port())], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[] ['fr'] gloo:all_reduce [[3]]"  # nothing recorded: no file


GLOO_PAIR = textwrap.dedent("""
    import os, sys, time, torch, torch.distributed as dist
    from pathlib import Path
    from taehv_launch.train.durability.hang import dump_stacks
    run, port, rank = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    for _ in range(3):
        dist.all_reduce(torch.ones(3))
    if rank == 1:  # does not join the 4th: dumps, and leaves while rank 0 waits in it
        dump_stacks(run, 1, "rank 1")
        time.sleep(4)
    else:
        dist.all_reduce(torch.ones(3), async_op=True)
        time.sleep(1)
        dump_stacks(run, 0, "rank 0")
    print("dumped", flush=True)
    os._exit(0)
""")


@pytest.mark.slow
def test_torchs_analyser_reads_the_gloo_dumps_and_needs_a_flag_when_a_rank_left_none(tmp_path):
    """#35 item 13: `torchfrtrace <run>/heartbeat/stacks -p fr_trace_rank_` names the rank that did not
    join (torch records a gloo group nameless, and the analyser failed on it with a KeyError); with a
    rank's dump missing (a frozen rank) the plain command fails and --allow-incomplete-ranks runs."""
    from conftest import free_port

    env, port = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000", "OMP_NUM_THREADS": "1"}, str(free_port())
    procs = [start([sys.executable, "-c", GLOO_PAIR, str(tmp_path), port, str(r)], env=env) for r in (0, 1)]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and out == "dumped\n", err
    stacks, analyser = stacks_dir(tmp_path), [str(Path(sys.executable).parent / "torchfrtrace")]

    def analyse(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*analyser, str(stacks), "-p", "fr_trace_rank_", *flags], capture_output=True, text=True, timeout=120
        )

    both = analyse()
    assert both.returncode == 0, both.stderr
    text = both.stdout + both.stderr
    assert "Not all ranks joining collective, sequence number: 4" in text and "missing ranks: {1}" in text, text
    (stacks / "fr_trace_rank_1").unlink()  # rank 1 frozen: no dump
    plain = analyse()
    assert plain.returncode != 0 and "Missing dump files from ranks {1}" in plain.stderr
    partial = analyse("--allow-incomplete-ranks")
    assert partial.returncode == 0, partial.stderr
    assert "we missed FR dumps from ranks ({1})" in partial.stdout + partial.stderr


# ----------------------------------------------------------------------------- the watchdog, real threads


class Hangs:
    """An on_hang that records (report, decided) instead of ending the process."""

    def __init__(self):
        self.calls: list[tuple[dict, bool]] = []
        self.event = threading.Event()

    def __call__(self, report: dict, decided: bool) -> None:
        self.calls.append((report, decided))
        self.event.set()


def stuck(step: int, phase: str, collectives: int) -> Progress:
    p = Progress()
    for s in range(1, step + 1):
        p.set_step(s)
    p.set_phase(phase)
    p.collectives = collectives
    return p


def hang_dog(tmp_path, rank, world, progress, on_hang, on_dead=None, **kw):
    kw = {"period_s": 0.1, "stale_s": 30.0, "hang_timeout": 1.0, "hang_timeout_slow": 1.0, **kw}
    return Watchdog(tmp_path, rank, world, 0, on_dead or (lambda why: None), on_hang=on_hang, progress=progress, **kw)


def test_two_stuck_ranks_both_dump_their_stacks_and_name_the_one_behind(tmp_path):
    h0, h1 = Hangs(), Hangs()
    t0 = time.monotonic()
    w0 = hang_dog(tmp_path, 0, 2, stuck(5, "collective", 9), h0).start()
    w1 = hang_dog(tmp_path, 1, 2, stuck(5, "collective", 8), h1).start()  # has not issued the 9th
    try:
        assert h0.event.wait(30) and h1.event.wait(30)
        assert time.monotonic() - t0 >= 1.0  # not before hang_timeout
        (r0, d0), (r1, d1) = h0.calls[0], h1.calls[0]
        assert d0 or d1
        for report in (r0, r1):
            assert report["culprits"] == [1] and report["why"] == "behind"
            assert report["line"].startswith("job hung: rank 1 stuck in collective at step 5, no progress for ")
            assert "waiting: rank 0 (collective, step 5)" in report["line"]
        for rank in (0, 1):
            text = stack_path(tmp_path, rank).read_text()
            assert text.startswith(f"rank {rank} of 2 (node 0, host {socket.gethostname()}, pid {os.getpid()}): step 5")
            assert "hang reported by rank" in text and "Thread 0x" in text and "taehv-watchdog" in text
        first = min(read_hang_reports(tmp_path))
        final = read_hang_reports(tmp_path)[first]
        assert {"rank0.txt", "rank1.txt"} <= set(final["dumps"]) and final["missing"] == []
        assert w0.wait_if_hanging(timeout_s=5) and w0.hanging.is_set()
    finally:
        w0.stop(clean=False)
        w1.stop(clean=False)


@pytest.mark.slow
def test_a_rank_in_a_slow_phase_holds_the_report_off_until_the_slow_limit(tmp_path):
    h0 = Hangs()
    t0 = time.monotonic()
    w0 = hang_dog(tmp_path, 0, 2, stuck(5, "collective", 9), h0, hang_timeout=0.5, hang_timeout_slow=4.0).start()
    w1 = hang_dog(tmp_path, 1, 2, stuck(5, "checkpoint", 9), Hangs(), hang_timeout=0.5, hang_timeout_slow=4.0).start()
    try:
        assert h0.event.wait(60)
        assert time.monotonic() - t0 >= 4.0
        report = h0.calls[0][0]
        assert report["culprits"] == [1] and report["why"] == "outside" and report["limit_s"] == 4.0
        assert "rank 1 stuck in checkpoint at step 5" in report["line"] and "(hang_timeout_slow 4 s)" in report["line"]
    finally:
        w0.stop(clean=False)
        w1.stop(clean=False)


@pytest.mark.slow
def test_progress_keeps_the_detector_quiet(tmp_path):
    h0, busy = Hangs(), stuck(5, "forward", 9)
    w0 = hang_dog(tmp_path, 0, 1, busy, h0, hang_timeout=0.6, hang_timeout_slow=0.6).start()
    try:
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            busy.set_phase("backward" if busy.phase_name == "forward" else "forward")
            time.sleep(0.05)
        assert h0.calls == []
        assert h0.event.wait(30)  # and once it stops: one rank alone is reported too
        assert h0.calls[0][0]["line"].startswith("job hung: rank 0 stuck in forward at step 5")
    finally:
        w0.stop(clean=False)


FROZEN_PEER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from taehv_launch.train.durability.progress import Progress
    from taehv_launch.train.durability.watchdog import Watchdog
    p = Progress()
    for s in (1, 2, 3, 4):
        p.set_step(s)
    p.set_phase("forward")
    Watchdog(Path(sys.argv[1]), 1, 2, 0, lambda why: None, period_s=0.1, stale_s=30.0, hang_timeout=600.0,
             on_hang=lambda r, d: None, progress=p).start()
    print("beating", flush=True)
    time.sleep(120)
""")


@pytest.mark.slow
def test_a_stopped_peer_on_this_host_is_reported_as_hung_not_dead(tmp_path):
    """SIGSTOP freezes the peer's heartbeat too: past stale_s it is still no dead peer (its process
    exists here), and the hang report names it with its last phase and step and its process state."""
    peer = start([sys.executable, "-c", FROZEN_PEER, str(tmp_path)], stderr=None)  # stdout: a pipe
    deads, h0 = [], Hangs()
    try:
        assert peer.stdout.readline() == "beating\n"
        time.sleep(0.3)
        os.kill(peer.pid, signal.SIGSTOP)
        w0 = hang_dog(tmp_path, 0, 2, stuck(4, "backward", 9), h0, on_dead=deads.append, stale_s=0.5, hang_timeout=2.0)
        w0.start()
        assert h0.event.wait(30)
        report, decided = h0.calls[0]
        assert decided and report["culprits"] == [1] and report["why"] == "late"
        assert report["ranks"]["1"]["state"] == "T" and deads == []  # stale for seconds, not dead
        assert report["line"].startswith("job hung: rank 1 stuck in forward at step 4, no progress for ")
        assert "its process is stopped (SIGSTOP or job control); waiting: rank 0 (backward, step 4)" in report["line"]
        assert report["missing"] == [] and report["dumps"] == ["rank0.txt"]  # a frozen rank cannot dump
        w0.stop(clean=False)
    finally:
        peer.kill()
        peer.wait()
    assert w0._problem(1, w0._fs_now() + 60).startswith("rank 1 (node 0")  # its process gone: dead


def test_a_silent_peer_elsewhere_is_named_once_late_even_when_the_limit_is_shorter(tmp_path):
    """A peer on another host (no process state) stops beating 0.7 s into a backward of the step rank 0
    waits in, with hang_timeout (1 s) under LATE_PERIODS periods (3 x 0.5 s): when the limit passes its
    heartbeat is young (not late, not even a beat missed). The report waits until it is late and names
    it, instead of naming every rank at the limit."""
    h0, busy = Hangs(), stuck(5, "backward", 9)
    busy.since -= 0.7
    w0 = hang_dog(tmp_path, 0, 2, busy, h0, period_s=0.5, hang_timeout=1.0, hang_timeout_slow=1.0).start()
    peer = {"rank": 1, "node": 1, "host": "another-host", "pid": 4242, "step": 5, "phase": "backward"}
    peer |= {"progress_age_s": 0.7, "collectives": 9, "warmup": False}
    (tmp_path / "heartbeat" / "rank1").write_text(json.dumps(peer))
    silent_since = time.time()
    try:
        assert h0.event.wait(30)
        report, decided = h0.calls[0]
        assert decided and report["culprits"] == [1] and report["why"] == "late", report["line"]
        assert time.time() - silent_since >= 1.5  # once late, not at the limit
        assert report["line"].startswith("job hung: rank 1 stuck in backward at step 5, no progress for ")
        assert "its process is gone or on another node; waiting: rank 0 (backward, step 5)" in report["line"]
    finally:
        w0.stop(clean=False)


END_SCRIPT = textwrap.dedent("""
    import atexit, sys
    from pathlib import Path
    from taehv_launch.train.durability.hang import end_hung_job
    atexit.register(lambda: print("atexit ran", flush=True))
    try:
        end_hung_job(Path(sys.argv[1]), 3)({"line": "job hung: rank 1 stuck in data", "missing": [1]}, True)
    finally:
        print("finally ran", flush=True)
""")


@pytest.mark.parametrize("local_rank", ["0", "1"])
def test_every_rank_that_ends_a_hung_job_records_exit_76_for_its_node(tmp_path, local_rank):
    env = {**os.environ, "LOCAL_RANK": local_rank, "GROUP_RANK": "2"}
    proc = subprocess.run(
        [sys.executable, "-c", END_SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode == EXIT_HUNG == 76
    assert proc.stdout == ""  # os._exit: no finally, no atexit
    assert proc.stderr == "[rank 3] error: job hung: rank 1 stuck in data (no stack dump from rank 1)\n"
    assert json.loads((tmp_path / "exit_status.node2.json").read_text()) == {
        "code": 76,
        "message": "job hung: rank 1 stuck in data",
    }


@pytest.mark.parametrize(
    "spec,rank,where,point",
    [
        ("1:3:collective", "1", "collective", (1, 3)),
        ("1:3:collective", "0", "collective", None),
        ("1:3:collective", "1", "data", None),
        ("0:2:data", "0", "data", (0, 2)),
        ("", "0", "data", None),
        ("x:3:data", "0", "data", None),
        ("0:3", "0", "data", None),
    ],
)
def test_the_test_hook_fires_only_where_and_on_the_rank_it_names(monkeypatch, spec, rank, where, point):
    from taehv_launch.train.faults import hang_point

    monkeypatch.setenv("TAEHV_LAUNCH_TEST_HANG", spec)
    monkeypatch.setenv("RANK", rank)
    assert hang_point(where) == point


# ----------------------------------------------------------------------------- the real launcher, 2 CPU ranks

HANG_TIMEOUT = 20
MARGIN = 75  # detection (one heartbeat period), every rank's dump, the launcher's grace: on a loaded 2-core box


class HangRun:
    """`taehv-launch 2 cpu` as users run it (the cpu profile's DataLoader worker per rank), hang_timeout
    20 s, no validation or checkpoint during the run (slow phases), output into files."""

    def __init__(self, tmp: Path, name: str, hang_timeout: int = HANG_TIMEOUT, sets: tuple[str, ...] = (), **env: str):
        from conftest import overrides
        from trainrun import start_launch, trainer_env

        self.run = tmp / "output" / name
        self.out, self.err = tmp / f"{name}.out", tmp / f"{name}.err"
        settings = overrides(
            "log_every=1 max_train_steps=10000 validation_steps=100000 checkpointing_steps=100000",
            f"hang_timeout={hang_timeout}",
            "max_restarts=0",  # the hang's exit 76 is what is checked here; restarts: test_restart.py
            *sets,
        )
        environ = trainer_env(tmp, **env)
        self.proc = start_launch(
            tmp,
            2,
            *settings,
            run_name=name,
            fast=False,
            env=environ,
            out=self.out,
            err=self.err,
            start_new_session=True,
        )

    def text(self) -> str:
        return self.proc.text()

    def wait_for(self, what: str, timeout: float = 300) -> float:
        """Until the launcher's output shows `what`; returns when (time.monotonic())."""
        return self.proc.wait_for(what, timeout=timeout)

    def finish(self, timeout: float) -> int:
        return self.proc.finish(timeout)

    def ranks(self) -> dict[int, int]:
        """rank -> pid of the trainer's rank processes (not their DataLoader workers, forked from them)."""
        import psutil

        out = {}
        for p in psutil.Process(self.proc.pid).children(recursive=True):
            try:  # torchrun gives the ranks RANK; their workers inherit it from them
                if "RANK" in p.environ() and "RANK" not in p.parent().environ():
                    out[int(p.environ()["RANK"])] = p.pid
            except psutil.Error:
                continue
        return out

    def kill(self) -> None:
        self.proc.kill_tree()


def one_error_line(run: HangRun) -> str:
    err = [line for line in run.err.read_text().splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: job hung: "), run.text()
    assert "Traceback" not in run.out.read_text() + run.err.read_text()
    return err[0]


@pytest.mark.slow
def test_a_rank_frozen_with_sigstop_is_reported_hung_and_the_job_stops(tmp_path):
    import psutil

    run = HangRun(tmp_path, "frozen")
    try:
        run.wait_for("step 4/")
        ranks = run.ranks()
        assert sorted(ranks) == [0, 1], ranks
        os.kill(ranks[1], signal.SIGSTOP)
        t0 = time.monotonic()
        code = run.finish(timeout=HANG_TIMEOUT + MARGIN + 60)
        elapsed = time.monotonic() - t0
    finally:
        run.kill()
    assert code == EXIT_HUNG, run.text()
    assert HANG_TIMEOUT - 2 <= elapsed < HANG_TIMEOUT + MARGIN, elapsed
    line = one_error_line(run)
    stacks = stacks_dir(run.run)
    assert re.match(
        r"error: job hung: rank 1 stuck in \w+ at step \d+, no progress for \d+ s \(hang_timeout 20 s\); ", line
    )
    assert "not responding since its last heartbeat " in line and "its process is stopped (SIGSTOP" in line
    assert re.search(r"; waiting: rank 0 \(\w+, step \d+\); ", line) and f"stack dumps: {stacks};" in line
    assert "taehv-launch: trainer exited with code 76" in run.out.read_text()
    assert (stack_path(run.run, 0)).read_text().count("train/loop/") >= 1  # rank 0's main thread, in the loop
    assert not stack_path(run.run, 1).exists()  # frozen: it could not dump
    assert (stacks / "fr_trace_rank_0").stat().st_size > 0  # gloo's flight recorder
    report = read_hang_reports(run.run)
    assert list(report.values())[0]["culprits"] == [1]
    assert not psutil.pid_exists(ranks[1]) or psutil.Process(ranks[1]).status() == psutil.STATUS_ZOMBIE


@pytest.mark.slow
def test_a_rank_frozen_after_the_run_measured_its_steps_is_reported_within_the_derived_limit(tmp_path):
    """#39 item 4: hang_timeout 300 s (the default), short CPU steps (32x32 clips: the 23 steps before the
    limit is derived go fast): once the 20 steps after warm-up are measured, rank 0 prints the step limit
    derived from them (5 x their p99, at least 30 s), `status` shows it, and a rank SIGSTOPped then is
    reported within that limit, not 300 s."""
    from conftest import run_cli

    run = HangRun(tmp_path, "derived", hang_timeout=300, sets=("height=32", "width=32"))  # 23 steps: short ones
    try:
        run.wait_for("hang limits from this run's times: step ")
        derived = re.search(r"hang limits from this run's times: step (\d+) s \(measured p99 ", run.out.read_text())
        limit = int(derived.group(1))
        assert limit <= 300 / 5, run.text()  # much below the configured value
        status = run_cli("status", str(run.run), cwd=tmp_path, timeout=60)
        assert f"  hang limit step {limit} s (measured p99 " in status.stdout, status.stdout + status.stderr
        recorded = json.loads((run.run / "hang_limits.json").read_text())
        assert round(recorded["limits"]["step_s"]) == limit and recorded["configured"]["hang_timeout"] == 300
        os.kill(run.ranks()[1], signal.SIGSTOP)
        t0 = time.monotonic()
        code = run.finish(timeout=limit + MARGIN + 60)
        elapsed = time.monotonic() - t0
    finally:
        run.kill()
    assert code == EXIT_HUNG, run.text()
    assert limit - 2 <= elapsed < limit + MARGIN, (elapsed, limit)
    line = one_error_line(run)
    assert re.match(r"error: job hung: rank 1 stuck in \w+ at step \d+, no progress for \d+ s ", line), line
    assert f"(step limit {limit} s, from this run's step times); " in line
    assert "its process is stopped (SIGSTOP" in line


@pytest.mark.slow
def test_a_rank_sleeping_inside_a_collective_is_named_and_every_rank_dumps(tmp_path):
    import pickle

    run = HangRun(tmp_path, "hook", TAEHV_LAUNCH_TEST_HANG="1:4:collective")
    try:
        t0 = run.wait_for("TAEHV_LAUNCH_TEST_HANG: hanging in collective")
        code = run.finish(timeout=HANG_TIMEOUT + MARGIN + 60)
        elapsed = time.monotonic() - t0
    finally:
        run.kill()
    assert code == EXIT_HUNG, run.text()
    assert HANG_TIMEOUT - 2 <= elapsed < HANG_TIMEOUT + MARGIN, elapsed
    line = one_error_line(run)
    assert line.startswith("error: job hung: rank 1 stuck in collective at step 4, no progress for "), line
    assert "behind the others" in line and "waiting: rank 0 (collective, step 4)" in line
    stacks = stacks_dir(run.run)
    assert "in hang_if_hooked" in stack_path(run.run, 1).read_text()  # where rank 1 sleeps
    assert "in all_reduce" in stack_path(run.run, 0).read_text()  # where rank 0 waits for it
    for rank in (0, 1):
        entries = pickle.loads((stacks / f"fr_trace_rank_{rank}").read_bytes())["entries"]
        assert entries and all(e["profiling_name"].startswith("gloo:") for e in entries)
    report = list(read_hang_reports(run.run).values())[0]
    assert {"rank0.txt", "rank1.txt", "fr_trace_rank_0", "fr_trace_rank_1"} <= set(report["dumps"])
    status = json.loads((run.run / "exit_status.json").read_text())
    assert status.pop("launch_id")  # the launch's, inherited by the trainer (rundir/launchid.py)
    assert status.pop("attempt") == 0  # the launch's first attempt (restarts so far), inherited too
    assert status == {"code": 76, "message": line.removeprefix("error: ")}


@pytest.mark.slow
def test_at_the_smallest_hang_timeout_a_rank_frozen_in_backward_is_named(tmp_path):
    """#35 item 12: hang_timeout=10 (the floor), rank 1 SIGSTOPped while its heartbeat says backward,
    past warm-up: rank 0 then blocks in DDP's gradient all-reduce at the same step, phase and count.
    The limit passed before rank 1's heartbeat was 3 periods (15 s) old, and the report said "every
    rank is stuck"; it names rank 1, stopped."""
    run = HangRun(tmp_path, "floor", hang_timeout=10)
    try:
        run.wait_for("step 4/")
        pid, beat, seen = run.ranks()[1], run.run / "heartbeat" / "rank1", 0.0
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # a fresh beat in backward: the rank is in (or just past) it
            try:
                mtime, info = beat.stat().st_mtime, json.loads(beat.read_text())
            except (OSError, ValueError):
                mtime, info = seen, {}
            if mtime != seen and info.get("phase") == "backward" and info.get("warmup") is False:
                os.kill(pid, signal.SIGSTOP)
                break
            seen = mtime
            time.sleep(0.05)
        else:
            raise AssertionError(f"rank 1 never beat in backward past warm-up: {run.text()}")
        t0 = time.monotonic()
        code = run.finish(timeout=10 + MARGIN + 60)
        elapsed = time.monotonic() - t0
    finally:
        run.kill()
    assert code == EXIT_HUNG, run.text()
    assert 8 <= elapsed < 10 + MARGIN, elapsed
    line = one_error_line(run)
    assert re.match(
        r"error: job hung: rank 1 stuck in \w+ at step \d+, no progress for \d+ s \(hang_timeout 10 s\); ", line
    )
    assert "its process is stopped (SIGSTOP" in line and "every rank is stuck" not in line
    assert re.search(r"; waiting: rank 0 \(\w+, step \d+\); ", line)
    report = list(read_hang_reports(run.run).values())[0]
    assert report["culprits"] == [1] and report["why"] == "late" and report["ranks"]["1"]["state"] == "T"
