"""Opening and decoding video files with OpenCV's FFmpeg backend, safely for broken files.

Every function here survives a missing, empty, truncated or non-video file: it returns None
or -1 instead of raising, and decoding is bounded so a strange file cannot stall a worker.
"""

from __future__ import annotations

import functools
import math
import os

import cv2
import numpy as np
import torch

MAX_FRAME_HINT = 10_000_000  # a header count above this (or <= 0) is garbage, e.g. no_duration.webm's -1.4e17
MAX_SCAN_FRAMES = 1_000_000  # bound on counting frames by decoding, so a strange file cannot stall a worker
SEEK_MIN = 48  # start offsets below this are reached with grab(): exact, and as fast as a seek
# FFmpeg decoding threads per opened file in a DataLoader worker. None: this process's share of
# the node's cores (cores / (local ranks x workers), at least 1), so that every worker's FFmpeg
# together uses the cores without oversubscribing them; FFmpeg's own default (one thread per
# core in every worker) and one thread each were both slower (docs/benchmarks.md, "Data loader").
WORKER_DECODE_THREADS: int | None = None


def decode_threads() -> int | None:
    """FFmpeg threads for a capture opened here: None (FFmpeg's default) outside DataLoader workers."""
    info = torch.utils.data.get_worker_info()
    if info is None:
        return None
    if WORKER_DECODE_THREADS is not None:
        return WORKER_DECODE_THREADS
    from ...plan.decodeplan import opencv_threads

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return opencv_threads(cores, int(os.environ.get("LOCAL_WORLD_SIZE", "1")), info.num_workers)


def capture(path: str, threads: int | None, upright: bool = True) -> cv2.VideoCapture:
    """cv2.VideoCapture with `threads` FFmpeg decoding threads (None: FFmpeg's default). upright (OpenCV's
    default): frames turned by the container's display rotation, as a player shows them; False: as coded."""
    if threads is None:
        cap = cv2.VideoCapture(path)
    else:
        cap = cv2.VideoCapture(path, cv2.CAP_FFMPEG, [cv2.CAP_PROP_N_THREADS, threads])
    if not upright and cap.isOpened():
        cap.set(cv2.CAP_PROP_ORIENTATION_AUTO, 0)
    return cap


def _nonempty_file(path: str) -> bool:
    """A regular file with bytes: not missing, empty, a directory or a FIFO (opening one would block for good)."""
    try:
        return os.path.isfile(path) and os.path.getsize(path) > 0
    except OSError:
        return False


def open_video(path: str, upright: bool = True) -> cv2.VideoCapture | None:
    """An opened capture, or None (missing, empty, not a video, a directory)."""
    if not _nonempty_file(path):
        return None
    try:
        cap = capture(path, decode_threads(), upright)
    except cv2.error:
        return None
    if not cap.isOpened():
        cap.release()
        return None
    return cap


def count_frames(path: str) -> int:
    """Decodable frames, counted with grab() (no colour conversion); 0 if unreadable."""
    cap = open_video(path)
    if cap is None:
        return 0
    n = 0
    try:
        while n < MAX_SCAN_FRAMES and cap.grab():
            n += 1
    except cv2.error:
        pass
    finally:
        cap.release()
    return n


def _decode(cap: cv2.VideoCapture, wanted: list[int], seek: bool) -> tuple[dict[int, np.ndarray] | None, int]:
    """Frames (BGR) at the sorted indices `wanted`, read forward from 0 or from a seek.

    Returns (frames, -1) on success. When the file ends early: (None, frames decoded),
    which is the file's real length when we read from 0, or (None, -1) after a seek.
    A seek counts only if the capture then reports the requested position: on some
    files (no_duration.webm) set() returns True and silently stays on frame 0.
    """
    pos = 0
    if seek and wanted[0] >= SEEK_MIN:
        if not (cap.set(cv2.CAP_PROP_POS_FRAMES, wanted[0]) and int(cap.get(cv2.CAP_PROP_POS_FRAMES)) == wanted[0]):
            return None, -1
        pos = wanted[0]
    seeked = pos > 0
    frames: dict[int, np.ndarray] = {}
    try:
        for target in wanted:
            while pos < target:
                if not cap.grab():
                    return None, -1 if seeked else pos
                pos += 1
            ok, frame = cap.read()
            if not ok or frame is None:
                return None, -1 if seeked else pos
            pos += 1
            frames[target] = frame
    except cv2.error:
        return None, -1 if seeked else pos
    return frames, -1


def _decode_path(
    path: str, wanted: list[int], allow_seek: bool = True, upright: bool = True
) -> tuple[dict[int, np.ndarray] | None, int]:
    """_decode on a fresh capture; a failed seek is retried by reading forward from 0."""
    for seek in (True, False) if allow_seek else (False,):
        cap = open_video(path, upright)
        if cap is None:
            return None, 0
        try:
            frames, length = _decode(cap, wanted, seek)
        finally:
            cap.release()
        if frames is not None or length >= 0:
            return frames, length
    return None, 0


def header_frame_count(path: str) -> int:
    """The container's frame count, or -1 when unknown or implausible. Reads the header only."""
    return header_info(path)[0]


def header_info(path: str) -> tuple[int, int, int]:
    """(frame count or -1 as header_frame_count gives it, width, height) from the header; the size is
    (0, 0) when unknown, and (-1, 0, 0) when the file cannot be opened."""
    cap = open_video(path)
    if cap is None:
        return -1, 0, 0
    try:
        return (
            _plausible(cap.get(cv2.CAP_PROP_FRAME_COUNT)),
            max(0, int(cap.get(cv2.CAP_PROP_FRAME_WIDTH))),
            max(0, int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))),
        )
    finally:
        cap.release()


def codec_of(path: str) -> str:
    """The video stream's codec as OpenCV names it from the header (e.g. "h264", "hevc", "vp90"), lower
    case; "" when unknown. Cached per process (bounded)."""
    return _stream_traits(path)[0]


def display_turns(path: str) -> int:
    """Quarter turns counter-clockwise (torch.rot90's k on the last two dims) that bring the frames as coded,
    which is how NVDEC gives them, to the orientation OpenCV gives and this project trains on: the container's
    display rotation (a phone's portrait video is stored sideways with a 90-degree rotation). 0 when the file
    has none, or one OpenCV does not apply (not a multiple of 90). Cached per process (bounded)."""
    return _stream_traits(path)[1]


@functools.lru_cache(maxsize=4096)
def _stream_traits(path: str) -> tuple[str, int]:
    """(codec_of, display_turns) from one opening of the header."""
    cap = open_video(path)
    if cap is None:
        return "", 0
    try:
        code = int(cap.get(cv2.CAP_PROP_FOURCC))
        rotation = cap.get(cv2.CAP_PROP_ORIENTATION_META)  # degrees OpenCV turns the frames clockwise
    finally:
        cap.release()
    codec = code.to_bytes(4, "little").decode("latin-1").strip("\x00 ").lower() if code > 0 else ""
    quarter = round(rotation / 90) if math.isfinite(rotation) and rotation % 90 == 0 else 0
    return codec, -quarter % 4


# From OpenCV 4.13 on (5.0 too), VideoCapture's colour conversion refuses interlaced frames, yet read() succeeds
# and hands back a frame of undefined pixels (garbage here, zeros elsewhere); 4.12 converts them. Checked here on
# x264-interlaced H.264 and MPEG-2 files: mean |OpenCV - PyAV| 115-125 of 255 with 4.13/4.14/5.0, 1.3 with 4.12.
INTERLACED_BROKEN_FROM = (4, 13)
FIELD_ORDERS = {
    2: "top field first",
    3: "bottom field first",
    4: "top field coded first",
    5: "bottom field coded first",
}
INTERLACED_FRAMES = 6  # _field_order's code for frames flagged interlaced where the header names no field order


def opencv_garbles(path: str) -> str:
    """Why this OpenCV's frames of `path` would be wrong though it reports success, or "": an interlaced stream
    (the field order FFmpeg reads from the header, through PyAV) under an OpenCV that garbles interlaced frames.
    "" also when PyAV cannot tell (not installed, cannot open the file: the decode then decides). Cached."""
    if _opencv_version() < INTERLACED_BROKEN_FROM:
        return ""
    order = _field_order(path)
    if order < 2:
        return ""
    return (
        f"interlaced video{f' ({FIELD_ORDERS[order]})' if order in FIELD_ORDERS else ''}, which OpenCV "
        f"{cv2.__version__} decodes to "
        f"garbled frames: deinterlace it (ffmpeg -i IN -vf bwdif=mode=0 OUT) or pip install "
        f"'opencv-python-headless<4.13'"
    )


def _field_order(path: str) -> int:
    """FFmpeg's field order of the first video stream (1 progressive, 2-5 interlaced), 0 when unknown. Where the
    header leaves it unknown (DV: every frame interlaced), the first decoded frame's flag decides
    (INTERLACED_FRAMES or 1)."""
    return _pyav_traits(path)[0]


def trimmed_start(path: str) -> bool:
    """Whether the stream's first packets lie before its edit list's start (a phone's trimmed clip, or
    `ffmpeg -ss ... -c copy`): FFmpeg flags them discard and drops their frames, as OpenCV's frame numbers do,
    but a decoder fed every packet shows them (the NVDEC SDK's FFmpegDemuxer reads packets without looking at
    that flag), so its frame k would be OpenCV's frame k minus the trimmed count. Cached."""
    return _pyav_traits(path)[1]


def ticket_traits(path: str) -> dict:
    """What the GPU decode threads need to know of a file besides its frames and crop (clips.Ticket's fields):
    codec, display turns, trimmed start, colour. Each cached per process."""
    return dict(codec=codec_of(path), turns=display_turns(path), trimmed=trimmed_start(path), colour=colour_of(path))


def colour_of(path: str) -> str:
    """The YUV -> RGB conversion OpenCV's FFmpeg backend applies to this stream's frames (nv12.COLOURS' key:
    matrix, "-full" for full range), from the header's tags: the range always (many phones write full range),
    the matrix from OpenCV 4.13 on (most HD and phone video says BT.709; 4.12 and before convert every stream
    with BT.601, checked on 4.10, 4.11, 4.12, 4.13 and 5.0); untagged streams BT.601, limited range. Cached."""
    name = _pyav_traits(path)[2]
    if _opencv_version() < TAGGED_MATRIX_FROM:
        return DEFAULT_COLOUR + ("-full" if name.endswith("-full") else "")
    return name


LEAD_PACKETS = 8  # packets read for trimmed_start: a trimmed file's first packet is already flagged
# FFmpeg's AVColorSpace -> the matrix its swscale converts with (sws_getCoefficients); any other: BT.601
MATRICES = {1: "bt709", 4: "fcc", 5: "bt601", 6: "bt601", 7: "smpte240m", 9: "bt2020", 10: "bt2020"}
DEFAULT_COLOUR = "bt601"
TAGGED_MATRIX_FROM = (4, 13)  # the OpenCV from which the header's matrix counts (before: BT.601 for every stream)


def _colour_name(colorspace: int, color_range: int, pix_fmt: str) -> str:
    full = color_range == 2 or pix_fmt.startswith("yuvj")  # AVCOL_RANGE_JPEG, or the yuvj formats that imply it
    return MATRICES.get(colorspace, DEFAULT_COLOUR) + ("-full" if full else "")


@functools.lru_cache(maxsize=4096)
def _pyav_traits(path: str) -> tuple[int, bool, str]:
    """(_field_order, trimmed_start, colour_of) from one PyAV opening: the header, the first packets, at most one
    decode."""
    if not _nonempty_file(path):
        return 0, False, DEFAULT_COLOUR
    try:
        import av
    except ImportError:
        return 0, False, DEFAULT_COLOUR
    colour = DEFAULT_COLOUR
    try:
        with av.open(path) as container:
            streams = container.streams.video
            if not streams:
                return 0, False, DEFAULT_COLOUR
            cc = streams[0].codec_context
            fmt = getattr(cc, "format", None)
            colour = _colour_name(
                int(getattr(cc, "colorspace", 2) or 2), int(getattr(cc, "color_range", 0) or 0), fmt.name if fmt else ""
            )
            order, trimmed = int(getattr(cc, "field_order", 0) or 0), False
            for n, packet in enumerate(container.demux(streams[0])):
                trimmed = trimmed or (n < LEAD_PACKETS and bool(getattr(packet, "is_discard", False)))
                if not order:
                    frames = packet.decode()
                    if frames:
                        order = INTERLACED_FRAMES if getattr(frames[0], "interlaced_frame", False) else 1
                if (order or n >= 4 * LEAD_PACKETS) and n + 1 >= LEAD_PACKETS:
                    break
            return order, trimmed, colour
    except Exception:  # PyAV's own error types for what it cannot open or decode; OpenCV's reading decides then
        return 0, False, colour  # the header's tags where they were read before a packet failed


@functools.lru_cache(maxsize=1)
def _opencv_version() -> tuple[int, int]:
    parts = cv2.__version__.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (99, 0)  # an unknown build: assume the newest behaviour


def _plausible(count: float) -> int:
    """A frame count hint, or -1 when it is <= 0, not finite or absurdly large."""
    if not math.isfinite(count) or count <= 0 or count > MAX_FRAME_HINT:
        return -1
    return int(count)


def read_prefix(path: str, n: int) -> list[np.ndarray]:
    """Up to n frames from the start of a video (BGR); [] if it cannot be read (or OpenCV would garble it)."""
    cap = open_video(path) if not opencv_garbles(path) else None
    if cap is None:
        return []
    frames: list[np.ndarray] = []
    try:
        while len(frames) < n:
            ok, frame = cap.read()
            if not ok or frame is None:
                break
            frames.append(frame)
    except cv2.error:
        pass
    finally:
        cap.release()
    return frames
