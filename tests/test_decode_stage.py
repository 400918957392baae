"""The GPU decode path's logic on CPU (issue 23): planned clips (tickets), the decode stage with its
threads, the per-file CPU fallback, broken files. The NVDEC decoder itself runs on the GPU machine
(scripts/gpu_decode_check.py); here OpenCV frames stand in for it, through the same stage code."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from torch.utils.data import DataLoader

from taehv_launch.train import faults
from taehv_launch.train.data import nv12 as nv12_ops
from taehv_launch.train.data import nvdec
from taehv_launch.train.data.clips import Crop, VideoClipDataset, collate
from trainrun import launch, ok
from conftest import overrides

GOOD = [
    "chaplin.mp4",
    "smpte-2997.mp4",
    "example2.mp4",
    "fire2.mp4",
    "big_buck_bunny_432_433.webm",
    "no_duration.webm",
    "transparent.webm",
]
BROKEN = ["empty.webm", "test_video.mp4"]  # no frames; 1x1 pixels
REFUSED = ("example2.mp4", "smpte-2997.mp4")


def _ds(paths, train=True, n_frames=12):
    return VideoClipDataset([str(p) for p in paths], 64, 96, n_frames, 1, 2, random_flip=True, seed=3, train=train)


class Refusing(nvdec.OpenCVFrames):
    """Refuses example2.mp4 and smpte-2997.mp4, as NVDEC refuses some files; counts its calls."""

    calls: list[str] = []

    def frames(self, path, indices):
        Refusing.calls.append(path)
        if path.endswith(REFUSED):
            raise nvdec.DecodeRefused("the test decoder refuses this file", os.path.basename(path))
        return super().frames(path, indices)


def _stage(ds, make=nvdec.OpenCVFrames, workers=2, batch=4, log=None):
    ds.defer = True
    loader = DataLoader(ds, batch_size=batch, sampler=range(10_000), num_workers=workers, collate_fn=collate)
    return nvdec.DecodeStage(
        loader, ds, torch.device("cpu"), ds.height, ds.width, make, threads=3, depth=2, log=log or (lambda m: None)
    )


def test_a_ticket_plans_the_same_clip_as_the_cpu_path(videos):
    ds = _ds([videos / n for n in GOOD])
    for i in range(14):
        video = i % len(GOOD)
        ticket = ds.plan(video, i)
        clip, view = ds.make_view(ds.entries[video].path, lambda s, i=i, video=video: ds._rng(i, video, s))
        assert ticket.view.frames == view.frames and ticket.view.crop == view.crop, ds.entries[video].path
        assert ticket.src == clip_source(ds.entries[video].path)


def clip_source(path):
    from taehv_launch.train.data.decode import read_prefix

    return tuple(read_prefix(path, 1)[0].shape[:2])


def test_stage_batches_match_the_cpu_clips(videos):
    ds = _ds([videos / n for n in GOOD[:4]])
    stage = _stage(ds)
    try:
        got = next(stage)
    finally:
        stage.close()
    assert got["frames"].shape == (4, 12, 3, 64, 96) and got["frames"].dtype == torch.uint8
    cpu = _ds([videos / n for n in GOOD[:4]])
    for k in range(4):
        want = cpu[k]["frames"]  # OpenCV INTER_AREA vs torch's antialiased bilinear: close, not equal
        diff = (got["frames"][k].float() - want.float()).abs().mean().item()
        assert diff < 6.0, (k, diff)


def test_refused_files_fall_back_to_the_cpu_once_per_file_and_log_once_per_reason(videos):
    Refusing.calls = []
    lines: list[str] = []
    ds = _ds([videos / n for n in GOOD])
    stage = _stage(ds, Refusing, log=lines.append)
    try:
        batches = [next(stage) for _ in range(6)]
    finally:
        stage.close()
    assert all(b["frames"].shape == (4, 12, 3, 64, 96) for b in batches)
    refused = [line for line in lines if "refuses this file" in line]
    assert len(refused) == 1 and "decoded on the CPU (this line once per reason)" in refused[0], lines
    offered = [p for p in Refusing.calls if p.endswith(REFUSED)]
    assert len(offered) == len(set(offered)) == 2, "a refused file was offered to the decoder again"
    assert stage.counts["cpu"] > 0 and stage.counts["gpu"] > 0 and stage.counts["lost"] == 0
    cpu = _ds([videos / n for n in GOOD])
    item = next(i for i in range(24) if ds.entries[i % len(GOOD)].path.endswith(REFUSED))
    assert torch.equal(batches[item // 4]["frames"][item % 4], cpu[item]["frames"])  # exactly the CPU path's clip


class Flaky(nvdec.OpenCVFrames):
    """Fails frame fetches of chaplin.mp4 (as NVDEC fails some HEVC clips): retried until FETCH_FAILURES."""

    calls: list[str] = []

    def frames(self, path, indices):
        Flaky.calls.append(path)
        if path.endswith("chaplin.mp4"):
            raise nvdec.DecodeRefused("frame fetch failed", "test", for_good=False)
        return super().frames(path, indices)


def test_a_failed_frame_fetch_sends_the_clip_to_the_cpu_and_the_file_after_repeats(videos):
    Flaky.calls = []
    lines: list[str] = []
    ds = _ds([videos / "chaplin.mp4", videos / "fire2.mp4"])
    stage = _stage(ds, Flaky, log=lines.append)
    try:
        got = [next(stage) for _ in range(5)]  # 10 clips of chaplin.mp4
    finally:
        stage.close()
    assert all(b["frames"].shape == (4, 12, 3, 64, 96) and not b["skipped"] for b in got)
    tries = Flaky.calls.count(str(videos / "chaplin.mp4"))  # clips already in flight on other threads may add
    assert nvdec.FETCH_FAILURES <= tries <= nvdec.FETCH_FAILURES + 2, tries
    assert len(lines) == 1 and "a file's every clip after" in lines[0], lines


@pytest.mark.slow
def test_broken_files_are_skipped_and_the_batch_stays_full(videos, tmp_path):
    src = videos / "smpte-2997.mp4"
    cut = tmp_path / "truncated.mp4"  # header says 251 frames; the data stops after 118
    cut.write_bytes(src.read_bytes()[: int(src.stat().st_size * 0.5)])
    notvideo = tmp_path / "notes.mp4"
    notvideo.write_text("not a video")
    shutil.copy(videos / "fire2.mp4", tmp_path / "fire2.mp4")
    paths = [videos / n for n in BROKEN] + [cut, notvideo, tmp_path / "fire2.mp4"]
    ds = _ds(paths)
    stage = _stage(ds)
    try:
        batches = [next(stage) for _ in range(4)]
    finally:
        stage.close()
    skipped = {p for b in batches for p in b["skipped"]}
    assert {str(videos / "empty.webm"), str(videos / "test_video.mp4"), str(notvideo)} <= skipped
    assert all(b["frames"].shape == (4, 12, 3, 64, 96) for b in batches)
    assert str(cut) not in skipped  # re-planned on the CPU within its real length, as before


def test_finish_crops_resizes_flips_in_bounded_chunks():
    x = torch.arange(5 * 3 * 40 * 60, dtype=torch.float32).reshape(5, 3, 40, 60).remainder_(251).to(torch.uint8)
    crop = Crop(4, 6, 20, 30, True)
    whole = nvdec.finish(x, crop, (40, 60), 10, 15)
    old = nvdec.CHUNK_BYTES
    nvdec.CHUNK_BYTES = 1  # one frame at a time
    try:
        chunked = nvdec.finish(x, crop, (40, 60), 10, 15)
    finally:
        nvdec.CHUNK_BYTES = old
    assert whole.shape == (5, 3, 10, 15) and torch.equal(whole, chunked)
    plain = nvdec.finish(x, Crop(4, 6, 20, 30, False), (40, 60), 10, 15)
    assert torch.equal(whole, plain.flip(-1))
    same = nvdec.finish(x, Crop(0, 0, 40, 60, False), None, 40, 60)  # no resize: the frames themselves
    assert torch.equal(same, x)
    # decoded at half the header's size: the crop scales with it
    half = nvdec.finish(x, Crop(0, 0, 80, 120, False), (80, 120), 40, 60)
    assert torch.equal(half, x)
    corner = nvdec.finish(x, Crop(40, 60, 40, 60, False), (80, 120), 20, 30)
    assert torch.equal(corner, x[:, :, 20:, 30:])


def test_choose_and_the_cpu_profile():
    from taehv_launch.plan.schema import make_config

    cfg = make_config({"video_decoder": "auto"})
    assert nvdec.choose(cfg, torch.device("cpu"))[0] == "opencv"
    assert nvdec.choose(make_config({"video_decoder": "opencv"}), torch.device("cpu")) == ("opencv", "")


def test_nvdec_on_the_cpu_profile_is_one_line():
    from conftest import assert_one_line_error, run_cli

    proc = run_cli("1", "cpu", "--dry-run", "--set", "video_decoder=nvdec")
    assert_one_line_error(proc, "video_decoder=nvdec decodes on a GPU's NVDEC")
    proc = run_cli("1", "cpu", "--dry-run", "--set", "video_decoder=gpu")
    assert proc.returncode == 2 and "auto" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_trainer_through_the_decode_stage_with_refusals_and_broken_files(tmp_path, videos):
    """A real 1-rank CPU run, 2 DataLoader workers and 4 decode threads, on the repo's sample videos (broken
    ones included) through the GPU path's stage with a decoder that refuses two files (which video is held out
    for validation depends on the checkout's path, so one of them may never be trained on): it trains, logs the
    refusal once, the VP8/VP9 files' CPU route once, and the broken files once each."""
    env = build_env(tmp_path)
    proc, run = launch(
        tmp_path,
        1,
        *overrides(
            f"data_root='{videos}'",
            "max_train_steps=6 dataloader_num_workers=2 video_decode_threads=4 micro_batch_size=2",
        ),
        env=env,
    )
    ok(proc)
    out = proc.stdout
    assert "decoding training clips on the GPU (a test stand-in" in out
    assert out.count("the test decoder refuses this file") == 1, out
    assert "NVDEC is not used for vp" in out
    assert "skipping unreadable or unusable video" in out
    assert (run / "final_model").is_dir()


def build_env(tmp_path):
    from conftest import clean_env

    return clean_env(
        TAEHV_CACHE=str(tmp_path.parent / "taehv-cache"),
        OMP_NUM_THREADS="1",
        **{faults.STAGE_ENV: "opencv", faults.REFUSE_ENV: ",".join(REFUSED)},
    )


def test_nv12_conversion_matches_opencv(videos):
    """NVDEC's native surfaces are converted with OpenCV's matrix, so GPU and CPU clips share one colour."""
    import cv2
    import numpy as np

    from taehv_launch.train.data.decode import read_prefix

    bgr = read_prefix(str(videos / "chaplin.mp4"), 1)[0]
    h, w = bgr.shape[:2]
    i420 = cv2.cvtColor(bgr, cv2.COLOR_BGR2YUV_I420)
    u = i420[h : h + h // 4].reshape(h // 2, w // 2)
    v = i420[h + h // 4 :].reshape(h // 2, w // 2)
    nv12 = np.concatenate([i420[:h], np.stack([u, v], -1).reshape(h // 2, w)], 0)
    want = cv2.cvtColor(nv12, cv2.COLOR_YUV2RGB_NV12).astype(np.int16)
    got = nv12_ops.yuv420_to_rgb(torch.from_numpy(nv12), h, w).permute(1, 2, 0).numpy().astype(np.int16)
    assert np.abs(got - want).max() <= 2 and np.abs(got - want).mean() < 0.2


def test_codecs_nvdec_is_not_checked_on_go_to_the_cpu(videos):
    """The stage sends a ticket whose codec NVDEC is not used for straight to the CPU, logged once."""
    Refusing.calls = []
    lines: list[str] = []
    ds = _ds([videos / "no_duration.webm", videos / "fire2.mp4"])  # VP9 and H.264
    stage = _stage(ds, Refusing, log=lines.append)
    try:
        got = [next(stage) for _ in range(3)]
    finally:
        stage.close()
    assert all(b["frames"].shape[0] == 4 for b in got)
    assert not any(p.endswith(".webm") for p in Refusing.calls)
    assert any("NVDEC is not used for vp90 files" in line for line in lines), lines


@pytest.mark.slow
def test_bench_loader_resolution_and_decoder_errors_are_one_line(videos):
    from conftest import assert_one_line_error, run_cli

    proc = run_cli("bench", "loader", "--data-root", str(videos), "--resolution", "577")
    assert_one_line_error(proc, "no videos 577 pixels high", code=proc.returncode)
    assert "720p" in proc.stderr and proc.returncode != 0
    proc = run_cli("bench", "loader", "--data-root", str(videos), "--decoder", "nvdec")
    assert proc.returncode != 0 and "needs a GPU with PyNvVideoCodec" in proc.stderr
    assert "Traceback" not in proc.stderr


class ColourKernelFails(nvdec.OpenCVFrames):
    """A decoder whose frames go through nv12.nv12_to_rgb with a colour kernel that fails at launch, as on a node
    whose Triton cannot build it: every clip must still come, the note be logged once."""

    def frames(self, path, indices):
        from taehv_launch.train.data import nv12

        rgb = super().frames(path, indices)
        h, w = rgb.shape[-2:]
        surface = torch.zeros((h // 2 * 3, w // 2 * 2), dtype=torch.uint8)  # stands for an NV12 surface
        nv12.nv12_to_rgb(surface, h // 2 * 2, w // 2 * 2)
        return rgb


def test_a_failing_colour_kernel_costs_no_clip_and_is_said_once(videos, monkeypatch):
    from taehv_launch.train.data import nv12

    class Launch:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise RuntimeError("ptxas fatal: Unsupported .version")

            return launch

    class Broken:  # the kernels' module, both kernels failing at launch
        nv12_rgb = nv12_clip = Launch()

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # nv12 takes the kernel path for CPU frames
    monkeypatch.delenv("TAEHV_NV12", raising=False)
    monkeypatch.setattr(nv12, "_state", {"kernel": Broken()})
    lines: list[str] = []
    ds = _ds([videos / n for n in GOOD[:4]])
    stage = _stage(ds, ColourKernelFails, log=lines.append)
    try:
        got = [next(stage) for _ in range(3)]
    finally:
        stage.close()
    assert all(b["frames"].shape == (4, 12, 3, 64, 96) and not b["skipped"] for b in got)
    said = [line for line in lines if "NV12 colour kernel failed" in line]
    assert said == [
        "data: the NV12 colour kernel failed (RuntimeError: ptxas fatal: Unsupported .version); colour in torch ops "
        "from now on, the same bytes"
    ], lines
    assert stage.counts["gpu"] >= 12 and nv12.how() == "colour in torch ops (the Triton kernel failed here)"
