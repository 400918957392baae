"""Issue #38: the trainer's start-up line says the GPU decode threads it uses and how they were chosen
(with video_decode_threads=0 it used to say "0 threads per rank"), and the decode stage runs with that
number, chosen once. Fast: build.use_decoder and build.batches on real files, on the CPU, through the tests'
stand-in for NVDEC (train/faults.py), as the slow trainer runs in test_decode_choice.py do."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from taehv_launch.plan.decodeplan import BASE_THREADS
from taehv_launch.plan.schema import make_config
from taehv_launch.train import faults
from taehv_launch.train.data.clips import VideoClipDataset, collate
from taehv_launch.train.loop import build

CPU = torch.device("cpu")
SHAPE = dict(height=64, width=96, n_frames=12, min_frame_delta=1, max_frame_delta=2)
STAND_IN = "data: decoding training clips on the GPU (a test stand-in (OpenCV frames), "


def start(videos, monkeypatch, name: str, threads: int):
    monkeypatch.setenv(faults.STAGE_ENV, "opencv")
    cfg = make_config({**SHAPE, "video_decode_threads": threads})
    ds = VideoClipDataset([str(videos / name)], 64, 96, 12, 1, 2, seed=0)
    lines: list[str] = []
    return cfg, ds, build.use_decoder(cfg, CPU, ds, lines.append), lines


def first_batch_threads(cfg, ds, decoding, lines) -> int:
    """The decode stage build.batches makes from the start-up's choice: its threads, after one real batch."""
    loader = DataLoader(ds, batch_size=1, sampler=range(4), num_workers=0, collate_fn=collate)
    stage = build.batches(loader, decoding, cfg, CPU, lines.append)
    try:
        assert next(stage)["frames"].shape == (1, 12, 3, 64, 96)
    finally:
        stage.close()
    return stage.threads


@pytest.mark.parametrize(
    "name,how,why",
    [
        ("chaplin.mp4", "chosen from the sources", "chosen from the sources: "),  # H.264: the decode model
        ("big_buck_bunny_432_433.webm", "the default", "no sampled file is H.264"),  # VP9: NVDEC takes none here
    ],
)
def test_threads_chosen_at_start_are_said_with_how_and_used(videos, monkeypatch, name, how, why):
    cfg, ds, decoding, lines = start(videos, monkeypatch, name, 0)
    n = decoding.threads
    assert decoding.name == "nvdec" and n == BASE_THREADS  # the CPU's NVDEC engines are not known: 4
    assert lines[0] == f"{STAND_IN}{n} threads per rank, {how}); files it cannot take are decoded on the CPU"
    assert lines[1].startswith(f"data: NVDEC decode threads: {n} threads per process, ") and why in lines[1]
    assert first_batch_threads(cfg, ds, decoding, lines) == n
    assert not [x for x in lines[2:] if "decode threads" in x]  # the stage chooses nothing again (nor after a rollback)


def test_threads_set_are_said_as_set_and_used(videos, monkeypatch):
    cfg, ds, decoding, lines = start(videos, monkeypatch, "chaplin.mp4", 6)
    assert lines == [
        f"{STAND_IN}6 threads per rank, as set by video_decode_threads); files it cannot take are decoded on the CPU"
    ]
    assert decoding.threads == 6 and first_batch_threads(cfg, ds, decoding, lines) == 6
    assert len(lines) == 1
