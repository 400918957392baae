"""The progress line's `mem`: the GPU's peak since the previous log line, whatever else resets torch's counter.

Before, the line read torch's peak counter, which speed.json's steady window resets once (at step 10):
the step-10 line showed 1-2 GiB between lines of 52 GiB. With a CUDA device the last test checks
torch's own counter; without one, a counter that behaves like torch's stands in (same calls)."""

from __future__ import annotations

import pytest
import torch

from taehv_launch.train.loop.timing import PeakMemory, peak_memory

GiB = 2**30


class Counter:
    """torch.cuda's allocated-memory counters: current, and the peak since the last reset."""

    def __init__(self) -> None:
        self.now = self.peak = 0

    def alloc(self, n: int) -> None:
        self.now += n
        self.peak = max(self.peak, self.now)

    def free(self, n: int) -> None:
        self.now -= n

    def read(self) -> tuple[int, int]:
        return self.peak, self.peak + GiB  # (allocated, reserved)

    def reset(self) -> None:
        self.peak = self.now


def a_step(c: Counter, activations: int = 50 * GiB) -> None:
    c.alloc(activations)
    c.free(activations)


def test_each_log_line_reports_the_peak_of_its_interval_across_the_window_reset():
    c = Counter()
    c.alloc(2 * GiB)  # weights and optimizer state stay allocated
    mem = PeakMemory(torch.device("cpu"), read=c.read, reset=c.reset)
    lines = []
    for step in range(1, 21):
        a_step(c, 50 * GiB if step < 15 else 30 * GiB)
        if step == 10:  # SpeedLog's steady window starts, right before the log line
            mem.start_window()
        if step % 5 == 0:
            lines.append(mem.interval_gib())
    assert lines == [52.0, 52.0, 52.0, 32.0]  # was [52, 2, 52, 52] before: the window's reset at step 10
    assert mem.window_gib() == (52.0, 53.0)  # steps 11-20: speed.json's peaks (allocated, reserved)


def test_a_phase_reset_loses_nothing_for_the_line_or_the_window():
    c = Counter()
    mem = PeakMemory(torch.device("cpu"), read=c.read, reset=c.reset)
    mem.start_window()
    a_step(c, 40 * GiB)
    mem.restart()  # TAEHV_MEMORY_LOG: --profile's per-phase peaks
    a_step(c, 1 * GiB)
    mem.restart()
    assert mem.interval_gib() == 40.0
    assert mem.interval_gib() == 0.0  # nothing allocated since
    assert mem.window_gib() == (40.0, 41.0)


def test_without_cuda_there_is_no_measure():
    mem = PeakMemory(torch.device("cpu"))
    mem.restart()
    assert mem.interval_gib() is None and mem.window_gib() is None
    assert peak_memory(torch.device("cpu")) is peak_memory(torch.device("cpu"))  # one per device, as torch's


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_torch_counter_on_a_gpu():
    device = torch.device("cuda", torch.cuda.current_device())
    mem = PeakMemory(device)
    mem.interval_gib()
    x = torch.empty(GiB, dtype=torch.uint8, device=device)  # 1 GiB
    del x
    mem.start_window()  # resets torch's counter, as SpeedLog does at step 10
    assert mem.interval_gib() >= 1.0  # the GiB allocated before the reset still counts
    y = torch.empty(GiB // 4, dtype=torch.uint8, device=device)
    del y
    assert 0.25 <= mem.interval_gib() < 1.0  # the next interval: its own peak only
    assert 0.25 <= mem.window_gib()[0] < 1.0  # the window began after the 1 GiB
