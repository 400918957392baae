"""Camera footage beside the bench sets: the containers cameras and phones write (.MTS/.m2ts from AVCHD
camcorders, .m4v, MPEG transport streams) are listed; their clips are frame-exact when seeking in a long
keyframe interval with B-frames; the GPU path leaves the containers without a seek index to the CPU."""

from __future__ import annotations

import os

import av
import cv2
import numpy as np
import pytest
import torch

from taehv_launch.dataindex.listing import scan
from taehv_launch.train.data.clips import VideoClipDataset
from test_decode_stage import _stage
from taehv_launch.train.data import decode
from taehv_launch.train.data.decode import SEEK_MIN, _decode_path, opencv_garbles, read_prefix
from taehv_launch.errors import DataError
from taehv_launch.train.data.probe import probe_first_usable, usable_entries


def write_video(path, codec: str, size: tuple[int, int], frames: int, rate: int = 30, fmt=None, options=None):
    """A moving test pattern of `frames` frames, width x height `size`, encoded with PyAV."""
    w, h = size
    out = av.open(str(path), "w", format=fmt)
    stream = out.add_stream(codec, rate=rate)
    stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
    stream.options = options or {}
    yy, xx = np.mgrid[0:h, 0:w]
    for t in range(frames):
        img = np.stack([(xx * 2 + t * 3) % 256, (yy * 3 + t) % 256, ((xx + yy) + t * 7) % 256], -1).astype(np.uint8)
        for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
            out.mux(packet)
    for packet in stream.encode():
        out.mux(packet)
    out.close()
    return path


def camera_file(path, frames: int = 300, fmt: str | None = None, interlaced: bool = False):
    """H.264 with x264's defaults a camera resembles (keyframes every 250 frames, B-frames), 160x96, moving;
    interlaced: coded as fields, top field first (as 1080i camcorders and broadcast write)."""
    options = {"g": "250", "bf": "3", "preset": "ultrafast"}
    if interlaced:
        options["x264-params"] = "interlaced=1:tff=1"
    return write_video(path, "libx264", (160, 96), frames, fmt=fmt, options=options)


def test_camera_containers_are_listed(tmp_path):
    names = ["a.MTS", "b.m2ts", "c.m4v", "d.ts", "e.mpg", "f.MPEG", "g.3gp", "h.mp4", "notes.txt", "clip.mts.json"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    found = {os.path.basename(p) for p in scan(str(tmp_path), parallel=False)}
    assert found == set(names) - {"notes.txt", "clip.mts.json"}


def test_seeking_in_a_camera_transport_stream_gives_the_frames_read_forward(tmp_path):
    path = str(camera_file(tmp_path / "cam.mts", fmt="mpegts"))
    for start in (SEEK_MIN, 131, 251, 270):  # inside the first keyframe interval, on and past the second keyframe
        wanted = list(range(start, start + 24, 2))
        seeked, _ = _decode_path(path, wanted, allow_seek=True)
        forward, _ = _decode_path(path, wanted, allow_seek=False)
        assert seeked is not None and forward is not None, start
        assert all(np.array_equal(seeked[k], forward[k]) for k in wanted), start


def test_the_gpu_path_leaves_transport_streams_to_the_cpu_once_per_file(tmp_path):
    paths = [str(camera_file(tmp_path / "cam.mts", fmt="mpegts")), str(camera_file(tmp_path / "cam.mp4"))]
    lines: list[str] = []
    ds = VideoClipDataset(paths, 48, 64, 12, 1, 2, random_flip=False, seed=3, train=True)
    stage = _stage(ds, batch=2, log=lines.append)  # test_decode_stage's: OpenCV frames standing in for NVDEC
    try:
        got = [next(stage) for _ in range(3)]
    finally:
        stage.close()
    assert all(b["frames"].shape == (2, 12, 3, 48, 64) for b in got)
    refused = [line for line in lines if "MPEG-TS/PS" in line]
    assert len(refused) == 1 and "cam.mts" in refused[0] and "decoded on the CPU" in refused[0], lines
    assert stage.counts["cpu"] >= 3 and stage.counts["gpu"] >= 3 and stage.counts["lost"] == 0
    cpu = VideoClipDataset(paths, 48, 64, 12, 1, 2, random_flip=False, seed=3, train=True)
    assert torch.equal(got[0]["frames"][0], cpu[0]["frames"])  # the .mts clip is exactly the CPU path's


def test_interlaced_footage_is_skipped_with_why_where_opencv_garbles_it(tmp_path, monkeypatch):
    """OpenCV >= 4.13 returns frames of undefined pixels, with success, for interlaced streams (here: mean
    |OpenCV - PyAV| over 100 of 255); such files are skipped, each with the reason and what to do, on the CPU
    path, the GPU path's plan, a cached view and the validation probe; the progressive file beside it trains."""
    interlaced = str(camera_file(tmp_path / "1080i.mp4", frames=40, interlaced=True))
    progressive = str(camera_file(tmp_path / "p.mp4", frames=40))
    for f in (decode._pyav_traits, decode._opencv_version):
        f.cache_clear()
    if decode._opencv_version() < decode.INTERLACED_BROKEN_FROM:
        pytest.skip(f"OpenCV {cv2.__version__} converts interlaced frames")
    pyav = next(av.open(interlaced).decode(video=0)).to_ndarray(format="bgr24")
    ok, garbled = cv2.VideoCapture(interlaced).read()
    assert ok and np.abs(garbled.astype(int) - pyav).mean() > 30  # what the guard is for: success, wrong pixels
    why = opencv_garbles(interlaced)
    assert why.startswith("interlaced video (top field first), which OpenCV") and "bwdif" in why
    assert opencv_garbles(progressive) == "" and read_prefix(interlaced, 12) == []
    ds = VideoClipDataset([interlaced, progressive], 48, 64, 12, 1, 2, random_flip=False, seed=3, train=True)
    items = [ds[i] for i in range(4)]
    assert all(item["frames"].shape == (12, 3, 48, 64) for item in items)
    assert ds._broken == {interlaced: why} and items[0]["why"] == {interlaced: why}
    assert ds.plan(0, 0) is None and ds.plan(1, 1) is not None
    assert [e.path for e in usable_entries(ds.entries, 12)] == [progressive]
    with pytest.raises(
        DataError, match=r"none of the first 1 videos gives a usable clip \(e.g. .*1080i.mp4: interlaced"
    ):
        probe_first_usable(ds.entries[:1], 12)
    monkeypatch.setattr(decode, "_opencv_version", lambda: (4, 12))  # where OpenCV converts them: not skipped
    assert opencv_garbles(interlaced) == ""


def dv_file(path, frames: int = 16):
    """MiniDV (PAL, 720x576): its header leaves the field order unknown; every frame is interlaced."""
    return write_video(path, "dvvideo", (720, 576), frames, rate=25)


def test_dv_footage_is_caught_by_its_first_frame_and_a_fifo_does_not_block(tmp_path):
    """DV's header says nothing of fields (order 0), so the first frame decides; a FIFO named like a video
    (in an index written before it became one) is unreadable at once, as before, instead of blocking PyAV."""
    for f in (decode._pyav_traits, decode._opencv_version):
        f.cache_clear()
    if decode._opencv_version() < decode.INTERLACED_BROKEN_FROM:
        pytest.skip(f"OpenCV {cv2.__version__} converts interlaced frames")
    dv = str(dv_file(tmp_path / "minidv.avi"))
    with av.open(dv) as c:
        assert not c.streams.video[0].codec_context.field_order
    assert opencv_garbles(dv).startswith("interlaced video, which OpenCV")
    fifo = tmp_path / "fifo.mp4"
    os.mkfifo(fifo)
    ds = VideoClipDataset([str(fifo)], 48, 64, 12, 1, 2, random_flip=False, seed=3, train=True)
    assert opencv_garbles(str(fifo)) == "" and ds.clip(0, 0) is None and ds.plan(0, 0) is None
