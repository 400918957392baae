"""The trainer end to end, through the launcher: real accelerate launch, real files, CPU."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from conftest import assert_one_line_error, overrides, run_cli
from trainrun import launch, ok, scalars, trainer_state

TB_KEYS = [
    "train/loss",
    "train/reconstruction_loss",
    "train/encoder_loss",
    "train/seraena_loss",
    "train/disc_loss",
    "train/psnr",
    "train/learning_rate",
    "train/samples_per_second",
    "train/gpu_memory_gb",
    "val/psnr",
    "val/ssim",
    "val/flicker",  # as `taehv-launch eval` measures it (#37); val/lpips only where LPIPS's weights are local
]


def tb_images(run_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = []
    for f in sorted((run_dir / "logs").glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(f), size_guidance={"images": 0})
        acc.Reload()
        if tag in acc.Tags()["images"]:
            out += acc.Images(tag)
    return out


@pytest.mark.slow  # ~57 s, two trainer runs; a real trainer run stays fast in the non-finite test below
def test_demo_trains_checkpoints_exports_and_resumes(tmp_path):
    proc, run = launch(tmp_path, 1, "--set", "max_train_steps=4")
    ok(proc)
    assert "processes 1" in proc.stdout and "demo: data_root is the built-in synthetic set" in proc.stdout
    assert "Setting accelerator to CPU" not in proc.stdout + proc.stderr  # DeepSpeed's probe warning
    tb = scalars(run)
    for key in TB_KEYS:
        assert key in tb, f"{key} missing from TensorBoard: {sorted(tb)}"
    assert [s for s, _ in tb["train/loss"]] == [1, 2, 3, 4]
    assert all(math.isfinite(v) for _, v in tb["train/loss"])
    assert tb["train/gpu_memory_usage"] == tb["train/gpu_memory_gb"]  # the seeds' dashboards' name too
    gif = tb_images(run, "val/video_0")[-1]  # input | reconstruction, animated, at each validation
    assert gif.encoded_image_string.startswith(b"GIF8") and gif.width == 2 * gif.height
    for name in ("checkpoint-2", "checkpoint-4"):
        assert (run / name / "COMPLETE").is_file()
    assert trainer_state(run / "checkpoint-4")["step"] == 4
    for folder in ("final_model", "best_model"):
        sd = load_file(str(run / folder / "taecvx.safetensors"))  # upstream's name for cogvideox (#36)
        assert sd["encoder.0.weight"].shape == (64, 3, 3, 3)
        assert torch.load(run / folder / "taecvx.pth", weights_only=True).keys() == sd.keys()
    assert (run.parent / "latest").resolve() == run.resolve()
    for f in ("config.py", "accelerate.yaml", "env.json", "launch.log"):
        assert (run / f).is_file()
    val = json.loads((run / "validation.json").read_text())  # the newest validation, for `status`
    assert val["step"] == 4 and val["flicker"] >= 0 and val["best_step"] in (2, 4) and val["clips"] == 1, val
    assert val["psnr"] == pytest.approx(tb["val/psnr"][-1][1]) and val["flicker"] == pytest.approx(
        tb["val/flicker"][-1][1]
    )
    assert ("val/lpips" in tb) == (val["lpips"] is not None) and proc.stdout.count("validation: LPIPS n/a") == (
        val["lpips"] is None
    )
    assert (
        f"validation at step 4: psnr {val['psnr']:.2f} dB, ssim {val['ssim']:.4f}, flicker {val['flicker']:.4f}"
        in proc.stdout
    )
    status = run_cli("status", str(run))
    assert status.returncode == 0 and "  validation step 4: PSNR " in status.stdout, status.stdout + status.stderr

    # --resume auto continues at the saved step: TensorBoard steps continue, they do not restart
    proc, _ = launch(tmp_path, 1, "--resume", "auto", "--set", "max_train_steps=6")
    ok(proc)
    assert "resumed from" in proc.stdout and "at step 4" in proc.stdout
    steps = [s for s, _ in scalars(run)["train/loss"]]
    assert steps == [1, 2, 3, 4, 5, 6], steps
    assert trainer_state(run / "checkpoint-6")["step"] == 6


def test_resume_of_a_missing_checkpoint_is_one_line(tmp_path):
    proc, run = launch(tmp_path, 1, "--resume", str(tmp_path / "nope"))
    assert_one_line_error(proc, "does not exist")
    assert not run.exists()  # nothing was created


@pytest.mark.slow  # the fast suite has the data-root cases of test_bad_inputs
def test_empty_dataset_is_one_line(tmp_path):
    empty = tmp_path / "videos"
    empty.mkdir()
    proc, _ = launch(tmp_path, 1, "--set", f"data_root='{empty}'")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "error:" in proc.stderr and "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_real_videos_reconstruction_loss_goes_down(tmp_path, videos):
    proc, run = launch(
        tmp_path,
        1,
        *overrides(
            f"data_root='{videos}'",
            "max_train_steps=30 use_seraena=False validation_steps=30 checkpointing_steps=30",
            "learning_rate=1e-3 lr_warmup_steps=3",
        ),
    )
    ok(proc)
    assert "skipping unreadable or unusable video" in proc.stdout  # empty.webm and friends, logged once
    rec = [v for _, v in scalars(run)["train/reconstruction_loss"]]
    first, last = sum(rec[:5]) / 5, sum(rec[-5:]) / 5
    assert last < 0.7 * first, (first, last)


def _check_two_ranks(run, proc):
    ok(proc)
    assert "processes 2" in proc.stdout  # accelerator.num_processes inside the run
    state = trainer_state(run / "checkpoint-4")
    assert state["world_size"] == 2
    a = torch.load(run / "checkpoint-4" / "seraena_rank0.pt", weights_only=True)["disc"]
    b = torch.load(run / "checkpoint-4" / "seraena_rank1.pt", weights_only=True)["disc"]
    assert a.keys() == b.keys()
    for k in a:  # parameters and BatchNorm buffers alike
        assert torch.equal(a[k], b[k]), k
    tb = scalars(run)
    assert all(math.isfinite(v) for _, v in tb["train/loss"])
    assert [s for s, _ in tb["train/straggler_ratio"]] == [3, 4]  # each log line but the first two steps
    val = json.loads((run / "validation.json").read_text())  # sums all-reduced over both ranks' clips
    assert val["step"] == 4 and val["clips"] == 2 and val["flicker"] == pytest.approx(tb["val/flicker"][-1][1])


@pytest.mark.slow
@pytest.mark.parametrize("zero", [0, 2])
def test_two_ranks_ddp_and_zero2_then_resume(tmp_path, zero):
    proc, run = launch(tmp_path, 2, *overrides("max_train_steps=4", f"zero_stage={zero}"))
    _check_two_ranks(run, proc)
    proc, _ = launch(tmp_path, 2, "--resume", "auto", *overrides("max_train_steps=6", f"zero_stage={zero}"))
    ok(proc)
    assert "at step 4" in proc.stdout
    assert [s for s, _ in scalars(run)["train/loss"]] == [1, 2, 3, 4, 5, 6]


@pytest.mark.slow  # ~1 min of trainer runs: the slow job
def test_profile_and_debug_and_accumulation(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:  # the two runs side by side: their start-up is mostly single-threaded imports
        dbg = pool.submit(launch, tmp_path, 1, "--debug", "--set", "max_train_steps=2", run_name="dbg")
        proc, run = launch(
            tmp_path,
            1,
            "--profile",
            *overrides("max_train_steps=4 profile_steps=2 gradient_accumulation_steps=2 seraena_crop=32"),
            run_name="prof",
        )
        dbg = dbg.result()
    ok(proc)
    speed = json.loads((run / "speed.json").read_text())  # steady-state throughput, for bench --compare
    assert speed["steps"] == 2 and speed["from_step"] == 2 and speed["clips_per_s"] > 0, speed
    assert "reference VAE encode" in speed["phases"]
    assert "where a step's time goes (steps 3-4, after the warm-up" in proc.stdout  # speed.json's window
    assert "outside the phases" in proc.stdout
    for phase in ("reference VAE encode", "TAEHV forward", "Seraena", "backward + optimizer", "data"):
        assert phase in proc.stdout, phase
    assert list((run / "logs" / "profile").glob("*.pt.trace.json*")), "no torch.profiler trace written"
    for noise in ("USDT:", "CPUAllocator"):  # the profiler's own chatter (#15)
        assert noise not in proc.stdout + proc.stderr + (run / "launch.log").read_text(), noise
    assert [s for s, _ in scalars(run)["train/loss"]] == [1, 2, 3, 4]  # optimizer steps, not micro-batches
    lrs = [v for _, v in scalars(run)["train/learning_rate"]]
    assert lrs[0] == pytest.approx(1e-4) and lrs[1] == pytest.approx(2e-4)  # warmup 5 at 5e-4, per optimizer step

    proc, run = dbg
    ok(proc)
    assert "[rank 0] step 1/2" in proc.stdout  # per-rank verbose logs
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in proc.stdout


@pytest.mark.slow
def test_non_finite_losses_are_skipped_then_stop_the_run(tmp_path):
    """Weights with NaNs: every step is non-finite, skipped on all ranks, and with no checkpoint to roll back to
    (tests/test_divergence.py has the rollbacks) the run stops clearly."""
    from safetensors.torch import save_file

    from taehv_launch.train.model.taehv import TAEHV

    sd = TAEHV(latent_channels=4).state_dict()
    sd["decoder.1.weight"] = torch.full_like(sd["decoder.1.weight"], float("nan"))
    bad = tmp_path / "nan.safetensors"
    save_file(sd, str(bad))
    proc, run = launch(
        tmp_path,
        1,
        *overrides(f"pretrained_model_path='{bad}'", "max_consecutive_bad_steps=3 max_train_steps=10"),
        run_name="nan",
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.count("step 0: non-finite loss on rank 0; micro-batch skipped on all ranks") == 3
    assert_one_line_error(
        proc,
        r"3 bad micro-batches in a row \(the last: non-finite loss on rank 0\) at step 0, and the run has no "
        "complete checkpoint to roll back to: lower learning_rate",
        code=1,
    )
    assert not list(run.glob("checkpoint-*"))
