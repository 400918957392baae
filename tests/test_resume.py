"""Checkpoints: complete-or-absent, rotation, resume choices, determinism across a resume."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from taehv_launch.errors import CheckpointError
from taehv_launch.rundir.checkpoint import COMPLETE, newest_complete
from taehv_launch.run.runs import resolve_resume
from trainrun import launch, ok, scalars, start_launch, trainer_state
from conftest import overrides, reaped


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
    (ck30 / "trainer_state.json").unlink()  # listed in COMPLETE but gone
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
    from taehv_launch.rundir.checkpoint import rotate

    for step in (10, 20, 30, 40, 50):
        fake_checkpoint(tmp_path, step)
    fake_checkpoint(tmp_path, 60, complete=False)  # newest, but incomplete: not counted, not deleted
    removed = rotate(tmp_path, keep=2, best_step=10)
    assert sorted(removed) == ["checkpoint-20", "checkpoint-30", "checkpoint-40"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10", "checkpoint-50", "checkpoint-60"]
    assert newest_complete(tmp_path)[0] == tmp_path / "checkpoint-50"


@pytest.mark.slow
def test_interrupted_and_resumed_equals_uninterrupted(tmp_path):
    """Same seed, same data: the losses after the resume point match an uninterrupted run
    (sampler position, RNGs, EMA and Seraena with its replay buffer restored)."""
    common = overrides("checkpointing_steps=3 validation_steps=100")
    # the uninterrupted run goes beside the other two (output into files: nobody reads a pipe meanwhile)
    ref = start_launch(tmp_path, 1, *common, "--set", "max_train_steps=6", run_name="full", out=tmp_path / "full.out")
    with reaped(ref):
        proc, part = launch(tmp_path, 1, *common, "--set", "max_train_steps=3", run_name="part")
        ok(proc)
        state = trainer_state(part / "checkpoint-3")
        assert state["step"] == 3
        proc, _ = launch(tmp_path, 1, *common, "--set", "max_train_steps=6", "--resume", "auto", run_name="part")
        ok(proc)
        assert ref.finish(600) == 0, ref.text()[-6000:]
    full = ref.run
    a, b = scalars(full)["train/loss"], scalars(part)["train/loss"]
    assert [s for s, _ in a] == [s for s, _ in b] == [1, 2, 3, 4, 5, 6]
    for (sa, va), (_sb, vb) in zip(a, b):
        assert va == pytest.approx(vb, rel=1e-4, abs=1e-6), (sa, va, vb)


@pytest.mark.slow
def test_same_seed_same_curve_other_seed_differs(tmp_path):
    runs = {}
    procs = {  # side by side: each run's start-up is mostly single-threaded imports
        name: start_launch(
            tmp_path,
            1,
            *overrides("max_train_steps=3", f"seed={seed}", "validation_steps=100 checkpointing_steps=100"),
            run_name=name,
            out=tmp_path / f"{name}.out",
        )
        for name, seed in (("a", 7), ("b", 7), ("c", 8))
    }
    with reaped(*procs.values()):
        for name, proc in procs.items():
            assert proc.finish(600) == 0, proc.text()[-6000:]
            runs[name] = [v for _, v in scalars(proc.run)["train/loss"]]
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


def test_checkpoint_without_portable_state_on_another_layout_is_refused_before_anything_starts(tmp_path):
    from conftest import assert_one_line_error

    run = tmp_path / "output" / "ds"
    ck = fake_checkpoint(run, 4)
    (ck / "trainer_state.json").write_text(json.dumps({"step": 4, "world_size": 2, "zero_stage": 2}))
    (ck / COMPLETE).write_text(json.dumps({"step": 4, "files": ["trainer_state.json"]}))
    before = sorted(p.name for p in run.iterdir())
    proc, _ = launch(tmp_path, 1, "--resume", "auto", run_name="ds")
    assert_one_line_error(
        proc,
        r"2 process\(es\) with ZeRO-2 and has no world-size-free state "
        r"\(model\.safetensors, optimizer\.safetensors missing\).*zero_stage=2.*"
        r"pretrained_model_path",
    )
    assert sorted(p.name for p in run.iterdir()) == before  # nothing written into the run


def test_layout_change_note_says_what_carries_over(tmp_path):
    from taehv_launch.run.checkpoints import layout_change_note

    ck = fake_checkpoint(tmp_path, 4)
    cfg = {"micro_batch_size": 2, "gradient_accumulation_steps": 3, "learning_rate": 2e-4}
    (ck / "trainer_state.json").write_text(json.dumps({"step": 4, "world_size": 2, "zero_stage": 2, "config": cfg}))
    for f in ("model.safetensors", "optimizer.safetensors"):
        (ck / f).write_bytes(b"")
    assert layout_change_note(ck, 2, cfg | {"zero_stage": 2}) is None
    note = layout_change_note(ck, 1, cfg | {"zero_stage": 3, "learning_rate": 1e-4})
    assert "written by 2 process(es) with ZeRO-2, this run has 1 process(es) with ZeRO-3" in note
    assert "AdamW moments" in note and "reshuffled" in note
    assert "global batch 12 -> 6" in note and "learning rate 0.0002 -> 0.0001" in note
    note = layout_change_note(ck, 2, cfg | {"zero_stage": 0})
    assert "with DDP" in note and "continue" in note and "global batch" not in note


def _assert_state_carried(run: Path, before: int, after: int) -> None:
    """The checkpoint one step after a resume at a negligible LR holds the resumed state."""
    from safetensors.torch import load_file

    from taehv_launch.train.model.ema import EMA
    from taehv_launch.train.durability.portable import carried_over

    cfg = trainer_state(run / f"checkpoint-{after}")["config"]
    got = carried_over(run / f"checkpoint-{before}", run / f"checkpoint-{after}", cfg["adam_beta1"], cfg["adam_beta2"])
    assert (got["step_before"], got["step_after"]) == (before, after)  # AdamW's step (bias correction) went on
    assert got["max_weight_change"] < 1e-6, got  # the weights are the resumed ones
    assert got["moment_mismatch"] < 1e-4, got  # one AdamW update from the saved moments
    # EMA: one update from the saved EMA towards the (unchanged) weights
    e0, e1 = (load_file(str(run / f"checkpoint-{s}" / "ema.safetensors")) for s in (before, after))
    w = load_file(str(run / f"checkpoint-{after}" / "model.safetensors"))
    d = EMA.effective_decay(SimpleNamespace(decay=cfg["ema_decay"]), after)
    for k in e0:
        assert (e1[k] - torch.lerp(e0[k], w[f"taehv.{k}"], 1 - d)).abs().max() < 1e-5, k


# (2, 3) -> (2, 0): a run the 16-64 GPU rows wrote under ZeRO-3 before they moved to plain DDP (#28)
LAYOUTS = [((2, 2), (1, 3)), ((1, 3), (2, 2)), ((1, 0), (2, 0)), ((2, 3), (2, 0))]


@pytest.mark.slow
@pytest.mark.parametrize(
    "first,second",
    LAYOUTS,
    ids=[f"{a}x{'z' + str(b) if b else 'ddp'}-{c}x{'z' + str(d) if d else 'ddp'}" for (a, b), (c, d) in LAYOUTS],
)
def test_resume_on_another_world_size_and_zero_stage(tmp_path, first, second):
    """A checkpoint written by N ranks with one ZeRO stage resumes on M ranks with another:
    weights, AdamW moments and step, EMA, schedule and data position carry over."""
    (w1, z1), (w2, z2) = first, second
    proc, run = launch(tmp_path, w1, *overrides("max_train_steps=2", f"zero_stage={z1}", "validation_steps=100"))
    ok(proc)
    proc, _ = launch(
        tmp_path,
        w2,
        "--resume",
        "auto",
        *overrides("max_train_steps=3", f"zero_stage={z2}", "validation_steps=100 learning_rate=1e-12"),
    )
    ok(proc)
    layout = lambda w, z: f"{w} process(es) with {'ZeRO-' + str(z) if z else 'DDP'}"
    assert f"was written by {layout(w1, z1)}, this run has {layout(w2, z2)}" in proc.stdout
    assert "at step 2" in proc.stdout and f"processes {w2}" in proc.stdout
    assert [s for s, _ in scalars(run)["train/loss"]] == [1, 2, 3]
    state = trainer_state(run / "checkpoint-3")
    assert (state["world_size"], state["zero_stage"]) == (w2, z2)
    assert state["samples_seen"] == 2 * w1 // w2 + 1
    _assert_state_carried(run, 2, 3)


@pytest.mark.slow
def test_zero_stage_change_continues_the_same_curve(tmp_path):
    """Same 2 ranks, ZeRO-2 for steps 1-2 then ZeRO-3 for 3-4: the same losses as ZeRO-2 throughout
    (the stage-3 partitions, padded on the last rank, are filled from the portable state)."""
    common = overrides("checkpointing_steps=2 validation_steps=100")
    # the uninterrupted run goes beside the other two (their start-up is mostly single-threaded imports);
    # its output into files: nobody reads a pipe meanwhile
    argv = overrides("max_train_steps=4 zero_stage=2")
    ref = start_launch(
        tmp_path, 2, *common, *argv, run_name="full", out=tmp_path / "full.out", err=tmp_path / "full.err"
    )
    with reaped(ref):
        proc, part = launch(tmp_path, 2, *common, *overrides("max_train_steps=2 zero_stage=2"), run_name="part")
        ok(proc)
        proc, _ = launch(
            tmp_path, 2, *common, *overrides("max_train_steps=4 zero_stage=3"), "--resume", "auto", run_name="part"
        )
        ok(proc)
        assert ref.finish(600) == 0, ref.text()[-6000:]
    full = ref.run
    assert "ZeRO-2, this run has 2 process(es) with ZeRO-3" in proc.stdout
    a, b = scalars(full)["train/loss"], scalars(part)["train/loss"]
    assert [s for s, _ in a] == [s for s, _ in b] == [1, 2, 3, 4]
    for (sa, va), (_sb, vb) in zip(a, b):
        assert va == pytest.approx(vb, rel=1e-4, abs=1e-6), (sa, va, vb)


def test_portable_state_files_and_the_carried_over_measure(tmp_path):
    """One AdamW update from saved moments reads as a mismatch of ~0; moments that restarted
    from zero read as a mismatch of order 1; a file of another format is refused."""
    from safetensors.torch import save_file

    from taehv_launch.train.durability import portable

    torch.manual_seed(0)
    b1, b2 = 0.9, 0.95
    w = {"taehv.w": torch.randn(5, 3)}
    m, v, g = torch.randn(5, 3), torch.rand(5, 3), torch.randn(5, 3)
    states = {
        "a": (m, v, 4),
        "b": (b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g, 5),
        "fresh": ((1 - b1) * g, (1 - b2) * g * g, 5),
    }
    for name, (mm, vv, step) in states.items():
        (tmp_path / name).mkdir()
        portable.save(tmp_path / name, (w, {"exp_avg/taehv.w": mm, "exp_avg_sq/taehv.w": vv}, step))
    got = portable.carried_over(tmp_path / "a", tmp_path / "b", b1, b2)
    assert (got["step_before"], got["step_after"], got["max_weight_change"]) == (4, 5, 0.0)
    assert got["moment_mismatch"] < 1e-5
    assert portable.carried_over(tmp_path / "a", tmp_path / "fresh", b1, b2)["moment_mismatch"] > 0.5
    save_file({"exp_avg/taehv.w": m}, str(tmp_path / "b" / "optimizer.safetensors"), metadata={"format": "other"})
    with pytest.raises(CheckpointError, match="has format 'other'.*written by taehv-launch"):
        portable.carried_over(tmp_path / "a", tmp_path / "b", b1, b2)


# ---------------------------------------------------------------- checksums and a full disk
def real_checkpoint(run: Path, step: int) -> Path:
    """A checkpoint folder of real files (safetensors, torch.save, json), finished by the same
    write_complete the trainer uses."""
    from safetensors.torch import save_file

    from taehv_launch.rundir.checkpoint import write_complete

    ck = run / f"checkpoint-{step}"
    (ck / "deepspeed").mkdir(parents=True)
    torch.manual_seed(step)
    save_file({"taehv.w": torch.randn(256, 256)}, str(ck / "model.safetensors"))
    save_file({"w": torch.randn(64, 64)}, str(ck / "ema.safetensors"))
    torch.save({"x": torch.randn(1000)}, ck / "deepspeed" / "state.pt")
    (ck / "trainer_state.json").write_text(json.dumps({"step": step}))
    write_complete(ck, step)
    return ck


def flip_a_byte(path: Path, offset: int = 4096) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_complete_marker_records_size_and_checksum_of_every_file(tmp_path):
    import zlib

    from taehv_launch.rundir.checkpoint import checksum_problem

    ck = real_checkpoint(tmp_path, 3)
    meta = json.loads((ck / COMPLETE).read_text())
    assert meta["files"] == ["deepspeed/state.pt", "ema.safetensors", "model.safetensors", "trainer_state.json"]
    assert meta["checksum"] == "crc32"
    for f in meta["files"]:
        data = (ck / f).read_bytes()
        assert meta["sizes"][f] == len(data)
        assert meta["checksums"][f] == f"{zlib.crc32(data):08x}"
    assert checksum_problem(ck) == (None, None)


def test_a_flipped_byte_is_refused_and_auto_resume_falls_back(tmp_path):
    run = tmp_path / "output" / "r"
    older = real_checkpoint(run, 2)
    newer = real_checkpoint(run, 4)
    flip_a_byte(newer / "model.safetensors")
    assert newest_complete(run)[0] == newer  # same size: the cheap listing cannot tell
    with pytest.raises(
        CheckpointError,
        match=r"checkpoint-4 is damaged: model\.safetensors does not match "
        r"the checksum.*--resume auto",
    ):
        resolve_resume(str(newer), tmp_path / "output", None)
    found, notes = resolve_resume("auto", tmp_path / "output", run)
    assert found == older
    assert notes == [
        "skipping checkpoint-4: model.safetensors does not match the checksum saved with it (damaged on disk)"
    ]
    found, notes = resolve_resume(str(run), tmp_path / "output", None)  # a run folder: the same choice
    assert found == older
    # a truncated file is seen without reading anything
    data = (older / "ema.safetensors").read_bytes()
    (older / "ema.safetensors").write_bytes(data[:-10])
    assert newest_complete(run) == (newer, [])
    assert newest_complete(run, verify=True)[0] is None
    # every checkpoint damaged: refused, naming each, never started over (#35)
    with pytest.raises(
        CheckpointError,
        match=r"no checkpoint of run .*/r can be resumed.*checkpoint-4: model\.safetensors does not match.*"
        r"checkpoint-2: ema\.safetensors changed size since it was saved",
    ):
        resolve_resume("auto", tmp_path / "output", run)


def test_a_marker_without_checksums_still_resumes_with_a_note(tmp_path):
    ck = real_checkpoint(tmp_path / "r", 5)
    meta = json.loads((ck / COMPLETE).read_text())
    (ck / COMPLETE).write_text(json.dumps({"step": 5, "files": meta["files"]}))  # as written before checksums
    found, notes = resolve_resume(str(ck), tmp_path, None)
    assert found == ck
    assert notes == ["checkpoint-5 has no checksums (saved by an earlier taehv-launch): resuming it unverified"]
    found, notes = resolve_resume("auto", tmp_path, tmp_path / "r")
    assert found == ck and "unverified" in notes[0]


def test_launcher_refuses_a_damaged_checkpoint_in_one_line(tmp_path):
    from conftest import assert_one_line_error

    ck = real_checkpoint(tmp_path / "output" / "d", 6)
    flip_a_byte(ck / "ema.safetensors", offset=100)
    before = sorted(p.name for p in (tmp_path / "output" / "d").iterdir())
    proc, _ = launch(tmp_path, 1, "--resume", str(ck), run_name="d")
    assert_one_line_error(proc, r"checkpoint .*checkpoint-6 is damaged: ema\.safetensors does not match")
    assert sorted(p.name for p in (tmp_path / "output" / "d").iterdir()) == before


@pytest.mark.slow
def test_disk_full_while_saving_stops_in_one_line_and_keeps_the_previous_checkpoint(tmp_path):
    """RLIMIT_FSIZE (a file size limit, as `ulimit -f`) below the largest file of a checkpoint: writing
    checkpoint-4 fails the way a full disk does (EFBIG instead of ENOSPC)."""
    import resource

    from conftest import assert_one_line_error

    common = overrides("checkpointing_steps=2 validation_steps=100")
    proc, run = launch(tmp_path, 1, *common, "--set", "max_train_steps=2", run_name="full")
    ok(proc)
    sizes = sorted((p.stat().st_size, p.name) for p in (run / "checkpoint-2").iterdir())
    limit = (sizes[-1][0] + sizes[-2][0]) // 2  # the largest file cannot be written, the rest can

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    import subprocess

    from conftest import CLI, clean_env, free_port

    env = clean_env(TAEHV_CACHE=str(tmp_path.parent / "taehv-cache"), OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [
            *CLI,
            "1",
            "cpu",
            "--run-name",
            "full",
            "--master-port",
            str(free_port()),
            *overrides(f"output_dir='{tmp_path / 'output'}'", "log_every=1 dataloader_num_workers=0"),
            *common,
            *overrides("max_train_steps=4"),
            "--resume",
            "auto",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
        preexec_fn=small_files,
    )
    assert_one_line_error(
        proc,
        r"could not write checkpoint-4 .*(File too large|a write failed).*at most \d+ MiB \(ulimit -f\).*--resume auto from "
        r"checkpoint-2, which is complete",
        code=1,
    )
    assert "Traceback" not in proc.stdout
    names = sorted(p.name for p in run.iterdir() if "checkpoint" in p.name)
    assert names == ["checkpoint-2"], names  # no half folder under any name
    assert resolve_resume("auto", tmp_path / "output", run) == (run / "checkpoint-2", [])
    proc, _ = launch(tmp_path, 1, *common, "--set", "max_train_steps=3", "--resume", "auto", run_name="full")
    ok(proc)
    assert "checkpoint-2 at step 2" in proc.stdout
