"""Metrics, the LR schedule and the decoder-target alignment."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from taehv_launch.plan.schema import make_config
from taehv_launch.train.loop.guard import lr_at
from taehv_launch.plan.families import FAMILIES
from taehv_launch.train.model.losses import DistillNet, decoder_targets, psnr, ssim
from taehv_launch.train.model.taehv import TAEHV


def test_psnr_and_ssim():
    x = torch.rand(1, 3, 3, 32, 32)
    assert ssim(x, x) == pytest.approx(1.0)
    assert ssim(x, torch.rand_like(x)) < 0.1
    assert psnr(torch.full_like(x, 0.5), torch.full_like(x, 0.6)) == pytest.approx(20.0, abs=1e-3)  # mse 0.01
    assert math.isfinite(ssim(torch.rand(1, 2, 3, 8, 8), torch.rand(1, 2, 3, 8, 8)))  # crop below the window


def test_lr_schedule_counts_optimizer_steps():
    cfg = make_config({"learning_rate": 1e-3, "lr_warmup_steps": 10, "max_train_steps": 110, "min_lr_ratio": 0.1})
    assert lr_at(0, cfg) == pytest.approx(1e-4) and lr_at(9, cfg) == pytest.approx(1e-3)
    assert lr_at(60, cfg) == pytest.approx(1e-4 + 0.9e-3 * 0.5)  # half-way down the cosine
    assert lr_at(110, cfg) == pytest.approx(1e-4)  # floor = min_lr_ratio
    assert lr_at(50, replace(cfg, lr_scheduler="constant")) == pytest.approx(1e-3)


@pytest.mark.parametrize(
    "family,latents,expected", [("wan", 3, 9), ("cogvideox", 3, 9), ("cogvideox", 6, 24), ("hunyuan", 6, 21)]
)
def test_decoder_output_lines_up_with_the_first_input_frames(family, latents, expected):
    net = DistillNet(TAEHV(latent_channels=4), FAMILIES[family]).eval()
    frames = torch.rand(1, 24, 3, 16, 16)
    with torch.no_grad():
        enc, dec = net(frames[:, : 4 * latents] if latents == 3 else frames, torch.randn(1, latents, 4, 2, 2))
    assert dec.shape[1] == expected
    assert torch.equal(decoder_targets(frames, dec), frames[:, :expected])
