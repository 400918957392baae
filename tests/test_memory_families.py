"""The memory model per family and decoder (issue #36): the Super decoder's rule against the points measured
on one H100 (docs/evidence/super_decoder/), a new family's measured figures as one record change, and the
plan's memory line for each, the dry run's model line, and TAEHV's own trim rule (one small CPU check)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from taehv_launch.plan import families, memory
from taehv_launch.plan.families import FAMILIES
from conftest import overrides, run_cli_here
from test_family_plan import plan_for

EVIDENCE = Path(__file__).resolve().parent.parent / "docs" / "evidence" / "families"


def test_the_super_rule_reproduces_every_measured_point():
    """Super peak = base peak x the micro-4 ratio: within 0.08 GiB of the six other measured points."""
    for ckpt, points in memory.SUPER_STEP_MEASURED.items():
        for micro, (base, sup) in points.items():
            assert base * memory.SUPER_STEP_RATIO[ckpt] == pytest.approx(sup, abs=0.08), (ckpt, micro)
        fixed, per_clip = memory.STEP_FIT[ckpt]  # the base fit agrees with the base points measured that day
        for micro, (base, _) in points.items():
            assert fixed + per_clip * micro == pytest.approx(base, abs=0.1), (ckpt, micro)


def test_the_super_decoder_is_counted_and_can_stop_a_row_from_fitting():
    base = plan_for(1, "h100").memory
    sup = plan_for(1, "h100", decoder_arch="super").memory
    assert base.fits and base.best_micro == 8
    step = memory.STEP_FIT[False][0] + memory.STEP_FIT[False][1] * 8
    # the base step's compile_layout saving (measured on the base decoder only) is not counted for Super
    assert sup.predicted_gib - base.predicted_gib == pytest.approx(
        step * (memory.SUPER_STEP_RATIO[False] - 1) + memory.LAYOUT_FORCE_SAVED_GIB, abs=0.01
    )
    assert sup.fits is False and sup.best_micro is not None and sup.best_micro < 8  # 8 x 8.6 GiB does not fit 72
    assert "micro_batch_size=" in sup.detail
    ckpt = plan_for(1, "h100", decoder_arch="super", gradient_checkpointing=True).memory
    assert ckpt.fits and ckpt.predicted_gib < sup.predicted_gib


@pytest.mark.parametrize("name", ["wan22", "hunyuan15", "ltx2", "ltx23", "h3"])
def test_a_new_family_is_predicted_from_the_measured_figures_in_its_record(monkeypatch, name):
    """Measured (docs/evidence/families/): encode_gib and step_fit in the record, and the plan predicts from
    them; a record without them: 'not predicted'."""
    fam = FAMILIES[name]
    plan = plan_for(1, "h100", ref_vae_type=name)
    mem = plan.memory
    n, h, w = fam.step_frames()
    assert (plan.config["n_frames"], plan.config["height"], plan.config["width"]) == (n, h, w)
    micro = plan.config["micro_batch_size"]
    fixed, per_clip = fam.step_fit[False]
    expect = memory.TRAINER_OVERHEAD_GIB + max(fixed + per_clip * micro, fam.encode_gib) + memory.CUDA_CONTEXT_GIB
    assert mem.fits and mem.predicted_gib == pytest.approx(expect + memory.decode_gib(plan.config), abs=1e-6)
    # twice the frames: twice the per-clip step; the checkpointed step was not measured: not predicted
    longer = plan_for(1, "h100", ref_vae_type=name, n_frames=fam.first_valid(2, start=2 * n)[0])
    assert longer.memory.predicted_gib > mem.predicted_gib
    ckpt = plan_for(1, "h100", ref_vae_type=name, gradient_checkpointing=True).memory
    assert ckpt.predicted_gib is None and "with gradient checkpointing" in ckpt.detail
    # a --set that changes TAEHV's channels is another model: its step is not the record's
    other = plan_for(1, "h100", ref_vae_type=name, latent_channels=fam.latent_channels * 2).memory
    assert other.predicted_gib is None and "not predicted" in other.detail
    monkeypatch.setitem(families.FAMILIES, name, dataclasses.replace(fam, encode_gib=None, step_fit={}))
    assert "not predicted" in plan_for(1, "h100", ref_vae_type=name).memory.detail


@pytest.mark.parametrize("name", ["wan22", "hunyuan15", "ltx2", "h3"])
def test_the_records_hold_the_h100_measurements(name):
    """The record's figures are docs/evidence/families/memory/'s: encode_gib the one-clip chunk-1 peak, step_fit
    the line through the micro 1 and largest measured micro peaks, within 0.08 GiB of every measured micro;
    a micro that ran out of memory is above the record's max_micro."""
    fam, ev = FAMILIES[name], EVIDENCE / "memory"
    encode = json.loads((ev / f"encode_{name}_c1.json").read_text())["rows"][0]
    assert (encode["micro"], encode["chunk"]) == (1, 1) and fam.encode_gib == round(encode["peak_gib"], 2)
    rows = json.loads((ev / f"step_{name}.json").read_text())["rows"]
    fixed, per_clip = fam.step_fit[False]
    for r in rows:
        assert r["checkpointing"] is False and r["decoder_arch"] == "base"
        if r.get("oom"):
            assert 0 < fam.max_micro < r["micro"]
        else:
            assert fixed + per_clip * r["micro"] == pytest.approx(r["peak_gib"], abs=0.08), r["micro"]
    step = json.loads((ev / f"step_{name}.json").read_text())
    assert (step["n_frames"], step["height"], step["width"]) == fam.step_frames()
    assert FAMILIES["ltx23"].step_fit == FAMILIES["ltx2"].step_fit  # ltx2's measurement, same architecture


def test_measured_shapes_are_the_profiles_clip():
    for fam in FAMILIES.values():
        n, h, w = fam.step_frames()
        assert fam.valid_n_frames(n) and h % fam.space_stride == 0 and w % fam.space_stride == 0
    assert FAMILIES["cogvideox"].step_frames() == (12, 480, 720)  # STEP_FIT's and encode_gib's shape


@pytest.mark.parametrize(
    "sets, line",
    [
        ((), "TAEHV, base decoder (patch 1, 16 latent channels, 4x in time); exports final_model/taecvx.pth"),
        (
            ("ref_vae_type='taew2_2'", "decoder_arch='super'"),
            "TAEHV, super decoder (patch 2, 48 latent channels, 4x in time); exports final_model/taew2_2_super.pth",
        ),
        (("ref_vae_type='ltx23'",), "(patch 4, 128 latent channels, 8x in time); exports final_model/taeltx2_3.pth"),
    ],
)
def test_the_dry_run_names_the_model_and_its_export(tmp_path, sets, line):
    from test_family_plan import dry_json

    args = overrides(*sets)
    proc = run_cli_here("1", "h100", "--dry-run", *args, "--set", f"output_dir={str(tmp_path / 'o')!r}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    model_lines = [x for x in proc.stdout.splitlines() if x.startswith("  model     ")]
    assert len(model_lines) == 1 and model_lines[0].endswith(f"{line} + .safetensors"), model_lines
    model = dry_json(tmp_path, "1", "h100", *args)["model"]
    assert model["exports"][0] == line.split("exports ")[1] and model["exports"][1].endswith(".safetensors")


def test_taehv_of_a_family_applies_its_trim_rule_itself():
    """evaluate.py decodes with TAEHV's own rule (build_taehv gives it the family's): the same frames as
    passing the family's trims() by hand, for every family and 1-8 latents."""
    import torch

    from taehv_launch.train.model.taehv import TAEHV

    with torch.no_grad():
        for fam in FAMILIES.values():
            model = TAEHV.from_family(fam, latent_channels=4).eval()
            for n in range(1, 9):
                z = torch.randn(1, n, 4, 1, 1)
                assert torch.equal(model.decode_video(z), model.decode_video(z, trim=fam.trims(n))), (fam.name, n)
                assert model.decode_video(z).shape[1] == fam.decoded_frames(n), (fam.name, n)
