"""Checkpoints: complete-or-absent, rotation, resume choices, determinism across a resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from taehv_launch.errors import CheckpointError
from taehv_launch.runs import COMPLETE, newest_complete, resolve_resume
from trainrun import launch, ok, scalars, trainer_state


def fake_checkpoint(run: Path, step: int, complete: bool = True) -> Path:
    ck = run / f"checkpoint-{step}"
    ck.mkdir(parents=True)
    (ck / "trainer_state.json").write_text(json.dumps({"step": step}))
    if complete:
        (ck / COMPLETE).write_text(json.dumps({"step": step, "files": ["trainer_state.json"]}))
    return ck


def test_resume_auto_takes_the_newest_complete_and_says_what_it_skipped(tmp_path):
    run = tmp_path / "output" / "r"
    fake_checkpoint(run, 10)
    fake_checkpoint(run, 20, complete=False)
    ck30 = fake_checkpoint(run, 30)
    (ck30 / "trainer_state.json").unlink()            # listed in COMPLETE but gone
    found, notes = resolve_resume("auto", tmp_path / "output", run)
    assert found == run / "checkpoint-10"
    assert any("checkpoint-30" in n and "missing" in n for n in notes)
    assert any("checkpoint-20" in n and "COMPLETE" in n for n in notes)


def test_explicit_incomplete_checkpoint_is_refused(tmp_path):
    ck = fake_checkpoint(tmp_path, 5, complete=False)
    with pytest.raises(CheckpointError, match="incomplete"):
        resolve_resume(str(ck), tmp_path, None)
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        resolve_resume(str(tmp_path), tmp_path, None)


def test_rotation_keeps_the_newest_and_the_best(tmp_path):
    from taehv_launch.train.checkpoint import rotate

    for step in (10, 20, 30, 40, 50):
        fake_checkpoint(tmp_path, step)
    fake_checkpoint(tmp_path, 60, complete=False)     # newest, but incomplete: not counted, not deleted
    removed = rotate(tmp_path, keep=2, best_step=10)
    assert sorted(removed) == ["checkpoint-20", "checkpoint-30", "checkpoint-40"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10", "checkpoint-50", "checkpoint-60"]
    assert newest_complete(tmp_path)[0] == tmp_path / "checkpoint-50"


@pytest.mark.slow
def test_interrupted_and_resumed_equals_uninterrupted(tmp_path):
    """Same seed, same data: the losses after the resume point match an uninterrupted run
    (sampler position, RNGs, EMA and Seraena with its replay buffer restored)."""
    common = ["--set", "checkpointing_steps=3", "--set", "validation_steps=100"]
    proc, full = launch(tmp_path, 1, *common, "--set", "max_train_steps=6", run_name="full")
    ok(proc)
    proc, part = launch(tmp_path, 1, *common, "--set", "max_train_steps=3", run_name="part")
    ok(proc)
    state = trainer_state(part / "checkpoint-3")
    assert state["step"] == 3
    proc, _ = launch(tmp_path, 1, *common, "--set", "max_train_steps=6", "--resume", "auto", run_name="part")
    ok(proc)
    a, b = scalars(full)["train/loss"], scalars(part)["train/loss"]
    assert [s for s, _ in a] == [s for s, _ in b] == [1, 2, 3, 4, 5, 6]
    for (sa, va), (sb, vb) in zip(a, b):
        assert va == pytest.approx(vb, rel=1e-4, abs=1e-6), (sa, va, vb)


@pytest.mark.slow
def test_same_seed_same_curve_other_seed_differs(tmp_path):
    runs = {}
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        proc, run = launch(tmp_path, 1, "--set", "max_train_steps=3", "--set", f"seed={seed}",
                           "--set", "validation_steps=100", "--set", "checkpointing_steps=100", run_name=name)
        ok(proc)
        runs[name] = [v for _, v in scalars(run)["train/loss"]]
    assert runs["a"] == pytest.approx(runs["b"], rel=1e-5)
    assert runs["a"] != pytest.approx(runs["c"], rel=1e-3)


def test_resume_auto_passes_over_a_newer_run_that_failed_early(tmp_path):
    import os
    import time

    out = tmp_path / "output"
    good = out / "2026-01-01_00-00-00"
    fake_checkpoint(good, 7)
    failed = out / "2026-01-02_00-00-00"
    failed.mkdir(parents=True)
    later = time.time() + 10
    os.utime(failed, (later, later))
    (out / "latest").symlink_to(failed.name)
    found, _ = resolve_resume("auto", out, None)
    assert found == good / "checkpoint-7"


def test_deepspeed_checkpoint_on_another_layout_is_refused_before_anything_starts(tmp_path):
    from conftest import assert_one_line_error

    run = tmp_path / "output" / "ds"
    ck = fake_checkpoint(run, 4)
    (ck / "trainer_state.json").write_text(json.dumps({"step": 4, "world_size": 2, "zero_stage": 2}))
    (ck / COMPLETE).write_text(json.dumps({"step": 4, "files": ["trainer_state.json"]}))
    before = sorted(p.name for p in run.iterdir())
    proc, _ = launch(tmp_path, 1, "--resume", "auto", run_name="ds")
    assert_one_line_error(proc, r"2 process\(es\) with ZeRO-2.*zero_stage=2.*pretrained_model_path")
    assert sorted(p.name for p in run.iterdir()) == before      # nothing written into the run


@pytest.mark.slow
@pytest.mark.parametrize("first,second", [(2, 1), (1, 2)])
def test_resume_on_another_world_size(tmp_path, first, second):
    """A DDP checkpoint written by N ranks resumes on M: steps continue, state carries over."""
    from safetensors.torch import load_file

    proc, run = launch(tmp_path, first, "--set", "max_train_steps=2", "--set", "validation_steps=100")
    ok(proc)
    proc, _ = launch(tmp_path, second, "--resume", "auto", "--set", "max_train_steps=4",
                     "--set", "validation_steps=100", "--set", "learning_rate=1e-9")
    ok(proc)
    assert f"was written by {first} process(es), this run has {second}" in proc.stdout
    assert "at step 2" in proc.stdout and f"processes {second}" in proc.stdout
    assert [s for s, _ in scalars(run)["train/loss"]] == [1, 2, 3, 4]
    state = trainer_state(run / "checkpoint-4")
    assert state["world_size"] == second and state["samples_seen"] == 2 * first // second + 2
    a = load_file(str(run / "checkpoint-2" / "model.safetensors"))
    b = load_file(str(run / "checkpoint-4" / "model.safetensors"))
    for k in a:      # a tiny LR after the resume: the weights are the resumed ones, not a fresh init
        assert (a[k] - b[k]).abs().max() < 1e-3, k
