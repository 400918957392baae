"""Divergence: skip a bad micro-batch, roll back to the last complete checkpoint, stop if it comes back.

What is checked, in the one host sync per micro-batch there was already (before backward):
- each rank's reconstruction and encoder losses go into one small all-reduce: a SUM of a vector in which
  each rank fills only its own two slots, so every rank reads every rank's values bit for bit and takes
  the same decision from them;
- bad: a loss that is not finite on some rank, or a rank's loss (reconstruction_loss_weight x rec +
  encoder_loss_weight x enc, before Seraena) above loss_spike_factor x the running median of the last
  loss_spike_window good micro-batches' losses (their mean over the ranks). The spike check starts once
  that window is full (and never with loss_spike_factor 0). A bad micro-batch is skipped on every rank,
  before backward and before Seraena's step: nothing changes;
- non-finite gradients, before the optimizer step (`grads_finite`): under DDP, clip_grad_norm_ computes
  the total norm on the device already; each rank's "not finite" flag goes into one all-reduce per
  optimizer step (not per micro-batch; one host sync), so every rank takes the same decision, as
  torchtitan does. A non-finite norm on any rank skips the optimizer step on every rank: its gradients
  are dropped, the parameters and AdamW's state stay as they were, the step is not counted (the next
  micro-batches make it again), and it is logged on every rank and counted in the TensorBoard scalar
  train/skipped_steps. max_consecutive_bad_steps skipped steps in a row roll back as below. Under fp16's
  GradScaler the norm is not checked: the scaler skips such a step itself and lowers its scale. Under
  DeepSpeed the engine clips inside its own step and its norm is not read here (a sync per step); its
  ZeRO-1/2/3 optimizers skip a step whose global gradient norm is not finite themselves, on every rank
  (deepspeed 0.19's step(), read, not tested here), uncounted by us; whatever non-finite values reach the
  weights show as non-finite losses from the next micro-batch on, which take the tolerance and the
  rollback below. With gradient accumulation under DeepSpeed, the good micro-batches of a step
  interrupted by a rollback stay in DeepSpeed's gradient buffers (under DDP they are cleared).
- max_consecutive_bad_steps bad micro-batches in a row: `Rollback.roll` loads the newest complete checkpoint
  at or before this step in-process (every rank the same one: rank 0 verifies its checksums and
  broadcasts it), reseeds the data order, multiplies the learning rate by rollback_lr_factor for
  rollback_lr_steps optimizer steps, appends the event to <run>/events.jsonl (EVENTS_FILE), adds the
  TensorBoard scalar train/rollbacks and logs one line per rank. No complete checkpoint: TooManyBadSteps.
  A second rollback less than rollback_window steps after the previous one resumed: DivergedAgain.

events.jsonl is also what a resume reads back: the newest rollback that resumed at or before the resumed
step gives the data seed and, while it lasts, the lowered learning rate (the learning rate stays a pure
function of the step). A rollback record a resume cannot use (a hand edit; rundir/events.py checks each
field) is left out with one note line, never a crash. The running median starts empty in every process.

The tests poison losses and gradients through train/faults.py (`injection`: a NaN or spike loss at given
micro-batches, a NaN gradient before a clip); unset, nothing is parsed or called.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ...errors import TooManyBadSteps
from ...plan.schema import Config
from ...rundir.events import EVENTS_FILE, append_event, rollbacks
from .. import faults
from ..durability.checkpoint import TrainState, load_checkpoint, rollback_checkpoint
from ..durability.progress import PROGRESS

SEED_STRIDE = 7919  # the data seed after rollback n: seed + n x SEED_STRIDE


def lr_at(step: int, cfg: Config) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warmup, then the schedule. A pure function
    of the step, so it resumes exactly; a rollback lowers it for a while (Guard.lr_scale)."""
    peak, warm, total = cfg.learning_rate, cfg.lr_warmup_steps, cfg.max_train_steps
    if step < warm:
        return peak * (step + 1) / warm
    if cfg.lr_scheduler == "constant":
        return peak
    progress = min(1.0, (step - warm) / max(1, total - warm))
    floor = peak * cfg.min_lr_ratio
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.lr_scheduler == "cosine" else 1 - progress
    return floor + (peak - floor) * shape


class DivergedAgain(TooManyBadSteps):
    """A second rollback within rollback_window optimizer steps of the previous one: the run stops (exit 1)."""


class RunningMedian:
    """The median of the last `size` values: a deque keeps their order, a sorted list the median (bisect)."""

    def __init__(self, size: int):
        self.size = size
        self.order: deque[float] = deque()
        self.sorted: list[float] = []

    def add(self, x: float) -> None:
        if self.size <= 0:
            return
        self.order.append(x)
        bisect.insort(self.sorted, x)
        if len(self.order) > self.size:
            del self.sorted[bisect.bisect_left(self.sorted, self.order.popleft())]

    @property
    def full(self) -> bool:
        return self.size > 0 and len(self.order) >= self.size

    def median(self) -> float:
        s, n = self.sorted, len(self.sorted)
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


class Guard:
    """The micro-batch check and the rollback policy of one rank (see the module's docstring)."""

    def __init__(
        self, cfg, rank: int, world: int, device: torch.device, log, run_dir: Path, step: int, clock=None, scalar=None
    ):
        """log(msg, all_ranks=False) as the trainer's; scalar(name, value, step) writes a TensorBoard scalar."""
        self.cfg, self.rank, self.world, self.log, self.clock, self.scalar = cfg, rank, world, log, clock, scalar
        self.factor, self.tolerance = cfg.loss_spike_factor, cfg.max_consecutive_bad_steps
        self.median = RunningMedian(cfg.loss_spike_window)
        self.bad_in_a_row, self.micro = 0, 0
        self.rollback_due, self.why = False, ""
        self.skipped_steps, self.skipped_in_a_row, self.step_skipped = 0, 0, False  # optimizer steps (grads_finite)
        self.inject = faults.injection(rank)  # the tests' poisoned losses and gradients
        self.history, self.left_out, note = rollbacks(run_dir)  # records a resume cannot use: left out
        if note:
            log(f"note: {note}")
        resumed = [e for e in self.history if e["to_step"] <= step]
        self.active: dict[str, Any] | None = resumed[-1] if resumed else None  # the rollback this branch follows

    # ------------------------------------------------------------------ per micro-batch
    def check(self, rec: torch.Tensor, enc: torch.Tensor, step: int) -> bool:
        """The micro-batch's one host sync: True to go on, False to skip it (then see rollback_due)."""
        self.micro += 1
        self.step_skipped = False
        if self.inject is not None:
            rec = self.inject.loss(self.micro, rec)
        mine = torch.stack([rec.detach().float().reshape(()), enc.detach().float().reshape(())])
        return self.judge(self._every_rank(mine).tolist(), step)

    def _every_rank(self, mine: torch.Tensor) -> torch.Tensor:
        """Every rank's values of `mine` side by side: one all-reduce (SUM) where each rank fills its own slots."""
        if self.world == 1:
            return mine
        n = mine.numel()
        v = mine.new_zeros(n * self.world)
        v[n * self.rank : n * self.rank + n] = mine
        with PROGRESS.phase("collective"):
            if self.clock is not None:
                self.clock.wait_begin()
            PROGRESS.count_collective()
            dist.all_reduce(v)
            if self.clock is not None:
                self.clock.wait_end()
        return v

    def judge(self, vals: list[float], step: int) -> bool:
        """The decision from every rank's (rec, enc): identical on every rank."""
        ranks = range(len(vals) // 2)
        rec, enc = vals[0::2], vals[1::2]
        losses = [self.cfg.reconstruction_loss_weight * rec[r] + self.cfg.encoder_loss_weight * enc[r] for r in ranks]
        what = ""
        nonfinite = [r for r in ranks if not (math.isfinite(rec[r]) and math.isfinite(enc[r]))]
        if nonfinite:
            what = f"non-finite loss on rank {_ranks(nonfinite)}"
        elif self.factor > 0 and self.median.full and (m := self.median.median()) > 0:
            spikes = [r for r in ranks if losses[r] > self.factor * m]
            if spikes:
                top = max(spikes, key=lambda r: losses[r])
                what = (
                    f"loss spike on rank {_ranks(spikes)} ({losses[top]:.4g} > {self.factor:g} x running median "
                    f"{m:.4g})"
                )
        if not what:
            self.bad_in_a_row = 0
            self.median.add(sum(losses) / len(losses))
            return True
        self.bad_in_a_row += 1
        self.log(f"step {step}: {what}; micro-batch skipped on all ranks ({self.bad_in_a_row} in a row)")
        if self.bad_in_a_row >= self.tolerance:
            self.rollback_due = True
            self.why = f"{self.bad_in_a_row} bad micro-batches in a row (the last: {what})"
        return False

    def clipped(self, params):
        """The parameters to clip (the test hook may fill a gradient with NaN first)."""
        return params if self.inject is None else self.inject.grads(self.micro, params)

    def grads_finite(self, norm, scaler, step: int) -> bool:
        """Before optimizer step `step` + 1: is clip_grad_norm_'s norm (a device tensor) finite on every rank?
        One all-reduce and one host sync per optimizer step. False: skip the step on every rank (module
        docstring). Always True with fp16's GradScaler, which skips such a step itself."""
        if not isinstance(norm, torch.Tensor) or scaler is not None:
            return True
        flags = self._every_rank((~torch.isfinite(norm.detach().float())).float().reshape(1)).tolist()
        bad = [r for r, f in enumerate(flags) if f]
        if not bad:
            self.skipped_in_a_row = 0
            return True
        self.skipped_steps += 1
        self.skipped_in_a_row += 1
        self.step_skipped = True
        what = f"non-finite gradient norm on rank {_ranks(bad)}"
        self.log(
            f"optimizer step {step + 1} skipped on all ranks: {what}; its gradients dropped, parameters unchanged "
            f"({self.skipped_in_a_row} in a row, {self.skipped_steps} in this process)",
            all_ranks=True,
        )
        if self.scalar is not None:
            self.scalar("train/skipped_steps", self.skipped_steps, step + 1)
        if self.skipped_in_a_row >= self.tolerance:
            self.rollback_due = True
            self.why = f"{self.skipped_in_a_row} optimizer steps in a row skipped (the last: {what})"
        return False

    # ------------------------------------------------------------------ policy
    def lr_scale(self, step: int) -> float:
        a = self.active
        if a is not None and a["to_step"] <= step < a["lr_until"]:
            return float(a["lr_factor"])
        return 1.0

    def data_seed(self, seed: int) -> int:
        return self.active["data_seed"] if self.active is not None else seed

    def again_too_soon(self, step: int) -> bool:
        a = self.active
        return a is not None and 0 <= step - a["to_step"] < self.cfg.rollback_window

    def reset(self, event: dict[str, Any]) -> None:
        self.history.append(event)
        self.active = event
        self.bad_in_a_row, self.rollback_due, self.skipped_in_a_row, self.step_skipped = 0, False, 0, False


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:8])) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


class Rollback:
    """The in-process rollback of one rank (module docstring), built once by the Trainer with what a rollback
    reads and loads. `roll` takes the same decision on every rank (from the all-reduced values in `guard`):
    it loads the newest complete checkpoint and records the event, or stops the run with one line. The
    Trainer then starts its data and loop again from the state and event it returns (Trainer.rollback)."""

    def __init__(self, cfg, guard: Guard, run_dir: Path, acc, parts: tuple, log, close_data):
        """parts: (model, optimizer, ema, seraena, world, zero) as load_checkpoint takes them; close_data() ends the
        DataLoader workers and decode threads before the checkpoint loads and the new loader forks its own."""
        self.cfg, self.guard, self.run_dir, self.acc, self.log = cfg, guard, run_dir, acc, log
        self.parts, self.close_data = parts, close_data

    def roll(self, old: TrainState) -> tuple[TrainState, dict[str, Any]]:
        """The checkpoint's state (with the run's own counters carried over) and the event recorded."""
        cfg, guard = self.cfg, self.guard
        step, why, main = old.step, guard.why, self.acc.is_main_process
        prev = guard.active
        if guard.again_too_soon(step):
            msg = (
                f"diverged again at step {step} ({why}), {step - prev['to_step']} steps after the rollback to "
                f"{prev['checkpoint']} (rollback_window {cfg.rollback_window}): stopping. Lower learning_rate (or "
                f"raise loss_spike_factor if the spikes are harmless) or check the data, then --resume auto; the "
                f"checkpoints are intact"
            )
            if main:
                append_event(self.run_dir, {"event": "stop", "time": time.time(), "step": step, "reason": why})
            raise DivergedAgain(msg)
        path, notes = rollback_checkpoint(self.run_dir, self.acc, at_most=step)
        if path is None:
            raise TooManyBadSteps(
                f"{why} at step {step}, and the run has no complete checkpoint to roll back to: lower "
                f"learning_rate or check the data"
            )
        for note in notes:
            self.log(note)
        n = len(guard.history) + guard.left_out + 1  # left-out records count: each rollback its own data seed
        self.close_data()
        st = load_checkpoint(path, self.acc, *self.parts)
        st.config, st.best_psnr, st.best_step = old.config, old.best_psnr, old.best_step
        st.bad_steps_total, st.skipped_files = old.bad_steps_total, old.skipped_files
        self.parts[1].zero_grad(set_to_none=True)  # the optimizer; DDP: a partly accumulated step's gradients
        self.acc.step = 0  # accelerate's micro-batch count: the next micro-batch starts an optimizer step
        event = {
            "event": "rollback",
            "time": time.time(),
            "step": step,
            "to_step": st.step,
            "checkpoint": path.name,
            "reason": why,
            "rollback": n,
            "data_seed": cfg.seed + SEED_STRIDE * n,
            "lr_factor": cfg.rollback_lr_factor,
            "lr_until": st.step + (cfg.rollback_lr_steps if cfg.rollback_lr_factor != 1.0 else 0),
        }
        guard.reset(event)
        if main:
            append_event(self.run_dir, event)
        return st, event

    @staticmethod
    def line(e: dict[str, Any]) -> str:
        """The rollback's log line, from its event."""
        lowered = (
            f", learning rate x{e['lr_factor']:g} until step {e['lr_until']}" if e["lr_until"] > e["to_step"] else ""
        )
        return (
            f"rollback {e['rollback']} at step {e['step']}: {e['reason']}; now at step {e['to_step']} "
            f"({e['checkpoint']}), data order reseeded (seed {e['data_seed']}){lowered}; recorded in {EVENTS_FILE}"
        )
