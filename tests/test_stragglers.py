"""Straggler report (#25): per-rank busy, forward, data-wait times gathered at each log line; the rank the
others wait for is named with its host. Fast: the arithmetic and the clock; slow: 2 CPU ranks through the
launcher, rank 1 slowed by TAEHV_LAUNCH_TEST_SLOW."""

from __future__ import annotations

import socket
import time

import pytest
import torch

from conftest import clean_env, overrides
from trainrun import launch, ok, scalars
from taehv_launch.train import faults
from taehv_launch.train.loop.stragglers import StepClock, Stragglers, find_stragglers, gather_window

CPU = torch.device("cpu")


def test_the_slow_rank_is_named_against_the_median_of_the_others():
    # (busy, forward, data, wait) per step
    ranks = [(1.0, 0.5, 0.0, 0.3), (1.0, 0.5, 0.0, 0.3), (1.5, 0.6, 0.4, 0.0), (1.05, 0.5, 0.0, 0.25)]
    slow, worst, top = find_stragglers(ranks, 0.2)
    assert [r for r, _ in slow] == [2] and top == 2 and worst == pytest.approx(1.5 / 1.0)
    assert find_stragglers(ranks, 0.6)[0] == []  # under the threshold: no line, the ratio still comes back
    assert find_stragglers(ranks, 0.0)[0] == []  # 0: off


def test_two_ranks_compare_with_each_other_not_with_their_mean():
    slow, worst, top = find_stragglers([(1.0, 0.5, 0, 0), (1.3, 0.5, 0, 0)], 0.2)
    assert slow == [(1, pytest.approx(1.3))] and top == 1


def test_forward_time_counts_on_gpus_only():
    ranks = [(1.0, 0.5, 0, 0), (1.0, 0.8, 0, 0)]  # same busy time, slower forward (a slow GPU under DDP)
    assert [r for r, _ in find_stragglers(ranks, 0.2, forward=True)[0]] == [1]
    assert find_stragglers(ranks, 0.2, forward=False)[0] == []


def test_zero_times_do_not_divide():
    assert find_stragglers([(0.0, 0.0, 0, 0), (0.0, 0.0, 0, 0)], 0.2) == ([], 1.0, 0)


def test_clock_on_cpu_splits_busy_forward_data_and_wait():
    clock = StepClock(CPU, enabled=True, rank=0)
    it = iter(range(10))
    for _ in range(2):  # two micro-batches = two steps
        clock.fetch(_Slow(it, 0.05))
        clock.forward()
        time.sleep(0.05)  # forward
        clock.wait_begin()
        time.sleep(0.1)  # waiting for the other ranks
        clock.wait_end()
    with clock.outside():
        time.sleep(0.2)  # a checkpoint: not this window's busy time
    busy, forward, data, wait = clock.take(2)
    assert 0.045 <= data < 0.2 and 0.045 <= forward < 0.2 and 0.095 <= wait < 0.3
    assert 0.095 <= busy < 0.4  # data + forward, not the wait nor the checkpoint
    assert clock.data_s == clock.wait_s == clock.outside_s == 0.0  # the next window starts


class _Slow:
    def __init__(self, it, secs):
        self.it, self.secs = it, secs

    def __next__(self):
        time.sleep(self.secs)
        return next(self.it)


def test_the_slow_hook_sleeps_on_its_rank_only(monkeypatch):
    monkeypatch.setenv(faults.SLOW_ENV, "1:0.25")
    assert StepClock(CPU, True, 1).slow == 0.25 and StepClock(CPU, True, 0).slow == 0.0
    monkeypatch.setenv(faults.SLOW_ENV, "junk")
    assert StepClock(CPU, True, 1).slow == 0.0


def test_gather_on_one_rank_is_the_identity():
    means, ranks = gather_window({"loss": 2.0, "psnr": 20.0}, (1.0, 0.5, 0.1, 0.0), 0, 1, CPU)
    assert means == {"loss": 2.0, "psnr": 20.0} and ranks == [(1.0, 0.5, 0.1, 0.0)]


def test_report_skips_the_first_window_then_says_one_line_per_slow_rank():
    lines, tb = [], []
    s = Stragglers(0.2, 0, 3, lines.append, lambda k, v, step: tb.append((k, v, step)), CPU)
    s.hosts = ["a", "b", "c"]
    ranks = [(1.0, 0.5, 0.0, 0.5), (2.0, 0.6, 0.9, 0.0), (1.0, 0.5, 0.0, 0.5)]
    assert s.report(ranks, 1) == [] and lines == [] and tb == []  # start-up window
    s.restart(10)
    assert s.report(ranks, 20) == [] and lines == []  # the first window after (say) a rollback
    assert s.report(ranks, 20) == [1]
    assert lines == [
        "straggler at step 20: rank 1 on b is 100% slower than the other ranks' median (busy 2.000 s/step vs "
        "1.000, forward 0.600 vs 0.500, data wait 0.900 vs 0.000): the other ranks wait for it; check its data "
        "loading"
    ]
    assert ("train/straggler_ratio", 2.0, 20) in tb and ("train/straggler_rank", 1, 20) in tb
    assert ("train/data_wait_max_s", 0.9, 20) in tb
    assert Stragglers(0.2, 0, 1, lines.append, None, CPU).report([(1.0, 0, 0, 0)], 5) == []  # one rank: nothing


@pytest.mark.slow
def test_a_slowed_rank_is_named_with_its_host(tmp_path):
    env = clean_env(TAEHV_CACHE=str(tmp_path.parent / "taehv-cache"), OMP_NUM_THREADS="1", **{faults.SLOW_ENV: "1:3"})
    proc, run = launch(
        tmp_path,
        2,
        *overrides("max_train_steps=5 validation_steps=100 checkpointing_steps=100 dataloader_num_workers=1"),
        env=env,
    )
    ok(proc)
    host = socket.gethostname()
    named = [line for line in proc.stdout.splitlines() if line.startswith("straggler at step")]
    assert len(named) >= 2, proc.stdout[-3000:]  # steps 3-5 (1: start-up, 2: DDP rebuilds its buckets)
    assert all(f"rank 1 on {host} is" in line for line in named), named
    tb = scalars(run)
    assert [s for s, _ in tb["train/straggler_ratio"]] == [3, 4, 5]
    assert all(v > 1.2 for _, v in tb["train/straggler_ratio"]), tb["train/straggler_ratio"]
    assert {v for _, v in tb["train/straggler_rank"]} == {1.0}
