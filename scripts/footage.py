#!/usr/bin/env python3
"""Copies of an MP4 that look like phone and camera footage, for the decode checks (tests/test_rotation.py,
scripts/gpu_decode_check.py --footage), written without an ffmpeg binary:

- rotated_copy: the video track header's matrix asks players to turn the picture (a portrait phone video
  is stored sideways with a 90-degree turn), as `ffmpeg -display_rotation` writes it; frames untouched;
- edit_list_copy: the first `skip` frames lie before the edit list's start (as a phone's trimmed clip, or
  `ffmpeg -ss ... -c copy`): FFmpeg's demuxer flags their packets discard and decoders drop them;
- tagged_copy: the first frames re-encoded (H.264) in another YUV matrix and range, tagged so (HD cameras
  write BT.709, many phones full range): a decoder must convert back with the tagged conversion.

    python scripts/footage.py SRC.mp4 OUT_DIR     # OUT_DIR/turn90.mp4, turn270.mp4, editlist30.mp4,
                                                  # bt709.mp4, bt709-full.mp4, bt601-full.mp4
"""

from __future__ import annotations

import math
import struct
import sys
from pathlib import Path


MAX_BYTES = 1 << 30  # rotated_copy reads the file into memory


def _boxes(data: bytes | bytearray, start: int, end: int):
    """(type, offset of the payload, end) of the MP4 boxes in data[start:end]."""
    at = start
    while at + 8 <= end:
        size, kind = struct.unpack(">I4s", data[at : at + 8])
        head = 8
        if size == 1:
            size, head = struct.unpack(">Q", data[at + 8 : at + 16])[0], 16
        elif size == 0:
            size = end - at
        if size < head:
            return
        yield kind, at + head, at + size
        at += size


def rotated_copy(src: Path, dst: Path, degrees: int) -> Path:
    """A copy of an MP4 whose video track asks players to turn it `degrees` counter-clockwise (read whole: at most
    MAX_BYTES)."""
    if Path(src).stat().st_size > MAX_BYTES:
        raise ValueError(f"{src} is over {MAX_BYTES >> 30} GiB: give a short clip")
    data = bytearray(Path(src).read_bytes())
    theta = math.radians(degrees)
    c, s = round(math.cos(theta)) * 65536, round(math.sin(theta)) * 65536
    matrix = struct.pack(">9i", c, -s, 0, s, c, 0, 0, 0, 1 << 30)
    done = 0
    for kind, body, end in _boxes(data, 0, len(data)):
        if kind != b"moov":
            continue
        for trak, tbody, tend in _boxes(data, body, end):
            if trak != b"trak":
                continue
            inner = {k: (b, e) for k, b, e in _boxes(data, tbody, tend)}
            mdia = {k: b for k, b, _ in _boxes(data, *inner[b"mdia"])}
            if data[mdia[b"hdlr"] + 8 : mdia[b"hdlr"] + 12] != b"vide":
                continue
            tkhd = inner[b"tkhd"][0]
            fields = 32 if data[tkhd] == 1 else 20  # version 1: 64-bit times
            at = tkhd + 4 + fields + 8 + 8  # version/flags, times and ids, reserved, layer..volume
            data[at : at + 36] = matrix
            done += 1
    if not done:
        raise ValueError(f"{src}: no MP4 video track header to turn")
    Path(dst).write_bytes(bytes(data))
    return Path(dst)


def edit_list_copy(src: Path, dst: Path, skip: int) -> Path:
    """A remux of an MP4 whose first `skip` frames (presentation order) come before the edit list's start."""
    import av

    with av.open(str(src)) as inp, av.open(str(dst), "w") as out:
        stream = inp.streams.video[0]
        copy = out.add_stream_from_template(stream)
        packets = [p for p in inp.demux(stream) if p.dts is not None]
        times = sorted(p.pts for p in packets)
        shift = times[skip] - times[0]
        for p in packets:
            p.pts, p.dts, p.stream = p.pts - shift, p.dts - shift, copy
            out.mux(p)
    return Path(dst)


TAGS = {"bt709": (1, 1), "bt709-full": (1, 2), "bt601-full": (6, 2)}  # name: (AVColorSpace, AVColorRange)


def tagged_copy(src: Path, dst: Path, name: str, frames: int = 90) -> Path:
    """The first `frames` frames of src re-encoded as H.264 in TAGS[name]'s matrix and range, tagged so."""
    import av

    colorspace, color_range = TAGS[name]
    with av.open(str(src)) as inp, av.open(str(dst), "w") as out:
        stream = out.add_stream("libx264", rate=25)
        stream.width, stream.height = inp.streams.video[0].width // 2 * 2, inp.streams.video[0].height // 2 * 2
        stream.pix_fmt, stream.options = "yuv420p", {"crf": "16", "preset": "veryfast"}
        stream.codec_context.color_range, stream.codec_context.colorspace = color_range, colorspace
        for n, frame in enumerate(inp.decode(video=0)):
            if n == frames:
                break
            rgb = frame.to_ndarray(format="rgb24")[: stream.height, : stream.width]
            yuv = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(
                format="yuv420p", dst_colorspace=colorspace, dst_color_range=color_range
            )
            yuv.color_range, yuv.colorspace = color_range, colorspace
            for packet in stream.encode(yuv):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return Path(dst)


def main() -> int:
    if len(sys.argv) != 3 or not Path(sys.argv[1]).is_file():
        print("usage: python scripts/footage.py SRC.mp4 OUT_DIR (SRC an existing MP4)", file=sys.stderr)
        return 2
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    try:
        out.mkdir(parents=True, exist_ok=True)
        for degrees in (90, 270):
            print(rotated_copy(src, out / f"turn{degrees}.mp4", degrees))
        print(edit_list_copy(src, out / "editlist30.mp4", 30))
        for name in TAGS:
            print(tagged_copy(src, out / f"{name}.mp4", name))
    except Exception as err:  # not an MP4, too short, an unwritable OUT_DIR: one line
        print(
            f"footage: cannot copy {src} ({type(err).__name__}: {err}); give an H.264 MP4 and a writable OUT_DIR",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
