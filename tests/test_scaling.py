"""The plan's predicted speed (#28): the scaling model's arithmetic, and the dry run's line."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli_here
from taehv_launch.plan.scaling import TAEHV_GRAD_BYTES, allreduce_s, efficiency, predict
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
