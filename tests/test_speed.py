"""The speed levers' CPU-testable parts: lazy scalars, the Seraena crop window, decode threads,
and `bench --compare` / `bench --loader` as smoke runs (no timing asserted)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from conftest import assert_one_line_error, clean_env, overrides, run_cli
from taehv_launch.train.data import decode
from taehv_launch.train.model.seraena import seraena_crop
from taehv_launch.train.loop.speed import Window


def test_window_keeps_no_loss_buffers_and_averages():
    x = torch.rand(4, 9, 3, 32, 32, requires_grad=True)
    loss = F.mse_loss(x, torch.zeros_like(x))
    assert loss.detach().untyped_storage().nbytes() > 1000  # the trap: a 0-d view of the whole buffer
    w = Window()
    w.add({"loss": loss, "disc": 2.0})
    w.add({"loss": torch.tensor(1.0), "disc": 4.0})
    assert w.values["loss"][0].untyped_storage().nbytes() == 4
    means = w.means()
    assert means["disc"] == 3.0 and means["loss"] == pytest.approx((loss.item() + 1.0) / 2)


def test_profile_table_covers_the_steady_window_only(monkeypatch):
    """--profile's table leaves out the warm-up steps (compile) and shows the time outside every phase."""
    from taehv_launch.train.loop import timing

    clock = iter(range(0, 1000, 1))
    monkeypatch.setattr(timing.time, "perf_counter", lambda: float(next(clock)))
    timer = timing.PhaseTimer(True, torch.device("cpu"))
    for step in range(1, 7):  # steps 1-6; the steady window starts after step 2
        with timer("reference VAE encode"):
            pass
        timer.at_step(step, steady_from=2, last=6)
    table = timer.table(6)
    assert "steps 3-6, after the warm-up" in table, table
    # the fake clock ticks 1 s per read: each phase takes 1 s; at_step reads it at steps 2 and 6
    lines = {line.split()[0]: line for line in table.splitlines()[1:]}
    assert float(lines["reference"].split()[3]) == pytest.approx(1000.0)  # 4 s over 4 steps
    assert float(lines["outside"].split()[3]) == pytest.approx(1250.0)  # 9 s of wall - 4 s of phases


def _view(crop: int, h: int = 48, w: int = 64, cell: int = 8, seed: int = 0):
    target = torch.arange(2 * 9 * 3 * h * w, dtype=torch.float32).view(2, 9, 3, h, w)
    lh, lw = h // cell, w // cell
    latents = torch.arange(2 * 3 * 4 * lh * lw, dtype=torch.float32).view(2, 3, 4, lh, lw)
    return target, latents, seraena_crop(target, target + 1, latents, crop, torch.Generator().manual_seed(seed))


def test_seraena_crop_takes_one_window_on_the_latent_grid():
    target, latents, (real, dec, lat) = _view(16)
    assert real.shape == (2, 9, 3, 16, 16) and dec.shape == real.shape and lat.shape == (2, 3, 4, 2, 2)
    # the same window in pixels and latents: find the crop's origin in the full frame
    y, x = divmod(int(real[0, 0, 0, 0, 0].item()) % (48 * 64), 64)
    assert y % 8 == 0 and x % 8 == 0
    assert torch.equal(real, target[..., y : y + 16, x : x + 16]) and torch.equal(dec, real + 1)
    assert torch.equal(lat, latents[..., y // 8 : y // 8 + 2, x // 8 : x // 8 + 2])
    for crop in (0, 64, 100):  # off, or not smaller than the frame
        t, l, (r, _, la) = _view(crop)
        assert r is t and la is l


def test_seraena_crop_with_patch_size_2_keeps_to_its_16_pixel_cells():
    """patch_size 2: a latent cell is 16 pixels, so the window starts on a 16-pixel line and its latents
    are crop / 16 cells (an 8-pixel grid put half the windows off their latents)."""
    for seed in range(8):
        target, latents, (real, _, lat) = _view(32, h=64, w=96, cell=16, seed=seed)
        y, x = divmod(int(real[0, 0, 0, 0, 0].item()) % (64 * 96), 96)
        assert y % 16 == 0 and x % 16 == 0 and real.shape[-2:] == (32, 32) and lat.shape[-2:] == (2, 2)
        assert torch.equal(lat, latents[..., y // 16 : y // 16 + 2, x // 16 : x // 16 + 2])


class _Threads(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.tensor(decode.decode_threads() or 0)


def test_decode_threads_share_the_cores_between_workers(monkeypatch):
    assert decode.decode_threads() is None  # main process: FFmpeg's own default
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    got = torch.cat(list(DataLoader(_Threads(), batch_size=2, num_workers=2)))
    cores = len(__import__("os").sched_getaffinity(0))
    assert got.tolist() == [max(1, cores // 2)] * 4


def test_bench_compare_needs_a_gpu_for_gpu_profiles_and_gpus_profile():
    assert_one_line_error(run_cli("bench", "--compare", "1", "h100"), "needs a GPU")
    assert_one_line_error(run_cli("bench", "--compare"), "needs GPUS PROFILE")
    assert_one_line_error(run_cli("bench", "--loader"), "needs --data-root")


@pytest.mark.slow
def test_bench_loader_smoke(tmp_path, videos):
    proc = run_cli(
        "bench",
        "loader",
        "--data-root",
        str(videos),
        "--height",
        "64",
        "--width",
        "64",
        "--micro",
        "2",
        "--workers",
        "2",
        "--seconds",
        "1",
        "--clips",
        "4",
        "--decoder",
        "opencv",
        "--json",
        env=clean_env(),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    kinds = {(r["what"], r["decoder"], r["procs"]) for r in report["rows"]}
    assert ("decode", "opencv", 1) in kinds and ("loader", "opencv-share", 2) in kinds
    assert all(r["clips_per_s"] > 0 for r in report["rows"])


@pytest.mark.slow
def test_bench_compare_cpu_smoke(tmp_path):
    """The whole comparison at the cpu profile's tiny shape: naive, every lever row, the real trainer,
    the cache job and the trainer from the cache."""
    proc = run_cli(
        "bench",
        "--compare",
        "1",
        "cpu",
        "--levers",
        "--crop",
        "32",
        "--steps",
        "1",
        "--trainer-steps",
        "6",
        "--cached",
        "1",
        "--workdir",
        str(tmp_path / "bc"),
        "--json",
        env=clean_env(TAEHV_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1"),
        cwd=tmp_path,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    rows = {r["what"]: r for r in report["rows"]}
    assert {"naive", "eager", "no per-step syncs", "Seraena crop", "ours (real trainer)"} <= set(rows)
    assert rows["naive"]["ratio_vs_naive"] == 1.0
    assert rows["ours (real trainer)"]["steps"] == 3 and rows["ours (real trainer)"]["clips_per_s"] > 0
    assert rows["cache job (encode once)"]["bytes_per_clip"] > 0
    assert rows["ours, from the latent cache"]["clips_per_s"] > 0
    assert json.loads((tmp_path / "bc" / "compare.json").read_text())["rows"]


def test_channels_last_taehv_computes_the_same_and_keeps_its_weights_layout():
    """The compiled-GPU layout lever: frames NHWC inside every block, same outputs and gradients, the
    parameters (what checkpoints and DeepSpeed's flat buffers hold) untouched."""
    from taehv_launch.train.model.taehv import TAEHV

    torch.manual_seed(0)
    a = TAEHV(latent_channels=4).double()
    b = TAEHV(latent_channels=4).double()
    b.load_state_dict(a.state_dict())
    b.channels_last = True
    x = torch.rand(2, 8, 3, 16, 24, dtype=torch.float64)
    ya, yb = a(x), b(x)
    torch.testing.assert_close(ya, yb)
    ya.square().mean().backward()
    yb.square().mean().backward()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, msg=name)
        assert pb.is_contiguous(), name


def test_gpu_profiles_compile_taehv_channels_last_and_zero3_stays_eager(tmp_path, monkeypatch):
    """What users run: every GPU profile compiles the reference encoder and TAEHV (channels-last);
    the loop's compile step leaves TAEHV eager under ZeRO-3 and compiles it otherwise. The step runs
    for real on a stand-in trainer (no GPU here, so the trainer says it is on CUDA without touching it;
    torch.compile only wraps, nothing is built until a call)."""
    from types import SimpleNamespace

    from taehv_launch.plan.profiles import PROFILES
    from taehv_launch.plan.schema import make_config
    from taehv_launch.train.loop import trainer as loop
    from taehv_launch.train.model.taehv import TAEHV

    for name, prof in PROFILES.items():
        if prof.device == "cuda":
            assert prof.config["compile"] == "all", name
    assert make_config({}).channels_last is True
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE"):
        monkeypatch.setenv(var, str(tmp_path) if var.endswith("DIR") else "1")  # the step sets them if unset
    cfg = make_config({"compile": "all", "output_dir": str(tmp_path)})
    compiled = {}
    for zero in (3, 2, 0):
        logs: list[str] = []
        taehv = TAEHV(latent_channels=4)
        trainer = SimpleNamespace(cfg=cfg, device=torch.device("cuda"), ref=None, zero=zero, log=logs.append)
        loop.Trainer._compile(trainer, taehv)
        compiled[zero] = "encode_video" in vars(taehv) and "decode_video" in vars(taehv)  # compile_taehv wraps both
        assert compiled[zero] == (not any("stays eager" in line for line in logs)), (zero, logs)
    assert compiled == {3: False, 2: True, 0: True}


@pytest.mark.slow  # a ~55 s trainer run
def test_validation_at_start_gives_a_step_0_baseline_without_a_best_model(tmp_path):
    proc = run_cli(
        "1",
        "cpu",
        "--run-name",
        "v0",
        *overrides(
            f"output_dir={str(tmp_path / 'out')!r}",
            "max_train_steps=2 validation_steps=100 validation_at_start=True max_validation_batches=1",
        ),
        env=clean_env(TAEHV_CACHE=str(tmp_path / "cache")),
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout + proc.stderr
    assert "validation at step 0:" in text and "validation at step 2:" in text
    assert text.index("validation at step 0:") < text.index("step 2/2")
    assert (tmp_path / "out" / "v0" / "best_model").is_dir()  # exported at step 2, not 0


@pytest.mark.slow  # a trainer run of 4 steps on the cpu profile
def test_tflops_and_mfu_in_the_log_trackers_progress_and_speed_json(tmp_path):
    """#38 item 2: one clip's FLOPs counted at start-up; every log line, TensorBoard, progress.json and
    speed.json carry TFLOP/s per process and MFU, which is n/a on CPU."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    proc = run_cli(
        "1",
        "cpu",
        "--run-name",
        "fl",
        *overrides(f"output_dir={str(tmp_path / 'out')!r}", "max_train_steps=4 log_every=2 validation_steps=100"),
        env=clean_env(TAEHV_CACHE=str(tmp_path / "cache")),
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    count = next(x for x in lines if x.startswith("speed: "))
    assert "per clip (12 x 64x64): TAEHV forward + backward " in count and count.endswith("; MFU n/a (CPU)"), count
    steps = [x for x in lines if x.startswith("step ")]
    assert len(steps) == 2 and all(" TFLOP/s/process, MFU n/a (CPU) | mem " in x for x in steps), steps
    run = tmp_path / "out" / "fl"
    speed = json.loads((run / "speed.json").read_text())
    flops = speed["flops_per_clip"]
    assert flops["total"] == flops["taehv"] + flops["seraena"] + flops["reference"] and flops["reference"] > 0
    assert speed["tflops_per_gpu"] == pytest.approx(speed["clips_per_s"] * flops["total"] / 1e12)
    assert speed["mfu"] is None and speed["mfu_note"] == "CPU"
    assert speed["ref_vae_type"] == "cogvideox" and speed["latent_cache"] is False  # a resume's prediction reads them
    progress = json.loads((run / "progress.json").read_text())
    assert progress["tflops_per_gpu"] == pytest.approx(progress["samples_per_s"] * flops["total"] / 1e12)
    events = EventAccumulator(str(run / "logs"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/tflops_per_gpu")] == [2, 4]
    assert "train/mfu" not in events.Tags()["scalars"]  # no peak on a CPU
