"""Review of #39 (#36's rule for a resume): a resumed run predicts from its own speed.json only when that figure
was measured on the resumed config's reference family and path (online or from the latent cache), which
speed.json now records; otherwise (and from an older speed.json without them) from the measured table as a new
run does, and the line says why the run's own figure was not used."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from conftest import clean_env
from taehv_launch.plan.scaling import MEASURED, measured_on, predict, run_figure
from taehv_launch.plan.schema import DEFAULTS, make_config
from taehv_launch.train.loop.speed import speed_record

CFG = {**DEFAULTS, "micro_batch_size": 8, "gradient_accumulation_steps": 1, "zero_stage": 0, "max_train_steps": 1000}


def test_speed_json_records_the_family_and_the_path_of_its_figure():
    assert speed_record(make_config({"ref_vae_type": "h3", "latent_cache": "/lc"})) == {
        "ref_vae_type": "h3",
        "latent_cache": True,
    }
    assert speed_record(make_config({})) == {"ref_vae_type": DEFAULTS["ref_vae_type"], "latent_cache": False}
    assert measured_on({**CFG, "latent_cache": ""})["latent_cache"] is False


def test_the_runs_own_figure_is_used_only_for_the_same_family_and_path():
    online = {"clips_per_s_per_gpu": 4.0, "world_size": 16, **measured_on(CFG)}
    p = predict("h100", CFG, 16, 2, from_step=500, run_speed=online)
    assert p.clips_per_s_per_gpu == 4.0 and p.basis == "this run's own speed.json"
    assert p.hours == pytest.approx(500 * 8 / 4.0 / 3600)

    cached = {**CFG, "latent_cache": "/lc"}  # resumed from the latent cache: the online figure is not its speed
    p = predict("h100", cached, 16, 2, from_step=500, run_speed=online)
    table = MEASURED["h100", "cogvideox", True].clips_per_s
    assert p.clips_per_s_per_gpu == pytest.approx(table * p.efficiency)
    assert p.basis.startswith(
        "this run's speed.json was measured on ref_vae_type=cogvideox online, not ref_vae_type=cogvideox from the "
        'latent cache: not used; model: docs/benchmarks.md "Scaling to 64 GPUs"'
    )
    h3 = {**CFG, "ref_vae_type": "h3"}  # another family
    p = predict("h100", h3, 16, 2, run_speed=online)
    assert p.clips_per_s_per_gpu == pytest.approx(0.40 * p.efficiency) and "not ref_vae_type=h3 online" in p.basis
    assert predict("a800", h3, 16, 2, run_speed=online) is None  # no table figure either: none, as a new run


def test_an_older_speed_json_without_the_record_is_not_used_and_the_line_says_so():
    old = {"clips_per_s_per_gpu": 4.0, "world_size": 16}  # written before ref_vae_type and latent_cache were
    p = predict("h100", CFG, 16, 2, from_step=500, run_speed=old)
    assert p.clips_per_s_per_gpu != 4.0
    assert p.basis.startswith(
        "this run's speed.json does not say which ref_vae_type and path (online or latent cache) it was measured "
        "on (written before they were recorded): not used; model:"
    )
    assert p.line(16, 1000).endswith(f"({p.basis})")  # the dry run's `predicted` line carries it
    for bad in ({**old, "ref_vae_type": 3, "latent_cache": False}, {**old, "ref_vae_type": "cogvideox"}):
        assert run_figure(bad, CFG)[0] is None
    assert run_figure({**old, **measured_on(CFG), "clips_per_s_per_gpu": "fast"}, CFG)[0] is None


def test_a_resume_reads_its_runs_speed_json_and_matches_it(tmp_path):
    """run/request.py's prediction on a real plan: the checkpoint's step and the run's own speed.json."""
    from taehv_launch.run.request import Request, build_plan, prediction

    plan = build_plan(Request(gpus="8", profile="h100"), env=clean_env())
    run = tmp_path / "run"
    ckpt = run / "checkpoint-400"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": 400, "world_size": 8, "zero_stage": 0}))
    plan = replace(plan, options=replace(plan.options, resume=str(ckpt)))
    speed = {"clips_per_s_per_gpu": 3.0, "world_size": 8}
    (run / "speed.json").write_text(json.dumps(speed))
    p = prediction(plan)
    assert p.from_step == 400 and p.clips_per_s_per_gpu != 3.0 and "written before they were recorded" in p.basis
    (run / "speed.json").write_text(json.dumps(speed | measured_on(plan.config)))
    p = prediction(plan)
    assert p.clips_per_s_per_gpu == 3.0 and p.basis == "this run's own speed.json"
    (run / "speed.json").write_text(json.dumps(speed | measured_on(plan.config) | {"world_size": 16}))
    assert prediction(plan).basis.startswith("model: ")  # another world size: the table, as before
