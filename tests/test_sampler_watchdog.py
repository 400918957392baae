"""The training sampler's resume arithmetic and the rank watchdog, on the real code.

ShardedInfiniteSampler: a run resumed with start=k draws exactly what the uninterrupted run
drew after its first k draws, epochs are fresh seeded permutations, and the ranks of one epoch
share its videos out. Watchdog: real threads, real heartbeat files and real time (periods of
tens of milliseconds); the one thing that ends the process, abort_job, runs in a child process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from itertools import islice
from pathlib import Path

import pytest
from torch.utils.data import DataLoader, Dataset

from taehv_launch.errors import EXIT_FAILED
from taehv_launch.train.loop.build import ShardedInfiniteSampler
from taehv_launch.train.durability.progress import Progress
from taehv_launch.train.durability.watchdog import Watchdog, pid_namespace, stop_message

SEED = 1234


def draws(n: int, rank: int, world: int, count: int, start: int = 0, seed: int = SEED) -> list[int]:
    return list(islice(iter(ShardedInfiniteSampler(n, rank, world, seed, start=start)), count))


def per_epoch(n: int, rank: int, world: int) -> int:
    """How many draws one epoch gives this rank (a rank with no index of its own still gets one)."""
    return max(1, len(range(rank, n, world)))


# ----------------------------------------------------------------------------- sampler

# (n, world, rank, start); per_epoch is noted where the start's place in the epoch matters.
RESUME_CASES = [
    (12, 4, 1, 0),  # no resume
    (12, 4, 3, 2),  # inside the first epoch (3 per epoch)
    (12, 4, 0, 3),  # exactly at an epoch boundary
    (12, 4, 2, 7),  # two epochs and one draw in
    (12, 1, 0, 36),  # one rank, exactly three epochs
    (10, 3, 0, 4),  # n not divisible by world: rank 0 has 4 per epoch, boundary
    (10, 3, 2, 5),  # rank 2 has 3 per epoch: inside the second epoch
    (10, 4, 3, 11),  # 2 per epoch: five epochs and one draw
    (3, 5, 1, 2),  # world > n, a rank that owns a video
    (3, 5, 4, 2),  # world > n, a rank that owns none (1 per epoch)
    (1, 1, 0, 5),  # a single video
    (7, 2, 1, 100),  # many epochs
]


@pytest.mark.parametrize("n,world,rank,start", RESUME_CASES)
def test_resume_equals_uninterrupted_run_with_first_k_draws_dropped(n, world, rank, start):
    count = 3 * n + 5  # well past several more epoch boundaries
    resumed = draws(n, rank, world, count, start=start)
    uninterrupted = list(islice(iter(ShardedInfiniteSampler(n, rank, world, SEED)), start, start + count))
    assert resumed == uninterrupted
    assert all(0 <= v % n < n for v in resumed)
    assert resumed[0] // n == start // per_epoch(n, rank, world)  # resumes in the right epoch


def test_resuming_again_and_again_reproduces_the_stream():
    n, world, rank = 11, 3, 2
    whole = draws(n, rank, world, 60)
    got, seen = [], 0
    for chunk in (1, 4, 3, 7, 2, 9, 4, 30):  # preempted after each chunk, resumed from samples_seen
        got += draws(n, rank, world, chunk, start=seen)
        seen += chunk
    assert got == whole


def test_resume_far_ahead_jumps_straight_to_its_epoch():
    n, world, rank = 10, 3, 1
    start = 10**12  # iterating up to here would never finish
    t0 = time.monotonic()
    got = draws(n, rank, world, 20, start=start)
    assert got == draws(n, rank, world, 27, start=start - 7)[7:]
    assert time.monotonic() - t0 < 2.0
    assert got[0] // n == start // per_epoch(n, rank, world)


def test_each_draw_is_epoch_times_n_plus_video():
    n = 9
    seq = draws(n, 0, 1, 5 * n)
    for e in range(5):
        epoch = seq[e * n : (e + 1) * n]
        assert {v // n for v in epoch} == {e}
        assert sorted(v % n for v in epoch) == list(range(n))  # world 1: each epoch is a permutation


@pytest.mark.parametrize("world", [1, 2, 3, 4, 6, 12])
def test_ranks_of_an_epoch_cover_each_video_exactly_once_when_world_divides_n(world):
    n, epochs = 12, 4
    k = n // world
    per_rank = [draws(n, r, world, epochs * k) for r in range(world)]
    for e in range(epochs):
        epoch = [v for seq in per_rank for v in seq[e * k : (e + 1) * k]]
        assert sorted(epoch) == list(range(e * n, (e + 1) * n))


def test_uneven_shards_cover_each_epoch_once_but_short_ranks_run_ahead():
    """n=10 over 4 ranks: ranks 0-1 take 3 videos an epoch, ranks 2-3 take 2. Grouped by epoch
    (draw // n) the ranks still cover every video exactly once, but the loop draws in lockstep,
    so after 3 draws each the short ranks have already started the next epoch."""
    n, world, epochs = 10, 4, 6
    assert [per_epoch(n, r, world) for r in range(world)] == [3, 3, 2, 2]
    per_rank = [draws(n, r, world, 3 * epochs) for r in range(world)]  # 6 epochs for ranks 0-1, 9 for 2-3
    for e in range(epochs):
        epoch = sorted(v for seq in per_rank for v in seq if v // n == e)
        assert epoch == list(range(e * n, (e + 1) * n))
    lockstep = Counter(v // n for seq in per_rank for v in seq[:3])
    assert lockstep == {0: 10, 1: 2}
    assert [seq[2] // n for seq in per_rank] == [0, 0, 1, 1]


def test_world_larger_than_n_gives_idle_ranks_the_epochs_first_video():
    """n=3 over 5 ranks: ranks 0-2 take one video each per epoch; ranks 3-4 own none and take
    perm[:1], the same video as rank 0, so that video is drawn three times each epoch."""
    n, world, epochs = 3, 5, 8
    per_rank = [draws(n, r, world, epochs) for r in range(world)]
    for e in range(epochs):
        drawn = [seq[e] for seq in per_rank]
        assert {v // n for v in drawn} == {e}
        assert sorted(set(drawn)) == list(range(e * n, (e + 1) * n))
        assert drawn[3] == drawn[4] == drawn[0]


def test_epochs_are_different_permutations():
    n, epochs = 40, 6
    seq = draws(n, 0, 1, epochs * n)
    perms = {tuple(v % n for v in seq[e * n : (e + 1) * n]) for e in range(epochs)}
    assert len(perms) == epochs
    shards = {tuple(v % n for v in draws(n, 2, 4, epochs * 10)[e * 10 : (e + 1) * 10]) for e in range(epochs)}
    assert len(shards) == epochs  # a rank's shard changes every epoch too


def test_same_seed_same_sequence_other_seed_other_sequence():
    a = ShardedInfiniteSampler(25, 1, 3, SEED)
    assert list(islice(iter(a), 100)) == list(islice(iter(a), 100))  # re-iterating restarts
    assert draws(25, 1, 3, 100) == draws(25, 1, 3, 100)  # a fresh sampler agrees
    assert draws(25, 1, 3, 100, seed=SEED + 1) != draws(25, 1, 3, 100)


def test_dataloader_batches_the_draws_in_order():
    class Index(Dataset):
        def __getitem__(self, i):
            return i

    sampler = ShardedInfiniteSampler(7, 1, 2, SEED, start=5)
    batches = list(islice(iter(DataLoader(Index(), batch_size=4, sampler=sampler, drop_last=True)), 3))
    assert [int(x) for b in batches for x in b] == draws(7, 1, 2, 12, start=5)


class VideoPaths(Dataset):
    """What the trainer's dataset does with a draw: read entry (i % n) of its index."""

    def __init__(self, entries):
        self.entries = entries

    def __getitem__(self, i):
        return self.entries[i % len(self.entries)].path


@pytest.mark.parametrize("world,rank,start", [(1, 0, 0), (1, 0, 5), (2, 1, 7), (3, 2, 13)])
def test_resume_reads_the_same_videos_with_the_flat_index(videos, tmp_path, world, rank, start):
    """The flat index (#27) behind the real sampler and forked workers: a run resumed at `start` reads the
    videos the uninterrupted run read from its start-th draw on, and the old list of VideoEntry agrees."""
    from taehv_launch.dataindex.flat import FlatIndex
    from taehv_launch.dataindex.index import VideoEntry, build_index, split_train_val

    train, _ = split_train_val(build_index(str(videos), "", str(tmp_path / "cache")), 0.2, 64, SEED)
    assert isinstance(train, FlatIndex) and train.rows is not None  # a split: a subset of the arrays
    old = [VideoEntry(e.path, e.frame_count) for e in train]

    def read(entries, begin: int, count: int) -> list[str]:
        sampler = ShardedInfiniteSampler(len(entries), rank, world, SEED, start=begin)
        loader = DataLoader(VideoPaths(entries), batch_size=2, sampler=sampler, num_workers=2, drop_last=True)
        return [p for batch in islice(iter(loader), count // 2) for p in batch]

    whole = read(train, 0, 40)
    assert whole == read(old, 0, 40)
    assert read(train, start, 40 - start - start % 2) == whole[start : 40 - start % 2]


# ----------------------------------------------------------------------------- watchdog

PERIOD, STALE = 0.05, 0.4


class Calls:
    """An on_dead that records what it was told, and when."""

    def __init__(self):
        self.reasons: list[str] = []
        self.times: list[float] = []
        self.event = threading.Event()

    def __call__(self, why: str) -> None:
        self.reasons.append(why)
        self.times.append(time.monotonic())
        self.event.set()


def dog(tmp_path: Path, rank: int, world: int = 2, node: int = 0, on_dead=None, **kw) -> Watchdog:
    kw.setdefault("period_s", PERIOD)
    kw.setdefault("stale_s", STALE)
    return Watchdog(tmp_path, rank, world, node, on_dead if on_dead is not None else Calls(), **kw)


def test_single_rank_watchdog_does_nothing(tmp_path):
    calls = Calls()
    w = dog(tmp_path, 0, world=1, on_dead=calls).start()
    assert not (tmp_path / "heartbeat").exists() and not w._thread.is_alive()
    t0 = time.monotonic()
    assert w.find_dead_peer(timeout_s=30) is None
    assert time.monotonic() - t0 < 0.5
    w.mark_dead("boom")
    w.stop(clean=True)
    assert list(tmp_path.iterdir()) == [] and calls.reasons == []


def test_start_writes_a_heartbeat_and_clears_this_ranks_old_markers(tmp_path):
    hb = tmp_path / "heartbeat"
    hb.mkdir()
    for name in ("rank1.dead", "rank1.done", "rank1.hang"):
        (hb / name).write_text("from an earlier launch")
    (hb / "rank0.done").write_text("a peer's marker stays")
    progress = Progress()
    progress.set_step(7)
    progress.set_phase("data")
    w = dog(tmp_path, 1, node=3, progress=progress).start()
    try:
        assert not any((hb / f"rank1{s}").exists() for s in (".dead", ".done", ".hang"))
        assert (hb / "rank0.done").exists()
        info = json.loads((hb / "rank1").read_text())
        assert abs(info.pop("time") - time.time()) < 30 and 0 <= info.pop("progress_age_s") < 30
        assert info.pop("times") == progress.times()  # what this rank measured, for the hang limits
        assert info.pop("pidns") == pid_namespace()  # where its pid can be looked up (#39 review)
        assert info == {
            "rank": 1,
            "node": 3,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "step": 7,
            "phase": "data",
            "collectives": 0,
            "warmup": True,
        }
    finally:
        w.stop(clean=False)


def test_heartbeat_stays_fresh_until_stopped(tmp_path):
    w = dog(tmp_path, 0).start()
    beat = tmp_path / "heartbeat" / "rank0"
    first = beat.stat().st_mtime_ns
    deadline = time.monotonic() + 2.0
    while beat.stat().st_mtime_ns == first and time.monotonic() < deadline:
        time.sleep(0.01)
    assert beat.stat().st_mtime_ns > first  # the thread beat again
    w.stop(clean=False)
    w._thread.join(timeout=1.0)
    assert not w._thread.is_alive()
    last = beat.stat().st_mtime_ns
    time.sleep(4 * PERIOD)
    assert beat.stat().st_mtime_ns == last  # and no more after stop
    assert not (tmp_path / "heartbeat" / "rank0.done").exists()  # not clean: no .done


def test_live_peers_never_fire(tmp_path):
    a, b = Calls(), Calls()  # stale_s 1 s: some slack for a busy machine, still 20 periods
    w0, w1 = dog(tmp_path, 0, on_dead=a, stale_s=1.0).start(), dog(tmp_path, 1, on_dead=b, stale_s=1.0).start()
    try:
        time.sleep(1.6)  # past the stale limit, ~30 checks each
        assert a.reasons == [] and b.reasons == []
        assert w0._thread.is_alive() and w1._thread.is_alive()
        assert w0.find_dead_peer(timeout_s=0) is None
    finally:
        w0.stop(clean=True)
        w1.stop(clean=True)


def test_fires_once_when_a_peer_stops_beating(tmp_path):
    calls = Calls()
    w0 = dog(tmp_path, 0, on_dead=calls).start()
    w1 = dog(tmp_path, 1, node=5).start()
    try:
        time.sleep(2 * PERIOD)
        w1.stop(clean=False)  # killed or hung: no more beats, no .done
        t_stop = time.monotonic()
        assert calls.event.wait(timeout=STALE + 2.0), "the watchdog never noticed the silent peer"
        waited = calls.times[0] - t_stop
        assert STALE - PERIOD - 0.05 <= waited < STALE + 1.5  # not before its heartbeat is stale
        why = calls.reasons[0]
        assert why.startswith(f"rank 1 (node 5, host {socket.gethostname()}, pid {os.getpid()}) stopped responding ")
        assert why.endswith(" s ago (killed, out of memory, or hung)")
        w0._thread.join(timeout=1.0)
        assert not w0._thread.is_alive()  # it reports once, then stops watching
        time.sleep(2 * PERIOD)
        assert len(calls.reasons) == 1
    finally:
        w0.stop(clean=False)


def test_a_peers_dead_marker_fires_at_once_with_its_reason(tmp_path):
    calls = Calls()
    w0 = dog(tmp_path, 0, on_dead=calls, stale_s=30.0).start()
    w1 = dog(tmp_path, 1, stale_s=30.0).start()
    try:
        w1.mark_dead("RuntimeError: CUDA out of memory\n")
        assert calls.event.wait(timeout=2.0)  # long before the 30 s staleness limit
        assert calls.reasons == ["rank 1 failed: RuntimeError: CUDA out of memory"]
    finally:
        w0.stop(clean=False)
        w1.stop(clean=False)


def test_a_peer_that_finished_cleanly_is_not_reported(tmp_path):
    calls = Calls()
    w0 = dog(tmp_path, 0, on_dead=calls).start()
    w1 = dog(tmp_path, 1).start()
    try:
        w1.stop(clean=True)
        assert (tmp_path / "heartbeat" / "rank1.done").read_text() == "ok"
        time.sleep(STALE + 6 * PERIOD)  # its heartbeat is stale by now
        assert calls.reasons == [] and w0._thread.is_alive()
        assert w0.find_dead_peer(timeout_s=0) is None
    finally:
        w0.stop(clean=True)


def test_leftovers_from_an_earlier_launch_are_ignored(tmp_path):
    hb = tmp_path / "heartbeat"
    hb.mkdir()
    (hb / "rank1").write_text(json.dumps({"rank": 1, "node": 0, "host": "old", "pid": 1}))
    (hb / "rank1.dead").write_text("died last week")
    old = time.time() - 3600
    for name in ("rank1", "rank1.dead"):
        os.utime(hb / name, (old, old))
    calls = Calls()
    w0 = dog(tmp_path, 0, on_dead=calls).start()
    try:
        time.sleep(STALE + 6 * PERIOD)
        assert calls.reasons == []  # an hour-old heartbeat: not this launch's peer
        assert w0.find_dead_peer(timeout_s=0) is None
    finally:
        w0.stop(clean=False)


def test_ages_are_measured_on_the_filesystems_clock_not_this_nodes(tmp_path):
    """A shared filesystem whose clock is 2 minutes behind this node (NFS stamps writes with the
    server's time): fresh peers are not reported, and a peer 60 s behind our own heartbeat is."""
    w0, w1 = dog(tmp_path, 0, stale_s=30.0), dog(tmp_path, 1, stale_s=30.0)
    w0.dir.mkdir(parents=True)
    w0._beat()
    w1._beat()
    fs_now = time.time() - 120
    os.utime(w0._path(0), (fs_now, fs_now))
    os.utime(w1._path(1), (fs_now - 2, fs_now - 2))
    w0.started = fs_now - 5
    assert w0._any_problem() is None  # 2 s old on the filesystem's clock (122 s on ours)
    os.utime(w1._path(1), (fs_now - 60, fs_now - 60))
    w0.started = fs_now - 90
    assert "stopped responding 60 s ago" in (w0._any_problem() or "")


def test_find_dead_peer_waits_for_a_peer_to_say_it_died(tmp_path):
    w0 = dog(tmp_path, 0, stale_s=30.0)  # not started: the loop's caller asks by itself
    w0.dir.mkdir(parents=True)
    w1 = dog(tmp_path, 1, stale_s=30.0).start()
    try:
        t0 = time.monotonic()
        assert w0.find_dead_peer(timeout_s=0) is None  # no problem now, no wait
        assert time.monotonic() - t0 < 0.5
        threading.Timer(0.3, w1.mark_dead, ["ValueError: " + "x" * 1000]).start()
        why = w0.find_dead_peer(timeout_s=5.0)
        assert why == "rank 1 failed: ValueError: " + "x" * (300 - len("ValueError: "))  # cut at 300
        assert time.monotonic() - t0 < 3.0  # polls once a second
    finally:
        w1.stop(clean=False)


def test_stop_is_clean_and_immediate_even_with_a_long_period(tmp_path):
    w = dog(tmp_path, 0, period_s=5.0, stale_s=30.0).start()
    t0 = time.monotonic()
    w.stop(clean=True)
    w._thread.join(timeout=2.0)
    assert not w._thread.is_alive() and time.monotonic() - t0 < 1.0
    assert (tmp_path / "heartbeat" / "rank0.done").read_text() == "ok"
    w.stop(clean=True)  # stopping twice is harmless
    assert sorted(p.name for p in (tmp_path / "heartbeat").iterdir()) == ["rank0", "rank0.done"]


def test_stop_message():
    assert (
        stop_message("rank 2 failed: boom")
        == "stopping the job: rank 2 failed: boom; resume with --resume auto once the cause is fixed"
    )


ABORT_SCRIPT = textwrap.dedent("""
    import atexit, sys
    from taehv_launch.train.durability.watchdog import abort_job
    status = sys.argv[1]
    def write_status(code, msg):
        with open(status, "w") as f:
            f.write(f"{code}\\t{msg}")
    atexit.register(lambda: print("atexit ran", flush=True))
    try:
        abort_job(write_status, 3)("rank 1 failed: boom")
        print("returned", flush=True)
    finally:
        print("finally ran", flush=True)
""")


def test_abort_job_records_why_and_exits_without_cleanup(tmp_path):
    status = tmp_path / "status"
    proc = subprocess.run([sys.executable, "-c", ABORT_SCRIPT, str(status)], capture_output=True, text=True, timeout=30)
    msg = stop_message("rank 1 failed: boom")
    assert proc.returncode == EXIT_FAILED, proc.stderr
    assert proc.stderr == f"[rank 3] error: {msg}\n"
    assert proc.stdout == ""  # os._exit: no finally, no atexit
    assert status.read_text() == f"{EXIT_FAILED}\t{msg}"


HUNG_RANK_SCRIPT = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from taehv_launch.train.durability.watchdog import Watchdog, abort_job
    run = Path(sys.argv[1])
    def write_status(code, msg):
        (run / "status").write_text(f"{code}\\t{msg}")
    dog = Watchdog(run, 0, 2, 0, abort_job(write_status, 0), period_s=0.05, stale_s=0.4).start()
    # the peer beat once, then went silent (SIGKILLed on another node)
    (run / "heartbeat" / "rank1").write_text(json.dumps({"rank": 1, "node": 1, "host": "peer", "pid": 4242}))
    print("waiting", flush=True)
    time.sleep(60)                                       # stands for a collective that never returns
    print("woke up", flush=True)
""")


def test_a_rank_waiting_on_a_dead_peer_exits_within_the_stale_limit(tmp_path):
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", HUNG_RANK_SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=30
    )
    elapsed = time.monotonic() - t0
    assert proc.returncode == EXIT_FAILED, proc.stderr
    assert elapsed < 10.0  # not the 60 s sleep
    assert proc.stdout == "waiting\n"
    assert proc.stderr.startswith(
        "[rank 0] error: stopping the job: rank 1 (node 1, host peer, pid 4242) stopped responding "
    ), proc.stderr
    code, msg = (tmp_path / "status").read_text().split("\t")
    assert int(code) == EXIT_FAILED and msg.startswith("stopping the job: rank 1 (node 1, host peer, pid 4242)")
    assert msg.endswith("; resume with --resume auto once the cause is fixed")
