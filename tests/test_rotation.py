"""Phone footage: a video whose container asks for a display rotation (a portrait phone video is stored
sideways with a 90-degree turn). OpenCV turns its frames upright and the CPU path trains on those; NVDEC
gives the frames as coded, so the GPU path turns them by the ticket's `turns` before cropping. Here OpenCV
frames as coded stand in for NVDEC (nvdec.OpenCVFrames), through the same stage code."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from conftest import testdata_videos as shared_videos
from taehv_launch.train.data import nvdec
from taehv_launch.train.data.cached import CachedViewDataset
from taehv_launch.train.data.clips import Crop, VideoClipDataset, View, collate, read_view
from taehv_launch.train.data.decode import count_frames, display_turns, header_info, open_video, read_prefix
from taehv_launch.train.data.decode import trimmed_start

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from footage import edit_list_copy, rotated_copy  # noqa: E402  (scripts/footage.py: also the GPU check's)


@pytest.fixture(scope="module")
def turned(tmp_path_factory) -> dict[int, Path]:
    """chaplin.mp4 (640x360) with display rotations 0, 90, 180 and 270 degrees counter-clockwise."""
    folder, videos = tmp_path_factory.mktemp("turned"), shared_videos()
    out = {0: Path(shutil.copy(videos / "chaplin.mp4", folder / "r0.mp4"))}
    for degrees in (90, 180, 270):
        out[degrees] = rotated_copy(videos / "chaplin.mp4", folder / f"r{degrees}.mp4", degrees)
    return out


def _first(path: Path, upright: bool) -> np.ndarray:
    cap = open_video(str(path), upright)
    try:
        ok, frame = cap.read()
    finally:
        cap.release()
    assert ok
    return frame


def test_the_turns_bring_the_coded_frames_to_what_opencv_shows(turned):
    assert {d: display_turns(str(p)) for d, p in turned.items()} == {0: 0, 90: 1, 180: 2, 270: 3}
    for degrees, path in turned.items():
        coded, upright = _first(path, False), _first(path, True)
        assert coded.shape == (360, 640, 3)
        assert np.array_equal(np.rot90(coded, display_turns(str(path))), upright), degrees
        w, h = header_info(str(path))[1:]
        assert (h, w) == upright.shape[:2], degrees  # the header's size is the upright one, as the plan uses


def _stage(ds: VideoClipDataset | CachedViewDataset, batch: int, lines: list[str] | None = None) -> nvdec.DecodeStage:
    ds.defer = True
    loader = DataLoader(ds, batch_size=batch, sampler=range(10_000), num_workers=2, collate_fn=collate)
    log = lines.append if lines is not None else (lambda m: None)
    return nvdec.DecodeStage(loader, ds, torch.device("cpu"), 64, 96, nvdec.OpenCVFrames, threads=2, depth=1, log=log)


def _close(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean absolute difference: OpenCV's INTER_AREA against torch's antialiased bilinear is close, not equal;
    a clip cut from the frames turned the wrong way differs by tens."""
    return (a.float() - b.float()).abs().mean().item()


def test_the_gpu_path_cuts_the_cpu_path_clips_of_turned_videos(turned):
    paths = [str(turned[d]) for d in (0, 90, 180, 270)]
    ds = VideoClipDataset(paths, 64, 96, 12, 1, 2, random_flip=True, seed=3, train=True)
    stage = _stage(ds, 4)
    try:
        got = next(stage)
    finally:
        stage.close()
    assert stage.counts["gpu"] >= 4 and stage.counts["cpu"] == stage.counts["lost"] == 0
    cpu = VideoClipDataset(paths, 64, 96, 12, 1, 2, random_flip=True, seed=3, train=True)
    for k in range(4):
        assert _close(got["frames"][k], cpu[k]["frames"]) < 6.0, paths[k]


def test_the_gpu_path_cuts_a_cached_view_of_a_turned_video_as_the_cache_job_did(turned):
    """The latent cache records the view (frames and crop) in the upright frame; its latents were encoded
    from the upright clip, so the GPU path must cut that clip too."""
    views, cpu = [], []
    for degrees in (90, 270):
        path = turned[degrees]
        crop = (40, 10, 200, 300, False)  # y, x, h, w in the upright 360-wide, 640-tall frame
        rec = {"video": path.name, "bytes": os.path.getsize(path), "frames": list(range(0, 24, 2))}
        rec.update(crop=list(crop), seek=True, row=0, view=0, crc32=0)
        views.append(("s0", rec))
        cpu.append(read_view(str(path), View(tuple(rec["frames"]), Crop(*crop), True), 64, 96))
    ds = CachedViewDataset(path.parent, views, str(path.parent), 64, 96, 3, read_latents=False, online_fallback=True)
    ds.defer = True
    tickets = [ds[j]["ticket"] for j in range(2)]
    assert [t.turns for t in tickets] == [1, 3]
    dec = nvdec.OpenCVFrames(torch.device("cpu"))
    for ticket, want in zip(tickets, cpu):
        clip = nvdec.finish(dec.frames(ticket.path, ticket.view.frames), ticket.view.crop, None, 64, 96, ticket.turns)
        assert _close(clip, want) < 6.0, ticket.path


def test_finish_turns_before_it_crops():
    x = torch.arange(2 * 3 * 4 * 6, dtype=torch.uint8).reshape(2, 3, 4, 6)
    whole = nvdec.finish(x, Crop(0, 0, 6, 4, False), (6, 4), 6, 4, turns=1)
    assert torch.equal(whole, torch.rot90(x, 1, dims=(-2, -1)))
    corner = nvdec.finish(x, Crop(1, 2, 3, 2, False), (6, 4), 3, 2, turns=3)
    assert torch.equal(corner, torch.rot90(x, 3, dims=(-2, -1))[:, :, 1:4, 2:4])


def test_a_trimmed_phone_clip_reads_from_its_edit_list_start(turned, tmp_path):
    """An edit list whose start skips 30 frames (a phone's trimmed clip): OpenCV's header still counts every
    packet (241), decoding gives 211 frames, the first of them the source's frame 30; a clip planned past the
    real end from the header's count is planned again from the length read, not lost."""
    src = turned[0]
    trimmed = str(edit_list_copy(src, tmp_path / "trimmed.mp4", 30))
    assert header_info(trimmed)[0] == 241 and count_frames(trimmed) == 211
    assert np.array_equal(_first(Path(trimmed), True), read_prefix(str(src), 31)[30])
    ds = VideoClipDataset([trimmed], 64, 96, 12, 2, 2, random_flip=False, seed=3, train=True)
    clips = [ds[i]["frames"] for i in range(6)]
    assert all(c.shape == (12, 3, 64, 96) for c in clips) and not ds._broken
    # the GPU path: a decoder fed every packet would show the 30 trimmed frames, so NVDEC is not offered it
    assert trimmed_start(trimmed) and not trimmed_start(str(src))
    lines: list[str] = []
    stage = _stage(VideoClipDataset([trimmed, str(src)], 64, 96, 12, 1, 2, random_flip=False, seed=3), 2, lines)
    try:
        got = next(stage)
    finally:
        stage.close()
    assert [line for line in lines if "trimmed" in line] == [
        f"data: NVDEC is not used for trimmed files of {trimmed} (frames before the edit list's start); such files "
        f"are decoded on the CPU (this line once per reason)"
    ]
    plain = VideoClipDataset([trimmed, str(src)], 64, 96, 12, 1, 2, random_flip=False, seed=3)
    assert torch.equal(got["frames"][0], plain[0]["frames"])  # the trimmed file's clip: exactly the CPU path's
