"""The GPU path's colours follow each file's tags as the CPU path's OpenCV does: most HD camera and phone video
says BT.709, many phones full range; a decode that took BT.601 limited range for every file (this project's
NVDEC path before) gave HD footage other colours than the CPU path, and a latent cache other colours than its
frames (mean |difference| 4-10 of 255 on the files below; 5 on the repo's smpte-2997.mp4 on the H100). OpenCV
before 4.13 honours the range only (every matrix BT.601): the GPU path follows the installed OpenCV.

decode.colour_of reads the tags; nv12.yuv420_to_rgb (the reference of the GPU kernels, tests/test_nv12.py) applied
to the NV12 planes FFmpeg decodes must land nearest OpenCV's frame with the file's own conversion and far from
the others. The GPU path itself against the CPU path on such files: scripts/gpu_decode_check.py on the H100."""

from __future__ import annotations

import av
import cv2
import numpy as np
import pytest
import torch

from taehv_launch.train.data import decode, nv12
from taehv_launch.train.data.clips import VideoClipDataset

W, H = 192, 128
# (name, AVColorSpace, AVColorRange): tags as cameras and phones write them; 2 / 0: unspecified
TAGGED = [
    ("bt601", 6, 1),
    ("bt709", 1, 1),
    ("bt601-full", 6, 2),
    ("bt709-full", 1, 2),
    ("bt601", 2, 0),
    ("bt601-full", 2, 2),
    ("bt2020", 9, 1),
]


def tagged_file(path, colorspace: int, color_range: int):
    """Five frames of saturated blocks and gradients, H.264, tagged (and converted to YUV) as asked."""
    yy, xx = np.mgrid[0:H, 0:W]
    img = np.stack([xx * 255 // W, yy * 255 // H, (xx + yy) * 255 // (W + H)], -1).astype(np.uint8)
    img[10:50, 10:70], img[60:120, 80:180], img[5:40, 120:190] = (255, 0, 0), (0, 255, 0), (0, 0, 255)
    out = av.open(str(path), "w")
    stream = out.add_stream("libx264", rate=25)
    stream.width, stream.height, stream.pix_fmt = W, H, "yuv420p"
    ctx = stream.codec_context
    ctx.color_range, ctx.colorspace = color_range, colorspace
    stream.options = {"crf": "8", "preset": "ultrafast"}
    for _ in range(5):
        frame = av.VideoFrame.from_ndarray(img, format="rgb24").reformat(
            format="yuv420p", dst_colorspace=colorspace if colorspace != 2 else None, dst_color_range=color_range
        )
        frame.color_range, frame.colorspace = color_range, colorspace
        for packet in stream.encode(frame):
            out.mux(packet)
    for packet in stream.encode():
        out.mux(packet)
    out.close()
    return str(path)


def _nv12_and_opencv(path):
    with av.open(path) as container:
        nv12_planes = next(container.decode(video=0)).to_ndarray(format="nv12")
    ok, bgr = cv2.VideoCapture(path).read()
    assert ok
    return torch.from_numpy(nv12_planes), torch.from_numpy(bgr[:, :, ::-1].copy()).permute(2, 0, 1).float()


@pytest.mark.parametrize("name,colorspace,color_range", TAGGED)
def test_each_tag_converts_as_opencv_does(tmp_path, name, colorspace, color_range):
    path = tagged_file(tmp_path / f"{name}_{colorspace}.mp4", colorspace, color_range)
    decode._pyav_traits.cache_clear()
    if decode._opencv_version() < decode.TAGGED_MATRIX_FROM:  # this OpenCV takes every matrix as BT.601
        name = "bt601-full" if name.endswith("-full") else "bt601"
    assert decode.colour_of(path) == name
    planes, want = _nv12_and_opencv(path)
    off = {c: float((nv12.yuv420_to_rgb(planes, H, W, c).float() - want).abs().mean()) for c in nv12.COLOURS}
    # 2.4-2.7 here on these sharp-edged blocks: swscale repeats each chroma sample where yuv420_to_rgb
    # interpolates, and rounds in fixed point (0.4-0.6 on the repo's videos, NVDEC against OpenCV on the H100)
    assert off[name] < 3.5, off
    others = [c for c in ("bt601", "bt709", "bt601-full", "bt709-full") if c != name]
    assert min(off[c] for c in others) > off[name] + 2, off


def test_an_opencv_before_4_13_converts_every_matrix_as_bt601(tmp_path, monkeypatch):
    """OpenCV 4.10-4.12 honour the range but convert every stream with BT.601 (smpte-2997.mp4, tagged BT.709:
    0.67 of 255 from BT.601, 3.95 from BT.709 under 4.12): the GPU path follows the installed OpenCV."""
    bt709, full = tagged_file(tmp_path / "hd.mp4", 1, 1), tagged_file(tmp_path / "phone.mp4", 1, 2)
    decode._pyav_traits.cache_clear()
    monkeypatch.setattr(decode, "_opencv_version", lambda: (4, 12))
    assert (decode.colour_of(bt709), decode.colour_of(full)) == ("bt601", "bt601-full")
    monkeypatch.setattr(decode, "_opencv_version", lambda: (4, 13))
    assert (decode.colour_of(bt709), decode.colour_of(full)) == ("bt709", "bt709-full")


def test_the_planned_clip_carries_the_colour(tmp_path, monkeypatch):
    """The DataLoader workers read the tags with the header (one PyAV opening, cached) and hand them to the GPU
    decode threads on the ticket; a file PyAV cannot open is BT.601 limited range, as FFmpeg's default."""
    monkeypatch.setattr(decode, "_opencv_version", lambda: (5, 0))
    path = tagged_file(tmp_path / "phone.mp4", 1, 2)
    ds = VideoClipDataset([path], 64, 96, 3, 1, 2, seed=0, train=True)
    ds.defer = True
    assert ds[0]["ticket"].colour == "bt709-full"
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"\x00" * 64)
    assert decode.colour_of(str(broken)) == "bt601"
    assert decode._colour_name(1, 0, "yuvj420p") == "bt709-full"  # the yuvj formats imply full range
    assert decode._colour_name(8, 1, "yuv420p") == "bt601"  # YCgCo and other matrices: swscale's default
