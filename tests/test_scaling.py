"""The plan's predicted speed (#28): the scaling model's arithmetic, and the dry run's line."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli_here
from taehv_launch.plan.scaling import TAEHV_GRAD_BYTES, allreduce_s, efficiency, predict, unpredicted
from taehv_launch.plan.schema import DEFAULTS


def test_allreduce_is_the_ring_formula():
    assert allreduce_s(1, 1, TAEHV_GRAD_BYTES) == 0.0
    assert allreduce_s(8, 1, 1e9, nvlink_gbps=100) == pytest.approx(2 * 7 / 8 * 1e9 / 100e9)
    assert allreduce_s(16, 2, 1e9, network_gbps=10) == pytest.approx(2 * 15 / 16 * 1e9 / 10e9)


def test_efficiency_falls_with_slower_networks_and_zero3():
    fast = efficiency(64, 8, 4, 8.65)
    assert 0.98 < fast < 1.0
    assert efficiency(64, 8, 4, 8.65, network_gbps=1.0) < fast  # the bandwidth is an input
    assert efficiency(64, 8, 4, 8.65, zero=3) == pytest.approx(0.90, abs=0.02)
    assert efficiency(1, 1, 128, 8.65) == pytest.approx(1.0)


def test_prediction_time_and_gpu_hours():
    cfg = {
        **DEFAULTS,
        "micro_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "zero_stage": 0,
        "max_train_steps": 1000,
    }
    p = predict("h100", cfg, 16, 2)
    assert p.hours == pytest.approx(1000 * 8 / p.clips_per_s_per_gpu / 3600)
    assert p.gpu_hours == pytest.approx(16 * p.hours)
    assert predict("a800", cfg, 16, 2) is None  # nothing measured: no guess
    own = predict("a800", cfg, 16, 2, from_step=500, run_clips_per_s_per_gpu=4.0)  # a resumed run's own speed
    assert own.hours == pytest.approx(500 * 8 / 4.0 / 3600) and own.basis == "this run's own speed.json"


def test_the_dry_run_prints_the_prediction(tmp_path):
    out = run_cli_here("64", "h100", "--dry-run", cwd=tmp_path).stdout
    line = next(x for x in out.splitlines() if x.startswith("  predicted ~"))
    assert "clips/s per GPU" in line and "100000 steps in" in line and "GPU-hours" in line
    d = json.loads(run_cli_here("64", "h100", "--dry-run", "--json", cwd=tmp_path).stdout)
    assert d["predicted"]["efficiency"] > 0.97
    assert json.loads(run_cli_here("8", "a800", "--dry-run", "--json", cwd=tmp_path).stdout)["predicted"] is None
    assert "  predicted ~" not in run_cli_here("1", "cpu", "--dry-run", cwd=tmp_path).stdout


def test_each_family_and_path_is_predicted_only_from_its_own_measurement(tmp_path):
    """A family's speed is its own (h3 online runs at 1/20 of cogvideox's): a figure is used for the family,
    the path (online or from the latent cache) and the profile it was measured on, and nothing else."""
    cfg = {**DEFAULTS, "micro_batch_size": 4, "gradient_accumulation_steps": 1, "zero_stage": 0}
    rate = {}
    for fam in ("cogvideox", "wan22", "hunyuan15", "ltx2", "ltx23", "h3"):
        for cache in ("", "/lc"):
            rate[fam, cache] = predict(
                "h100", {**cfg, "ref_vae_type": fam, "latent_cache": cache}, 1, 1
            ).clips_per_s_per_gpu
    assert rate["h3", ""] == pytest.approx(0.40) and rate["h3", "/lc"] == pytest.approx(12.16)
    assert rate["cogvideox", ""] == pytest.approx(8.65) and rate["cogvideox", "/lc"] > rate["cogvideox", ""]
    assert rate["ltx23", "/lc"] == rate["ltx2", "/lc"]
    for fam in ("hunyuan", "wan"):  # never measured on any profile
        assert predict("h100", {**cfg, "ref_vae_type": fam}, 1, 1) is None
    assert predict("h200", {**cfg, "ref_vae_type": "h3"}, 1, 1) is None  # measured on h100 only
    assert "ref_vae_type=wan online" in unpredicted("h100", {**cfg, "ref_vae_type": "wan"})
    assert "from the latent cache" in unpredicted("h200", {**cfg, "ref_vae_type": "h3", "latent_cache": "/lc"})
    out = run_cli_here("1", "h100", "--dry-run", "--set", "ref_vae_type=wan", cwd=tmp_path).stdout
    assert "  predicted none: no speed of ref_vae_type=wan online was measured on h100" in out
    out = run_cli_here("1", "h100", "--dry-run", "--set", "ref_vae_type=h3", cwd=tmp_path).stdout
    assert "  predicted ~0.40 clips/s per GPU" in out and "measured at micro 4 on one H100" in out


def test_plan_times_read_well_from_seconds_to_days():
    """#38 item 4: a short job's plan says minutes and fractional GPU-hours, not '0.0 h, 0 GPU-hours'."""
    from taehv_launch.plan.scaling import duration_text, gpu_hours_text

    assert [duration_text(s) for s in (0.2, 28, 59.4, 60, 444, 3569, 3600, 46_440, 172_000, 1_477_000)] == [
        "under 1 s",
        "28 s",
        "59 s",
        "1 min",
        "7 min",
        "59 min",
        "1.0 h",
        "12.9 h",
        "47.8 h",
        "17.1 days",
    ]
    assert [gpu_hours_text(h) for h in (0.0002, 0.0077, 0.067, 0.123, 1.33, 9.96, 828.4)] == [
        "under 0.001",
        "0.008",
        "0.07",
        "0.1",
        "1.3",
        "10",
        "828",
    ]


def test_a_short_jobs_dry_run_says_minutes_and_fractional_gpu_hours(tmp_path):
    from taehv_launch.plan.scaling import duration_text, gpu_hours_text

    cfg = {**DEFAULTS, "micro_batch_size": 8, "gradient_accumulation_steps": 16, "zero_stage": 0, "max_train_steps": 30}
    p = predict("h100", cfg, 1, 1)  # the 1-GPU h100 row: micro 8 x accumulation 16
    out = run_cli_here("1", "h100", "--dry-run", "--set", "max_train_steps=30", cwd=tmp_path).stdout
    line = next(x for x in out.splitlines() if x.startswith("  predicted ~"))
    assert f": 30 steps in {duration_text(p.hours * 3600)}, {gpu_hours_text(p.gpu_hours)} GPU-hours (" in line, line
    assert " 0 GPU-hours" not in line and "0.0 h" not in line
