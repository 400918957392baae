"""Divergence (#25): bad micro-batches skipped, in-process rollback, a second one within the window stops.

The fast tests drive guard.py's decisions with the values the all-reduce would give; the slow ones run the
real trainer through the launcher (CPU, 1 and 2 ranks) with TAEHV_LAUNCH_TEST_INJECT."""

from __future__ import annotations

import json
import math
import random
import statistics
from types import SimpleNamespace

import pytest
import torch

from conftest import assert_one_line_error, clean_env, overrides
from trainrun import launch, ok, scalars, trainer_state
from taehv_launch.errors import ConfigError
from taehv_launch.train import faults
from taehv_launch.rundir.events import EVENTS_FILE, append_event, read_events
from taehv_launch.train.faults import Injection
from taehv_launch.train.loop.guard import Guard, RunningMedian

CPU = torch.device("cpu")


def cfg(**over):
    base = dict(
        loss_spike_factor=10.0,
        loss_spike_window=4,
        max_consecutive_bad_steps=3,
        rollback_lr_factor=0.5,
        rollback_lr_steps=100,
        rollback_window=50,
        reconstruction_loss_weight=1.0,
        encoder_loss_weight=1.0,
        seed=42,
    )
    return SimpleNamespace(**{**base, **over})


def make_guard(tmp_path, world=1, step=0, lines=None, scalars=None, **over) -> Guard:
    log = (lambda m, all_ranks=False: lines.append(m)) if lines is not None else (lambda m, all_ranks=False: None)
    scalar = (lambda name, v, s: scalars.append((name, v, s))) if scalars is not None else None
    return Guard(cfg(**over), 0, world, CPU, log, tmp_path, step, scalar=scalar)


# ---------------------------------------------------------------------------- running median
def test_running_median_matches_statistics_over_a_sliding_window():
    rng = random.Random(0)
    m, seen = RunningMedian(7), []
    for _ in range(200):
        x = rng.choice([rng.random(), 0.5, 0.25])  # repeats: removal must take one copy only
        m.add(x)
        seen.append(x)
        assert m.median() == statistics.median(seen[-7:])
        assert m.full == (len(seen) >= 7)
    assert len(m.sorted) == 7


def test_running_median_of_size_zero_stays_empty():
    m = RunningMedian(0)
    m.add(1.0)
    assert not m.full and m.sorted == []


# ---------------------------------------------------------------------------- the decision
def test_spike_check_starts_once_the_window_is_full_and_skips_only_spikes(tmp_path):
    lines: list[str] = []
    g = make_guard(tmp_path, lines=lines)
    assert g.judge([100.0, 0.0], 0)  # window empty: no spike check yet
    for x in (1.0, 1.0, 1.0):
        assert g.judge([x, 0.0], 0)
    assert g.median.full and g.median.median() == 1.0  # [100, 1, 1, 1]
    assert not g.judge([10.5, 0.0], 7)  # > 10 x 1.0
    assert "step 7: loss spike on rank 0 (10.5 > 10 x running median 1)" in lines[-1]
    assert "(1 in a row)" in lines[-1] and g.bad_in_a_row == 1 and not g.rollback_due
    assert g.judge([9.5, 0.0], 7)  # below: trained on, and the count starts again
    assert g.bad_in_a_row == 0
    assert g.median.median() == 1.0  # the skipped spike never entered the window


def test_weighted_loss_is_what_the_spike_check_compares(tmp_path):
    g = make_guard(tmp_path, loss_spike_window=1, reconstruction_loss_weight=0.5, encoder_loss_weight=2.0)
    assert g.judge([1.0, 1.0], 0)  # 0.5 + 2.0 = 2.5
    assert g.judge([20.0, 2.0], 0)  # 10 + 4 = 14 < 25


def test_spike_factor_zero_turns_the_check_off(tmp_path):
    g = make_guard(tmp_path, loss_spike_factor=0.0, loss_spike_window=1)
    assert g.judge([1.0, 0.0], 0)
    assert g.judge([1e6, 0.0], 0)


def test_non_finite_losses_count_in_a_row_up_to_the_tolerance(tmp_path):
    lines: list[str] = []
    g = make_guard(tmp_path, lines=lines)
    for k in (1, 2):
        assert not g.judge([math.nan, 0.0], 3)
        assert not g.rollback_due and f"({k} in a row)" in lines[-1]
    assert not g.judge([0.1, math.inf], 3)  # the encoder loss counts too
    assert g.rollback_due
    assert g.why == "3 bad micro-batches in a row (the last: non-finite loss on rank 0)"


def test_every_rank_is_judged_and_named(tmp_path):
    """Two ranks' values as the all-reduce gives them: the same decision on both, naming the bad rank."""
    lines: list[str] = []
    g = make_guard(tmp_path, world=2, lines=lines)
    for _ in range(4):
        assert g.judge([1.0, 0.0, 1.2, 0.0], 0)
    assert g.median.median() == pytest.approx(1.1)  # the mean over the ranks per micro-batch
    assert not g.judge([1.0, 0.0, 50.0, 0.0], 2)
    assert "loss spike on rank 1 (50 > 10 x running median 1.1)" in lines[-1]
    assert not g.judge([1.0, 0.0, math.nan, 0.0], 2)
    assert "non-finite loss on rank 1;" in lines[-1]


def test_check_runs_the_one_sync_on_tensors_and_the_hook_injects(tmp_path, monkeypatch):
    monkeypatch.setenv(faults.INJECT_ENV, "nan@2,spike@3:0,spike@4:1")
    g = make_guard(tmp_path, loss_spike_window=1)
    one, zero = torch.tensor(1.0), torch.tensor(0.0)
    assert g.check(one, zero, 0)  # micro-batch 1
    assert not g.check(one, zero, 0)  # 2: NaN on every rank
    assert not g.check(one, zero, 0)  # 3: x1000 on rank 0 (this one)
    assert g.check(one, zero, 0)  # 4: rank 1 only
    assert g.micro == 4


def test_a_non_finite_gradient_norm_skips_the_optimizer_step_counted_and_logged(tmp_path):
    lines, tb = [], []
    g = make_guard(tmp_path, lines=lines, scalars=tb)
    assert g.grads_finite(torch.tensor(2.0), None, 4) and not g.step_skipped
    assert not g.grads_finite(torch.tensor(float("nan")), None, 4)  # before step 5: skipped
    assert g.step_skipped and g.skipped_steps == 1 and not g.rollback_due
    assert lines[-1] == (
        "optimizer step 5 skipped on all ranks: non-finite gradient norm on rank 0; its gradients dropped, "
        "parameters unchanged (1 in a row, 1 in this process)"
    )
    assert tb == [("train/skipped_steps", 1, 5)]
    assert g.check(torch.tensor(1.0), torch.tensor(0.0), 4) and not g.step_skipped  # the next micro-batch
    assert not g.grads_finite(torch.tensor(float("inf")), None, 4)
    assert g.grads_finite(torch.tensor(0.5), None, 4)  # a good step ends the run of skipped ones
    assert g.skipped_in_a_row == 0 and g.skipped_steps == 2 and tb[-1] == ("train/skipped_steps", 2, 5)


def test_skipped_steps_in_a_row_roll_back_and_the_rollback_resets_them(tmp_path):
    g = make_guard(tmp_path)  # max_consecutive_bad_steps 3
    for _ in (1, 2):
        assert not g.grads_finite(torch.tensor(float("nan")), None, 7) and not g.rollback_due
        assert g.check(torch.tensor(1.0), torch.tensor(0.0), 7)  # good losses do not end the run of bad steps
    assert not g.grads_finite(torch.tensor(float("nan")), None, 7)
    assert g.rollback_due
    assert g.why == "3 optimizer steps in a row skipped (the last: non-finite gradient norm on rank 0)"
    g.reset(rollback_event(7, 4))
    assert not g.rollback_due and g.skipped_in_a_row == 0 and not g.step_skipped and g.skipped_steps == 3


def test_fp16_scaler_or_no_norm_leaves_the_step_to_others(tmp_path):
    """fp16's GradScaler skips a non-finite step itself (and lowers its scale); DeepSpeed passes no norm."""
    g = make_guard(tmp_path)
    assert g.grads_finite(torch.tensor(float("nan")), object(), 3)
    assert g.grads_finite(None, None, 3)
    assert g.skipped_steps == 0


def test_injection_spec(monkeypatch):
    monkeypatch.setenv(faults.INJECT_ENV, "nan@3-5:1,spike@9,gradnan@12:0")
    assert Injection.from_env(1).at == {3: "nan", 4: "nan", 5: "nan", 9: "spike"}
    assert Injection.from_env(0).at == {9: "spike", 12: "gradnan"}
    for bad in ("oops@3", "nan@x", "nan@3:one", "nan"):
        monkeypatch.setenv(faults.INJECT_ENV, bad)
        with pytest.raises(ConfigError, match="kind@N"):
            Injection.from_env(0)
    monkeypatch.delenv(faults.INJECT_ENV)
    assert Injection.from_env(0) is None


def test_the_gradient_hook_fills_a_gradient_with_nan():
    inj = Injection({2: "gradnan"})
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3)
    assert inj.grads(1, [p]) == [p] and torch.isfinite(p.grad).all()
    inj.grads(2, iter([p]))
    assert torch.isnan(p.grad).all()


# ---------------------------------------------------------------------------- the policy, across a resume
def rollback_event(step, to_step, n=1, lr_until=None, seed=7961):
    return {
        "event": "rollback",
        "step": step,
        "to_step": to_step,
        "checkpoint": f"checkpoint-{to_step}",
        "rollback": n,
        "data_seed": seed,
        "lr_factor": 0.5,
        "lr_until": to_step + 100 if lr_until is None else lr_until,
    }


def test_the_lowered_lr_and_the_data_seed_survive_a_resume(tmp_path):
    append_event(tmp_path, rollback_event(130, 100))
    (tmp_path / EVENTS_FILE).open("a").write("not json\n")
    (tmp_path / EVENTS_FILE).open("ab").write(b"\xff\xfe torn\n")  # not UTF-8: once a crash on resume
    append_event(tmp_path, {"event": "stop", "step": 140})
    assert len(read_events(tmp_path)) == 2  # the unreadable lines are left out
    g = make_guard(tmp_path, step=120)  # resumed from a checkpoint after the rollback
    assert g.lr_scale(120) == 0.5 and g.lr_scale(199) == 0.5 and g.lr_scale(200) == 1.0
    assert g.data_seed(42) == 7961
    assert g.again_too_soon(120) and not g.again_too_soon(150)  # rollback_window 50 from step 100
    early = make_guard(tmp_path, step=80)  # resumed from before the rollback: none of it applies
    assert early.lr_scale(80) == 1.0 and early.data_seed(42) == 42 and not early.again_too_soon(80)


def test_no_events_file_means_nothing_to_apply(tmp_path):
    g = make_guard(tmp_path, step=10)
    assert g.lr_scale(10) == 1.0 and g.data_seed(42) == 42 and g.active is None


def test_reset_after_a_rollback(tmp_path):
    g = make_guard(tmp_path)
    for _ in range(3):
        g.judge([math.nan, 0.0], 5)
    event = rollback_event(5, 4)
    g.reset(event)
    assert not g.rollback_due and g.bad_in_a_row == 0 and g.active is event and g.history == [event]
    assert g.lr_scale(4) == 0.5 and g.again_too_soon(5)


# ---------------------------------------------------------------------------- real runs
INJECT = faults.INJECT_ENV
RUN = overrides(
    "checkpointing_steps=4 validation_steps=4 max_consecutive_bad_steps=3",
    "dataloader_num_workers=1",  # the cpu profile's: the rollback closes and restarts a real worker
)


def env_with(tmp_path, **extra):
    return clean_env(TAEHV_CACHE=str(tmp_path.parent / "taehv-cache"), OMP_NUM_THREADS="1", **extra)


def tb_last_file(run, tag):
    """(step, value) of `tag` in the newest event file only (after a rollback: the branch trained on)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    f = sorted((run / "logs").glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime)[-1]
    acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


@pytest.mark.slow
def test_one_rank_spike_skipped_nan_rolls_back_lr_lowered_through_a_resume(tmp_path):
    env = env_with(tmp_path, **{INJECT: "spike@3,nan@7-9"})
    proc, run = launch(tmp_path, 1, *RUN, *overrides("max_train_steps=6 loss_spike_window=2"), env=env, run_name="r1")
    ok(proc)
    out = proc.stdout
    assert "step 2: loss spike on rank 0 (" in out and "micro-batch skipped on all ranks (1 in a row)" in out
    assert out.count("step 5: non-finite loss on rank 0; micro-batch skipped on all ranks") == 3
    assert (
        "[rank 0] rollback 1 at step 5: 3 bad micro-batches in a row (the last: non-finite loss on rank 0); now "
        "at step 4 (checkpoint-4), data order reseeded (seed 7961), learning rate x0.5 until step 1004; "
        "recorded in events.jsonl" in out
    )
    events = read_events(run)
    assert [(e["event"], e["step"], e["to_step"], e["lr_until"]) for e in events] == [("rollback", 5, 4, 1004)]
    tb = scalars(run)
    assert tb["train/rollbacks"] == [(5, 1.0)]
    lr_before = next(v for s, v in tb["train/learning_rate"] if s == 5)  # the first branch's (first event file)
    assert dict(tb_last_file(run, "train/learning_rate"))[5] == pytest.approx(0.5 * lr_before)
    assert trainer_state(run / "checkpoint-6")["step"] == 6
    progress = json.loads((run / "progress.json").read_text())
    assert progress["step"] == progress["total"] == 6 and progress["global_batch"] == 1
    assert progress["samples_per_s_avg"] > 0 and progress["started"] <= progress["time"]

    # the lowered learning rate (until step 1004) and the reseeded data go on after a resume
    proc, _ = launch(
        tmp_path, 1, *RUN, "--resume", "auto", "--set", "max_train_steps=8", env=env_with(tmp_path), run_name="r1"
    )
    ok(proc)
    from taehv_launch.plan.configfile import read_rendered_config
    from taehv_launch.plan.schema import make_config
    from taehv_launch.train.loop.guard import lr_at

    c = make_config(read_rendered_config(str(run / "config.py")))
    lrs = dict(tb_last_file(run, "train/learning_rate"))
    for step in (7, 8):
        assert lrs[step] == pytest.approx(0.5 * lr_at(step - 1, c)), (step, lrs)


@pytest.mark.slow
def test_a_second_rollback_within_the_window_stops_the_run(tmp_path):
    env = env_with(tmp_path, **{INJECT: "nan@7-9,nan@12-14"})
    proc, run = launch(tmp_path, 1, *RUN, "--set", "max_train_steps=10", env=env, run_name="r2")
    assert "[rank 0] rollback 1 at step 6" in proc.stdout
    assert_one_line_error(
        proc,
        r"diverged again at step 6 \(3 bad micro-batches in a row .*\), 2 steps after the rollback to "
        r"checkpoint-4 \(rollback_window 2000\): stopping\. Lower learning_rate",
        code=1,
    )
    assert [e["event"] for e in read_events(run)] == ["rollback", "stop"]
    assert (run / "checkpoint-4" / "COMPLETE").is_file()


@pytest.mark.slow
def test_two_ranks_roll_back_together_for_a_nan_on_rank_1_and_nan_gradients_on_rank_0(tmp_path):
    """Rank 1's NaN losses roll back (micro-batches skipped in a row); then rank 0's NaN gradients skip three
    optimizer steps in a row on both ranks, which rolls back too."""
    env = env_with(tmp_path, **{INJECT: "nan@7-9:1,gradnan@12-14:0"})
    proc, run = launch(tmp_path, 2, *RUN, *overrides("max_train_steps=8 rollback_window=1"), env=env, run_name="r3")
    ok(proc)
    out = proc.stdout
    assert out.count("step 6: non-finite loss on rank 1; micro-batch skipped on all ranks") == 3
    for rank in (0, 1):  # every rank says it: both took the same decision, to the same step
        for k in (1, 2, 3):
            assert (
                f"[rank {rank}] optimizer step 7 skipped on all ranks: non-finite gradient norm on rank 0; its "
                f"gradients dropped, parameters unchanged ({k} in a row, {k} in this process)" in out
            )
        assert f"[rank {rank}] rollback 1 at step 6: 3 bad micro-batches in a row" in out
        assert (
            f"[rank {rank}] rollback 2 at step 6: 3 optimizer steps in a row skipped (the last: non-finite gradient "
            f"norm on rank 0)" in out
        )
        assert out.count(f"[rank {rank}] rollback") == 2
    assert out.count("now at step 4 (checkpoint-4)") == 4
    events = read_events(run)
    assert [(e["step"], e["to_step"], e["data_seed"]) for e in events] == [(6, 4, 42 + 7919), (6, 4, 42 + 2 * 7919)]
    assert trainer_state(run / "checkpoint-8")["step"] == 8
    losses = [v for s, v in tb_last_file(run, "train/loss")]
    assert losses and all(math.isfinite(v) for v in losses)


def checkpoint_tensors(ckpt) -> dict[str, torch.Tensor]:
    """The portable checkpoint's weights and AdamW moments, and AdamW's step count (optimizer.safetensors' metadata)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(ckpt / "optimizer.safetensors"), "pt") as f:
        step = torch.tensor(int(f.metadata()["step"]))
    files = ("model.safetensors", "optimizer.safetensors")
    return {"adamw step": step, **{f"{f}:{k}": v for f in files for k, v in load_file(ckpt / f).items()}}


@pytest.mark.slow
def test_a_nan_gradient_on_one_rank_skips_the_step_on_both_leaving_parameters_and_adamw_unchanged(tmp_path):
    """Run A: micro-batch 2's gradient is NaN on rank 1 only, after DDP's reduction: the flag's all-reduce
    skips optimizer step 2 on both ranks. Run B: micro-batch 2 is dropped before backward (a NaN loss on
    every rank), which changes nothing by construction. Both then make step 2 from micro-batch 3, so
    their checkpoints are equal bit for bit (weights, AdamW moments and step count) only if the skipped
    step left every rank's parameters and optimizer as they were. Seraena off: its discriminator trains
    on micro-batch 2 in run A only."""
    common = [*RUN, *overrides("max_train_steps=2 checkpointing_steps=1 use_seraena=False")]
    proc_a, run_a = launch(tmp_path, 2, *common, env=env_with(tmp_path, **{INJECT: "gradnan@2:1"}), run_name="a")
    ok(proc_a)
    for rank in (0, 1):
        assert (
            f"[rank {rank}] optimizer step 2 skipped on all ranks: non-finite gradient norm on rank 1; its gradients "
            f"dropped, parameters unchanged (1 in a row, 1 in this process)" in proc_a.stdout
        )
    assert "rollback" not in proc_a.stdout
    assert scalars(run_a)["train/skipped_steps"] == [(2, 1.0)]
    proc_b, run_b = launch(tmp_path, 2, *common, env=env_with(tmp_path, **{INJECT: "nan@2"}), run_name="b")
    ok(proc_b)
    assert "step 1: non-finite loss on rank 0, 1; micro-batch skipped on all ranks (1 in a row)" in proc_b.stdout
    for step in (1, 2):
        a, b = checkpoint_tensors(run_a / f"checkpoint-{step}"), checkpoint_tensors(run_b / f"checkpoint-{step}")
        assert a.keys() == b.keys()
        differ = [k for k in a if not torch.equal(a[k], b[k])]
        assert not differ, (step, differ[:5])
    assert (
        trainer_state(run_a / "checkpoint-2")["samples_seen"] == trainer_state(run_b / "checkpoint-2")["samples_seen"]
    )
