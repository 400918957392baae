"""Which rank the others wait for: per-rank time per step, gathered at each log line.

Every rank spends the same wall time per step (the collectives line them up), so the wall time cannot
name a slow rank. What differs is where the time goes. Per log window, each rank measures (no device sync
of its own: host perf_counter, and on GPUs CUDA events read at the log line, after its sync):
- `wait`: time in the micro-batch check's all-reduce (guard.py), where a rank waits for the others; on
  GPUs the device time of that all-reduce (CUDA events around it on the current stream), on CPU the
  host time (gloo blocks);
- `busy` = (window wall time - wait) / steps: this rank's own time per optimizer step;
- `forward`: from the start of a micro-batch's forward to the check (reference encode, TAEHV forward,
  losses), per step: device time on GPUs, a direct measure of a slow GPU (the wait in the backward's
  gradient all-reduce is DDP's own and is not seen here, so a GPU slow in everything shows most
  clearly in this number);
- `data`: host time waiting for the next batch, per step.
The four numbers of every rank ride in the log line's one all-reduce (`gather_window`). A rank whose
busy time, or on GPUs its forward time, is more than straggler_threshold above the median of the other
ranks' is named in one line with its host (CPU processes share the machine's cores: their forward
times differ by a fifth from noise alone, measured on a loaded 2-core machine) (hostnames are gathered once, at the start); rank 0 writes train/straggler_ratio
(the largest ratio), train/straggler_rank and train/data_wait_max_s at every log line. The first window
of a launch, and the one after a rollback, are left out (workers starting, compile), as is every window
ending within 2 steps of the start (DDP's second iteration rebuilds its gradient buckets with a collective
in its forward, where a slow rank's delay is not measured).

A test makes one rank slow in every micro-batch's forward through train/faults.py (`slow_forward`).
"""

from __future__ import annotations

import contextlib
import socket
import statistics
import time

import torch
import torch.distributed as dist

from .. import faults
from ...rundir.launchid import launch_id
from ..durability.progress import PROGRESS

FIELDS = ("busy", "forward", "data", "wait")  # per step, seconds


class StepClock:
    """This rank's data wait, forward time and collective wait over a log window (module docstring)."""

    def __init__(self, device: torch.device, enabled: bool, rank: int):
        self.enabled, self.cuda = enabled, enabled and device.type == "cuda"
        self.slow = faults.slow_forward(rank)  # seconds a test makes this rank sleep per forward; 0.0
        self.reset()

    def reset(self) -> None:
        self.t0 = time.perf_counter()
        self.data_s = self.forward_s = self.wait_s = self.outside_s = 0.0
        self.events: list = []  # GPU: (forward start, wait begin, wait end) per micro-batch
        self._fwd = self._wait = 0.0
        self._mark = None

    @contextlib.contextmanager
    def outside(self):
        """Validation and checkpoints (rank 0 writes more of them): left out of the window's busy time."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self.outside_s += time.perf_counter() - t

    def fetch(self, it):
        """next(it), timing the wait."""
        t = time.perf_counter()
        batch = next(it)
        self.data_s += time.perf_counter() - t
        return batch

    def forward(self) -> None:
        """A micro-batch's forward starts."""
        if self.cuda:
            self._mark = [_event()]
        elif self.enabled:
            self._fwd = time.perf_counter()
        if self.slow:
            time.sleep(self.slow)  # test hook: this rank is slow

    def wait_begin(self) -> None:
        if self.cuda:
            if self._mark is not None:
                self._mark.append(_event())
        else:
            self._wait = time.perf_counter()
            self.forward_s += self._wait - self._fwd if self._fwd else 0.0
            self._fwd = 0.0

    def wait_end(self) -> None:
        if self.cuda:
            if self._mark is not None and len(self._mark) == 2:
                self._mark.append(_event())
                self.events.append(self._mark)
            self._mark = None
        else:
            self.wait_s += time.perf_counter() - self._wait

    def take(self, steps: int) -> tuple[float, ...]:
        """(busy, forward, data, wait) seconds per step over the window; starts the next one. Called at the
        log line, after its sync: the window's CUDA events have completed."""
        wall = time.perf_counter() - self.t0 - self.outside_s
        forward, wait = self.forward_s, self.wait_s
        for fwd, begin, end in self.events:
            end.synchronize()  # done already; no wait
            forward += fwd.elapsed_time(begin) / 1000
            wait += begin.elapsed_time(end) / 1000
        data, steps = self.data_s, max(1, steps)
        self.reset()
        return (max(0.0, wall - wait) / steps, forward / steps, data / steps, wait / steps)


def _event():
    e = torch.cuda.Event(enable_timing=True)
    e.record()
    return e


def gather_window(
    means: dict[str, float], mine: tuple[float, ...], rank: int, world: int, device: torch.device
) -> tuple[dict[str, float], list[tuple[float, ...]]]:
    """The log line's one all-reduce: the loss means averaged over the ranks, and every rank's timings
    (each rank fills its own slots of a SUM)."""
    keys, k = sorted(means), len(mine)
    t = torch.zeros(len(keys) + k * world, dtype=torch.float64)
    t[: len(keys)] = torch.tensor([means[key] for key in keys], dtype=torch.float64)
    t[len(keys) + k * rank : len(keys) + k * (rank + 1)] = torch.tensor(mine, dtype=torch.float64)
    if world > 1:
        t = t.to(device)
        with PROGRESS.phase("collective"):
            PROGRESS.count_collective()
            dist.all_reduce(t)
    vals = t.tolist()
    out = {key: vals[i] / world for i, key in enumerate(keys)}
    n = len(keys)
    return out, [tuple(vals[n + k * r : n + k * (r + 1)]) for r in range(world)]


def find_stragglers(
    ranks: list[tuple[float, ...]], threshold: float, forward: bool = True
) -> tuple[list[tuple[int, float]], float, int]:
    """([(rank, ratio)] above 1 + threshold, the largest ratio, its rank). A rank's ratio: its busy time
    (and with `forward` its forward time, the larger) over the median of the other ranks' (1.0 where that
    median is 0)."""
    ratios = []
    for r, mine in enumerate(ranks):
        others = ranks[:r] + ranks[r + 1 :]
        ratio = 1.0
        for f in (0, 1) if forward else (0,):  # busy, forward
            med = statistics.median(o[f] for o in others) if others else 0.0
            if med > 0:
                ratio = max(ratio, mine[f] / med)
        ratios.append(ratio)
    top = max(range(len(ratios)), key=ratios.__getitem__) if ratios else 0
    slow = [(r, x) for r, x in enumerate(ratios) if threshold > 0 and x > 1 + threshold]
    return slow, (ratios[top] if ratios else 1.0), top


class Stragglers:
    """Names the ranks the others wait for, at each log line (every rank computes, rank 0 says it)."""

    def __init__(self, threshold: float, rank: int, world: int, log, scalar, device: torch.device):
        self.threshold, self.rank, self.world, self.log, self.scalar = threshold, rank, world, log, scalar
        self.forward = device.type == "cuda"  # CPU ranks share the cores: their forward times are noise
        self.hosts = [socket.gethostname()] * world
        self.launch_ids = [lid] if (lid := launch_id()) else []  # every rank's launcher's (one per node), sorted
        self.restart(0)

    def restart(self, step: int) -> None:
        """Training (re)starts at `step`: the next log window is left out (workers starting, compile), and so is
        every window ending within 2 steps (DDP's second iteration rebuilds its buckets with a collective)."""
        self.skip, self.quiet_until = 1, step + 2

    def start(self, step: int) -> list[str]:
        """Collective, once: every rank's hostname and launch id (on several nodes each node's launcher has its
        own: rank 0 records them in progress.json, and `status` knows which nodes' records are this launch's,
        rundir/launches.py); returns the launch ids."""
        self.restart(step)
        if self.world > 1:
            hosts: list = [None] * self.world
            with PROGRESS.phase("collective"):
                PROGRESS.count_collective()
                dist.all_gather_object(hosts, (socket.gethostname(), launch_id()))
            self.hosts = [str(h[0]) for h in hosts]
            self.launch_ids = sorted({h[1] for h in hosts if h[1]})
        return self.launch_ids

    def report(self, ranks: list[tuple[float, ...]], step: int) -> list[int]:
        if self.world < 2:
            return []
        if self.skip > 0 or step <= self.quiet_until:
            self.skip = max(0, self.skip - 1)
            return []
        slow, worst, top = find_stragglers(ranks, self.threshold, self.forward)
        self.scalar("train/straggler_ratio", worst, step)
        self.scalar("train/straggler_rank", top, step)
        self.scalar("train/data_wait_max_s", max(r[2] for r in ranks), step)
        for r, ratio in slow:
            others = ranks[:r] + ranks[r + 1 :]
            med = [statistics.median(o[f] for o in others) for f in range(3)]
            busy, fwd, data = ranks[r][:3]
            hint = "its data loading" if data - med[2] > 0.5 * (busy - med[0]) else "its GPU or its host"
            self.log(
                f"straggler at step {step}: rank {r} on {self.hosts[r]} is {100 * (ratio - 1):.0f}% slower than the "
                f"other ranks' median (busy {busy:.3f} s/step vs {med[0]:.3f}, forward {fwd:.3f} vs {med[1]:.3f}, "
                f"data wait {data:.3f} vs {med[2]:.3f}): the other ranks wait for it; check {hint}"
            )
        return [r for r, _ in slow]
