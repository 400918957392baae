"""Fault injection for the tests, in one place: the TAEHV_LAUNCH_TEST_* environment variables are read
here and nowhere else in the product (tests/test_structure.py checks that). Unset, no hook does anything.

Each variable is read once, when the thing it hooks is built (a Guard, a StepClock, a batch prefetcher or
stop vote, the trainer's decoder choice), never per step; a test that sets one builds that thing after.
It sits beside train/'s stages and imports none of them, so any stage may call it.

- TAEHV_LAUNCH_TEST_INJECT="nan@12,spike@30-32:1,gradnan@20:0" (`injection`, loop/guard.py): the
  micro-batch check sees a NaN (`nan`) or a x1000 reconstruction loss (`spike`) at those micro-batches
  (this process's count, from 1, skipped ones included) on that global rank (all ranks without `:rank`);
  `gradnan` fills a gradient with NaN after DDP's reduction, before the clip of that micro-batch's
  optimizer step, on that rank only (DDP). A value it cannot read stops the run with one line.
- TAEHV_LAUNCH_TEST_HANG=<rank>:<step>:<where> (`hang_at`, loop/speed.py): global rank <rank> sleeps for
  ever at the first <where> ("collective": inside the stop vote's all-reduce, before it is issued; "data":
  in the batch fetch) at or after optimizer step <step>, so tests/test_hang.py and
  scripts/gpu_hang_check.sh can watch the hang detector (train/durability/hang.py) find and report it.
- TAEHV_LAUNCH_TEST_SLOW="<rank>:<seconds>" (`slow_forward`, loop/stragglers.py): that global rank sleeps
  this long in every micro-batch's forward (tests/test_stragglers.py).
- TAEHV_LAUNCH_TEST_STAGE_DECODER (any value) (`decode_stand_in`, loop/build.py): the GPU decode stage
  runs on any device (CPU CI) with OpenCV frames standing in for NVDEC; TAEHV_LAUNCH_TEST_STAGE_REFUSE
  lists file suffixes (comma-separated) that stand-in refuses, as NVDEC refuses some files.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from typing import Callable

from ..errors import ConfigError

INJECT_ENV = "TAEHV_LAUNCH_TEST_INJECT"
HANG_ENV = "TAEHV_LAUNCH_TEST_HANG"
SLOW_ENV = "TAEHV_LAUNCH_TEST_SLOW"
STAGE_ENV = "TAEHV_LAUNCH_TEST_STAGE_DECODER"
REFUSE_ENV = "TAEHV_LAUNCH_TEST_STAGE_REFUSE"
SPIKE = 1000.0  # the injected spike's factor


class Injection:
    """TAEHV_LAUNCH_TEST_INJECT for this rank: {micro-batch: kind}."""

    def __init__(self, at: dict[int, str]):
        self.at = at

    @classmethod
    def from_env(cls, rank: int) -> Injection | None:
        spec = os.environ.get(INJECT_ENV, "")
        if not spec:
            return None
        at: dict[int, str] = {}
        for item in filter(None, spec.split(",")):
            kind, _, where = item.partition("@")
            span, _, who = where.partition(":")
            first, _, last = span.partition("-")
            try:
                lo, hi, target = int(first), int(last or first), int(who) if who else None
            except ValueError:
                kind = ""
            if kind not in ("nan", "spike", "gradnan"):
                raise ConfigError(f"{INJECT_ENV}: cannot read {item!r}: write kind@N[-M][:rank]")
            if target is None or target == rank:
                at.update({k: kind for k in range(lo, hi + 1)})
        return cls(at)

    def loss(self, micro: int, rec):
        """The reconstruction loss (a tensor) the check sees at micro-batch `micro`."""
        kind = self.at.get(micro)
        return rec * float("nan") if kind == "nan" else rec * SPIKE if kind == "spike" else rec

    def grads(self, micro: int, params):
        """The parameters to clip at micro-batch `micro`: with `gradnan`, the first gradient filled with NaN."""
        if self.at.get(micro) != "gradnan":
            return params
        params = list(params)
        next(p for p in params if p.grad is not None).grad.fill_(float("nan"))
        return params


def injection(rank: int) -> Injection | None:
    """The guard's hook: the losses and gradients to poison on this rank, or None (nothing parsed or called)."""
    return Injection.from_env(rank)


def hang_point(where: str) -> tuple[int, int] | None:
    """(rank, step) of TAEHV_LAUNCH_TEST_HANG when it names `where` and this process's rank; else None."""
    spec = os.environ.get(HANG_ENV, "").split(":")
    try:
        rank, step = int(spec[0]), int(spec[1])
    except (ValueError, IndexError):
        return None
    if len(spec) != 3 or spec[2] != where or rank != int(os.environ.get("RANK", "0") or 0):
        return None
    return rank, step


def _no_hang(step: int) -> None:
    return None


def hang_at(where: str) -> Callable[[int], None]:
    """The hook for one site (`where`): call it with the current optimizer step; it sleeps for ever there once
    TAEHV_LAUNCH_TEST_HANG's step has come on its rank, and returns at once otherwise."""
    point = hang_point(where)
    return _no_hang if point is None else functools.partial(hang_if_hooked, point, where)


def hang_if_hooked(point: tuple[int, int], where: str, step: int) -> None:
    """Sleep for ever here once the hook's step has come (the stack dumps name this function)."""
    if step < point[1]:
        return
    sys.stderr.write(f"[rank {point[0]}] {HANG_ENV}: hanging in {where} at step {step} (test hook)\n")
    sys.stderr.flush()
    while True:
        time.sleep(3600)


def slow_forward(rank: int) -> float:
    """Seconds this rank sleeps in every micro-batch's forward (TAEHV_LAUNCH_TEST_SLOW); 0.0 unset or unreadable."""
    spec = os.environ.get(SLOW_ENV, "")
    who, _, secs = spec.partition(":")
    try:
        return float(secs) if spec and int(who) == rank else 0.0
    except ValueError:
        return 0.0


def decode_stand_in(frames_class: type, refused: type[Exception]) -> type | None:
    """With TAEHV_LAUNCH_TEST_STAGE_DECODER set: the decoder class standing in for NVDEC, `frames_class`
    (data/nvdec.py's OpenCVFrames) raising `refused` (DecodeRefused) for the files whose names end in one of
    TAEHV_LAUNCH_TEST_STAGE_REFUSE's suffixes; its `what` names it in the start-up line. Else None."""
    if not os.environ.get(STAGE_ENV):
        return None
    refuse = tuple(x for x in os.environ.get(REFUSE_ENV, "").split(",") if x)

    class Refusing(frames_class):
        what = "a test stand-in (OpenCV frames)"

        def frames(self, path, indices):
            if refuse and path.endswith(refuse):
                raise refused("the test decoder refuses this file", os.path.basename(path))
            return super().frames(path, indices)

    return Refusing
