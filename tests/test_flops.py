"""TFLOP/s and MFU (#38 item 2): a training clip's FLOPs counted once at start-up (train/loop/flops.py),
checked against a count by hand; the peak table and the MFU arithmetic (plan/flops.py); the log line,
progress.json and status that carry them."""

from __future__ import annotations

import json
import time

import pytest
import torch

from conftest import run_cli_here
from taehv_launch.plan.flops import PEAKS, ClipFlops, Rate, flops_text, peak_of, record_text
from taehv_launch.plan.schema import DEFAULTS
from taehv_launch.rundir.progress import STEP_LINE, write_progress
from taehv_launch.train.loop.flops import Counter, count_clip_flops, current_rate, set_rate
from taehv_launch.train.loop.timing import window_line

# A tiny run: one clip of 4 frames of 16x16, 4 latent channels, the base decoder, CogVideoX's rules
# (4 frames -> 1 latent of 2x2 -> 4 decoded frames, the first 3 trimmed: 1 frame trained on).
TINY = dict(DEFAULTS) | {"n_frames": 4, "height": 16, "width": 16, "latent_channels": 4, "seraena_crop": 0}

# ---------------------------------------------------------------- the count by hand
# One 3x3 conv is Cin x Cout x 9 multiply-accumulates per output pixel; a MAC is 2 FLOPs. Per frame:
# MACs = H_out x W_out x Cin x Cout x k x k. MemBlock(n, n) = conv(2n -> n) + 2 x conv(n -> n), all 3x3,
# no skip conv (n_in == n_out): per output pixel 2n x n x 9 + 2 x n x n x 9 = 36 n^2 MACs.
MEM64, MEM128, MEM256 = 36 * 64**2, 36 * 128**2, 36 * 256**2  # 147456, 589824, 2359296

ENCODER_MACS = [  # frames x pixels x MACs per pixel, layer by layer (blocks.encoder)
    4 * 16 * 16 * (3 * 64 * 9),  # conv(3 -> 64) on the 4 frames at 16x16  <- its input has no gradient
    2 * 16 * 16 * (128 * 64),  # stage 1 TPool(stride 2): 1x1 conv(128 -> 64), 2 frames at 16x16
    2 * 8 * 8 * (64 * 64 * 9),  # conv(64 -> 64, stride 2) -> 8x8
    3 * 2 * 8 * 8 * MEM64,  # 3 MemBlocks, 2 frames at 8x8
    1 * 8 * 8 * (128 * 64),  # stage 2 TPool(stride 2): 1 frame at 8x8
    1 * 4 * 4 * (64 * 64 * 9),  # conv stride 2 -> 4x4
    3 * 1 * 4 * 4 * MEM64,  # 3 MemBlocks at 4x4
    1 * 4 * 4 * (64 * 64),  # stage 3 TPool(stride 1): 1x1 conv(64 -> 64)
    1 * 2 * 2 * (64 * 64 * 9),  # conv stride 2 -> 2x2
    3 * 1 * 2 * 2 * MEM64,  # 3 MemBlocks at 2x2
    1 * 2 * 2 * (64 * 4 * 9),  # conv(64 -> 4): the latent
]
DECODER_MACS = [  # blocks.base_decoder on 1 latent frame of 2x2 (Clamp, ReLU, Upsample: no MACs)
    1 * 2 * 2 * (4 * 256 * 9),  # conv(4 -> 256)  <- its input (the reference latents) has no gradient
    3 * 1 * 2 * 2 * MEM256,  # stage 0: 3 MemBlocks at 2x2, then Upsample -> 4x4
    1 * 4 * 4 * (256 * 256),  # TGrow(stride 1): 1x1 conv(256 -> 256)
    1 * 4 * 4 * (256 * 128 * 9),  # conv(256 -> 128)
    3 * 1 * 4 * 4 * MEM128,  # stage 1: 3 MemBlocks at 4x4, Upsample -> 8x8
    1 * 8 * 8 * (128 * 256),  # TGrow(stride 2): 1x1 conv(128 -> 256): 2 frames from here
    2 * 8 * 8 * (128 * 64 * 9),  # conv(128 -> 64)
    3 * 2 * 8 * 8 * MEM64,  # stage 2: 3 MemBlocks, 2 frames at 8x8, Upsample -> 16x16
    2 * 16 * 16 * (64 * 128),  # TGrow(stride 2): 1x1 conv(64 -> 128): 4 frames from here
    4 * 16 * 16 * (64 * 64 * 9),  # conv(64 -> 64)
    4 * 16 * 16 * (64 * 3 * 9),  # conv(64 -> 3): the frames (3 of the 4 trimmed after)
]
# Training: forward, then backward = each conv's weight gradient (as many MACs as its forward) and its input
# gradient (as many again), except for the two convs whose input needs no gradient (frames, latents).
TAEHV_FLOPS = 2 * (3 * (sum(ENCODER_MACS) + sum(DECODER_MACS)) - ENCODER_MACS[0] - DECODER_MACS[0])

# Seraena's discriminator on the 1 trained frame: one group of 3 frames (padded), 9 + 4 channels at 16x16.
DISC_MACS = [
    16 * 16 * (13 * 64 * 9),  # conv(13 -> 64, 3x3)  <- its input: detached frames, no gradient in the step
    8 * 8 * (64 * 128 * 16),  # conv(64 -> 128, 4x4, stride 2) -> 8x8
    4 * 4 * (128 * 256 * 16),  # -> 4x4
    2 * 2 * (256 * 512 * 16),  # -> 2x2
    2 * 2 * (512 * 512 * 9),  # conv(512 -> 512, 3x3)
    2 * 2 * (512 * 512 * 9),
    16 * 16 * 64 + 8 * 8 * 128 + 4 * 4 * 256 + 3 * (2 * 2 * 512),  # the six 1x1 projections to 1 channel
]
# The discriminator's step: forward, weight gradients, input gradients but the first conv's (3F - first);
# the correction: the reals' forward, the fakes' forward, the input gradient w.r.t. the fakes (3F).
SERAENA_FLOPS = 2 * (3 * sum(DISC_MACS) - DISC_MACS[0] + 3 * sum(DISC_MACS))


def test_the_count_of_one_clip_equals_the_hand_count():
    clip = count_clip_flops(TINY, None)
    assert sum(ENCODER_MACS) == 77_489_152 and sum(DECODER_MACS) == 174_297_088  # the sums written out
    assert clip.taehv == TAEHV_FLOPS == 1_507_104_768
    assert clip.seraena == SERAENA_FLOPS == 548_069_376
    assert clip.reference == 0 and clip.total == TAEHV_FLOPS + SERAENA_FLOPS
    assert clip.shape == "4 x 16x16"


def test_the_reference_encode_is_counted_as_the_real_model_runs():
    import diffusers

    from taehv_launch.train.loop.flops import reference_online

    torch.manual_seed(0)
    vae = diffusers.AutoencoderKLCogVideoX(
        latent_channels=4, block_out_channels=(8, 8, 8, 8), layers_per_block=1, norm_num_groups=4
    ).eval()
    x = torch.rand(1, 3, 1, 16, 16)  # CogVideoX encodes 1 + 4k frames: the first 1 of 4
    with torch.no_grad(), Counter() as c:
        vae.encode(x).latent_dist.mode()
    clip = count_clip_flops(TINY, vae)
    assert clip.reference == c.total > 0 and clip.total == TAEHV_FLOPS + SERAENA_FLOPS + c.total

    class Ref:  # what the trainer holds: a loaded ReferenceVAE (train/reference/refvae.py)
        model = vae

    assert reference_online(TINY, Ref()) == (vae, "")
    assert reference_online(TINY | {"latent_cache": "/c", "latent_cache_encode": "always"}, Ref()) == (vae, "")
    model, note = reference_online(TINY | {"latent_cache": "/c", "latent_cache_encode": "missing"}, Ref())
    assert model is None and note.startswith("reference encode not counted")
    assert reference_online(TINY | {"use_ref_vae": False}, None) == (None, "no reference encode (use_ref_vae=False)")


def test_seraena_crop_and_checkpointing():
    """A Seraena crop counts the crop; gradient checkpointing's recompute is not counted (model FLOPs)."""
    big = TINY | {"height": 64, "width": 64}
    cropped = count_clip_flops(big | {"seraena_crop": 16}, None)
    assert cropped.seraena == SERAENA_FLOPS and cropped.shape == "4 x 64x64, Seraena crop 16"
    assert count_clip_flops(big | {"gradient_checkpointing": True}, None).taehv == cropped.taehv


def test_the_count_is_quick_at_the_profiles_shapes():
    count_clip_flops(TINY, None)  # first use: torch's dispatch machinery
    t0 = time.perf_counter()
    clip = count_clip_flops(dict(DEFAULTS), None)  # 12 x 480x720, the h100 row's clip
    assert time.perf_counter() - t0 < 10  # well under a second on an idle machine; no memory, no weights
    assert 5e12 < clip.taehv < 8e12  # measured 6.11 TFLOP


# ---------------------------------------------------------------- the peak table and the arithmetic


def test_peaks_are_matched_from_torch_device_names():
    peaks = {
        "NVIDIA H100 80GB HBM3": 989.4,
        "NVIDIA H100 PCIe": 756.5,
        "NVIDIA H200": 989.4,
        "NVIDIA H800": 989.4,
        "NVIDIA A100-SXM4-80GB": 312.0,
        "NVIDIA A100 80GB PCIe": 312.0,
        "NVIDIA A800-SXM4-80GB": 312.0,
        "NVIDIA B200": 2250.0,
    }
    for name, tflops in peaks.items():
        assert peak_of(name).tflops == tflops, name
    for unknown in ("NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA GB200", "NVIDIA L40S", "NVIDIA GeForce RTX 4090"):
        assert peak_of(unknown) is None, unknown
    assert len({p.gpu for p in PEAKS}) == len(PEAKS)


def test_tflops_and_mfu_arithmetic():
    h100 = Rate.of(6e12, 2, "NVIDIA H100 80GB HBM3", on_gpu=True)  # 6 TFLOP per clip, 2 GPUs
    assert h100.tflops(40.0) == pytest.approx(120.0)  # 40 clips/s x 6 TFLOP / 2 GPUs
    assert h100.mfu(40.0) == pytest.approx(120.0 / 989.4)  # achieved / (peak x GPUs) = 240 / (989.4 x 2)
    assert h100.text(40.0) == "120.0 TFLOP/s/GPU, MFU 12.1%"
    assert h100.scalars(40.0) == {
        "train/tflops_per_gpu": pytest.approx(120.0),
        "train/mfu": pytest.approx(0.1213, 1e-3),
    }
    rec = h100.record(40.0)
    assert rec["peak_tflops_per_gpu"] == 989.4 and rec["mfu_note"] is None
    assert record_text(rec) == "120.0 TFLOP/s per GPU, MFU 12.1%"
    cpu = Rate.of(4e9, 1, "whatever", on_gpu=False)
    assert cpu.text(5.0) == "0.02 TFLOP/s/process, MFU n/a (CPU)" and cpu.mfu(5.0) is None
    assert cpu.scalars(5.0) == {"train/tflops_per_gpu": pytest.approx(0.02)}
    assert record_text(cpu.record(5.0)) == "0.02 TFLOP/s per process, MFU n/a (CPU)"
    l4 = Rate.of(4e12, 1, "NVIDIA L4", on_gpu=True)
    assert l4.text(1.0) == "4.00 TFLOP/s/GPU, MFU n/a (no BF16 peak known for NVIDIA L4)"
    assert record_text(None) == "" and flops_text(6.1062e12) == "6.11 TFLOP" and flops_text(4.35e11) == "435 GFLOP"
    assert ClipFlops(1e12, 0.0, 0.0, "s").line() == "1 TFLOP per clip (s): TAEHV forward + backward 1 TFLOP, " + (
        "Seraena 0 FLOP, reference encode: none"
    )


# ---------------------------------------------------------------- where they show


def test_the_log_line_carries_them_and_status_still_reads_it():
    means = {"loss": 0.5, "reconstruction_loss": 0.4, "encoder_loss": 0.1, "psnr": 20.0}
    try:
        set_rate(None)
        plain = window_line(means, 1e-4, 40.0, 10.0, 90.0, 10, 100)
        assert "TFLOP" not in plain
        set_rate(Rate.of(6e12, 2, "NVIDIA H100 80GB HBM3", on_gpu=True))
        assert current_rate() is not None
        line = window_line(means, 1e-4, 40.0, 10.0, 90.0, 10, 100)
    finally:
        set_rate(None)
    assert "| 40.0 samples/s | 120.0 TFLOP/s/GPU, MFU 12.1% | mem 10.0 GiB | ETA 0:01:30" in line
    m = STEP_LINE.search(line)  # status's fallback when there is no progress.json
    assert m and m.group(1, 2, 3) == ("10", "100", "40.0")


def test_status_shows_the_last_windows_tflops_and_mfu(tmp_path):
    run = tmp_path / "output" / "r"
    run.mkdir(parents=True)
    (run / "launch.log").write_text("step 10/100 | loss 1.0\n")
    now = time.time()
    rate = Rate.of(6e12, 1, "NVIDIA H100 80GB HBM3", on_gpu=True)
    rec = {"step": 10, "total": 100, "samples_per_s": 20.0, "samples_per_s_avg": 19.0, "global_batch": 8}
    write_progress(run, rec | {"eta_s": 90.0, "time": now, "started": now - 60, **rate.record(20.0)})
    out = run_cli_here("status", str(run), cwd=tmp_path).stdout
    assert (
        "speed      20.0 clips/s now, 19.0 average since this launch started 1 min ago; 120.0 TFLOP/s per GPU, MFU 12.1%"
        in out
    ), out
    flops = json.loads(run_cli_here("status", str(run), "--json", cwd=tmp_path).stdout)["runs"][0]["flops"]
    assert flops == {
        "tflops_per_gpu": 120.0,
        "mfu": pytest.approx(120 / 989.4),
        "peak_tflops_per_gpu": 989.4,
        "mfu_note": None,
    }
    write_progress(run, rec | {"tflops_per_gpu": "fast", "mfu": float("nan")})  # damaged: no TFLOP/s line
    assert "TFLOP" not in run_cli_here("status", str(run), cwd=tmp_path).stdout
