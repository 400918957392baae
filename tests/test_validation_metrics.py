"""Validation during training measures what `taehv-launch eval` measures (#37 item 1): the trainer's
evaluate() and eval's end-to-end part give the same PSNR, SSIM, flicker and LPIPS for the same weights on
the same held-out clips (one shared clip_scores, train/loop/metrics.py); `taehv-launch status` shows the
newest validation from <run>/validation.json, from an older trainer's launch.log line (no flicker: n/a,
no error) and from a damaged record (its bad fields unknown). The trainer writing them: test_trainer.py's
slow runs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from conftest import run_cli_here
from taehv_launch.rundir.progress import VALIDATION_FILE, write_validation
from taehv_launch.rundir.exitstatus import exit_status_path, write_exit_status
from taehv_launch.watch.status import collect
from taehv_launch.watch.statustext import run_block

OLD_LINE = "validation at step 40: psnr 11.20 dB, ssim 0.2678 (EMA model)"  # docs/evidence/cpu_demo_loaded.txt


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    import torch
    from safetensors.torch import save_file

    from taehv_launch.plan.families import get_family
    from taehv_launch.train.model.taehv import TAEHV

    torch.manual_seed(3)
    model = TAEHV.from_family(get_family("cogvideox"), latent_channels=4)
    path = tmp_path_factory.mktemp("val") / "taecvx.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path), metadata={"family": "cogvideox"})
    return path


def test_validation_measures_as_eval_does(weights, videos, capsys):
    import torch

    from taehv_launch.plan.schema import make_config
    from taehv_launch.quality.measure import Options, held_out_clips, run
    from taehv_launch.quality.weights import describe, load_model
    from taehv_launch.train.loop.evaluate import evaluate, log_line

    def options() -> Options:
        return Options(weights=[str(weights)], data_root=str(videos), height=64, width=64, n_frames=8, as_json=True)

    assert run(options()) == 0
    e2e = json.loads(capsys.readouterr().out)["results"][0]["end_to_end"]
    clips = held_out_clips(options(), 8)  # the trainer's split and clips, as eval picked them
    model = load_model(describe(str(weights), None, None), torch.device("cpu"))
    cfg = make_config({"max_validation_batches": len(clips), "num_sample_clips": 1})
    val_ds = [{"frames": c} for c in clips]
    m, samples = evaluate(model, None, val_ds, cfg, torch.device("cpu"), 0, 1)  # no reference: end to end
    assert m["clips"] == len(clips) and len(samples) == 1
    for k in ("psnr", "ssim", "flicker"):
        assert m[k] == pytest.approx(e2e[k], rel=1e-5, abs=1e-7), (k, m[k], e2e[k])
    assert m["lpips"] is None and e2e["lpips"] is None or m["lpips"] == pytest.approx(e2e["lpips"], rel=1e-5)
    line = log_line(m, 7)
    assert line.startswith("validation at step 7: psnr ") and ", flicker 0." in line and line.endswith(" clip)")


def _run_dir(tmp_path: Path, log: str) -> Path:
    run = tmp_path / "output" / "r"
    run.mkdir(parents=True)
    (run / "launch.log").write_text(log)
    write_exit_status(exit_status_path(run, 0), 0, "ok")
    return run


def _status(run: Path) -> tuple[str, dict]:
    text = run_cli_here("status", str(run))
    assert text.returncode == 0 and not text.stderr, text.stderr
    js = run_cli_here("status", str(run), "--json")
    assert js.returncode == 0, js.stderr
    return text.stdout, json.loads(js.stdout)["runs"][0]["validation"]


def test_status_shows_the_newest_validation(tmp_path):
    now = time.time()
    run = _run_dir(tmp_path, OLD_LINE + "\n")  # validation.json wins over the log's line
    record = {"step": 6, "time": now - 200, "model": "ema", "clips": 2, "psnr": 12.345, "ssim": 0.25}
    write_validation(run, {**record, "flicker": 0.01234, "lpips": None, "lpips_note": "LPIPS n/a: no lpips"})
    write_validation(run, {**record, "flicker": 0.01234, "lpips": 0.3, "best_step": 4, "best_psnr": 12.5})
    text, v = _status(run)
    line = next(x for x in text.splitlines() if x.startswith("  validation "))
    assert line == (
        "  validation step 6: PSNR 12.35 dB, SSIM 0.2500, flicker 0.0123, LPIPS 0.3000 (EMA model, 2 clips, "
        "3 min ago; validation.json); best PSNR 12.50 dB at step 4"
    ), line
    assert v["step"] == 6 and v["flicker"] == 0.01234 and v["lpips"] == 0.3 and v["from"] == VALIDATION_FILE
    assert (v["best_step"], v["best_psnr"], v["clips"], v["model"]) == (4, 12.5, 2, "ema")
    assert collect(run, now)["validation"] == v


def test_status_of_a_run_from_an_older_trainer(tmp_path):
    """No validation.json, a validation line without flicker or LPIPS: shown, n/a for those, no error."""
    run = _run_dir(tmp_path, "step 40/40 | loss 0.4900\n" + OLD_LINE + "\ndone: 40 steps\n")
    text, v = _status(run)
    assert "  validation step 40: PSNR 11.20 dB, SSIM 0.2678, flicker n/a, LPIPS n/a (EMA model; launch.log)" in text
    assert v == {
        "step": 40,
        "time": None,
        "model": "ema",
        "clips": None,
        "psnr": 11.2,
        "ssim": 0.2678,
        "flicker": None,
        "lpips": None,
        "lpips_note": None,
        "best_step": None,
        "best_psnr": None,
        "from": "launch.log",
    }
    new = "validation at step 42: psnr 12.00 dB, ssim 0.3000, flicker 0.0100, lpips n/a (EMA model, 2 clips)"
    (run / "launch.log").write_text(OLD_LINE + "\n" + new + "\n")
    assert collect(run)["validation"]["step"] == 42 and collect(run)["validation"]["flicker"] == 0.01


@pytest.mark.parametrize(
    "record, expect",
    [
        ({"step": 3, "psnr": 10.0, "ssim": 0.5}, {"flicker": None, "lpips": None, "psnr": 10.0}),  # no flicker field
        ({"step": 3, "psnr": "10", "ssim": True, "flicker": -1, "lpips": float("nan")}, {"psnr": None, "ssim": None}),
        ({"step": 3, "time": "x", "clips": 1.5, "best_step": "4", "model": 7}, {"time": None, "clips": None}),
    ],
)
def test_status_of_an_older_or_damaged_record(tmp_path, record, expect):
    run = _run_dir(tmp_path, "")
    (run / VALIDATION_FILE).write_text(json.dumps(record))
    text, v = _status(run)
    assert "  validation step 3: PSNR " in text
    assert {k: v[k] for k in expect} == expect
    assert not any(x.startswith("  validation") for x in run_block({**collect(run), "validation": None}))


def test_no_validation_no_line(tmp_path):
    run = _run_dir(tmp_path, "[rank 0] validation at step x\n")
    text, v = _status(run)
    assert v is None and "  validation " not in text
