"""Cutting an H.264 clip on NVDEC with PyNvVideoCodec's low-level demuxer and decoder (issue 38 item 1).

A clip at a random start decodes every picture from the keyframe before it. SimpleDecoder (nvdec.py's other
path) maps every one of those pictures out of NVDEC: one block-linear to pitch-linear conversion kernel
(`ConvertNV12BLtoNV12`, cuvidMapVideoFrame's) and two plane copies a picture on the SMs the training step uses,
~87 conversions and ~186 copies for a 12-frame clip of a long-GOP 1080p file where 12 would do
(scripts/nvdec_gpu_work.py, docs/benchmarks.md). Here the demuxer's packets are fed to the decoder by hand:

- a packet whose picture the clip does not show is flagged `discardable`: NVDEC decodes it for reference and
  the picture is never mapped (PyNvVideoCodec's own notes), so only the clip's frames are converted and copied;
- a packet whose slices are non-reference (nal_ref_idc 0) and whose picture the clip does not show is not sent
  at all: no later picture refers to it (x264's default stream has about half its pictures so);
- the packets before the clip's keyframe are demuxed from the file's start (no decoding), up to SCAN_LIMIT of
  them; a clip starting further in goes through SimpleDecoder. (The demuxer's Seek(k) lands on the keyframe
  before frame k, but with it the path cut fewer clips than SimpleDecoder: docs/benchmarks.md.)

Only frames of MIN_PIXELS or more take the path: on smaller ones the Python work a packet costs more than the
mapping it saves (docs/benchmarks.md). Frame k is the k-th smallest presentation timestamp among the file's
video packets, as SimpleDecoder and OpenCV count (checked frame for frame on constant-rate, closed-GOP x264
files and the H.264 test videos; variable frame rates and open GOPs were not in those checks). That table is
read once per file and process, demuxing its first SCAN_LIMIT + REORDER packets (no decoding), and kept in a
cache bounded by frames. Files it cannot number (missing or repeated timestamps, no keyframe), other codecs,
and clips it cannot plan go through SimpleDecoder; a file on which this path fails once goes there for good, in
every thread, with one log line a reason. TAEHV_NVDEC_SEEK=0 turns the path off (side-by-side benchmarks).
Pure parts have CPU tests; the feeding is tested against a scripted demuxer and decoder (NVDEC needs a GPU).
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

NOPTS = -(1 << 63)  # FFmpeg's AV_NOPTS_VALUE
CACHED_FRAMES = 4_000_000  # packet-table entries kept per process (~24 bytes each)
SCAN_LIMIT = 3000  # packets demuxed from the file's start at most (chosen, not measured); a clip starting
# further in goes through SimpleDecoder, and a file's table holds its first SCAN_LIMIT + REORDER packets only
REORDER = 64  # packets read past a table's end: H.264 reorders at most 16 pictures, so the display order of
# all but the table's last REORDER packets is known (its frames past that: SimpleDecoder)
DECODERS = 3  # low-level NVDEC sessions a thread keeps (one per stream size)
# Frames this size or larger take the path. On one H200 (docs/benchmarks.md, session 23) 11 decode threads alone
# cut 1.5x the clips on long-GOP 1080p and 1.4x on a long-GOP 720p file, but 0.97x on 480p and 0.84x on the
# H.264 test videos (360p to 1080p): where a picture is cheap to map, the path's Python work a packet costs
# more than the mapping it saves.
MIN_PIXELS = 1280 * 720
_lock = threading.Lock()
GIVEN_UP: dict[str, str] = {}  # path -> why the path failed on it: SimpleDecoder's from then on, every thread
_notes: list[str] = []
_reasons: set[str] = set()


def enabled() -> bool:
    """The path is on unless TAEHV_NVDEC_SEEK=0."""
    return os.environ.get("TAEHV_NVDEC_SEEK", "1").strip() != "0"


def how() -> str:
    """One phrase for the run's log: how NVDEC cuts H.264 clips here."""
    value = os.environ.get("TAEHV_NVDEC_SEEK", "").strip()
    if not enabled():
        return "every decoded picture mapped (SimpleDecoder: TAEHV_NVDEC_SEEK=0)"
    odd = f"; TAEHV_NVDEC_SEEK={value!r} is neither 0 nor 1, taken as 1" if value not in ("", "1") else ""
    return f"H.264 clips mapping only their own pictures{odd}"


def first_slice(data: bytes) -> int | None:
    """The first slice NAL unit's header byte (types 1 and 5) of a whole H.264 access unit, or None when it has
    none or its form is ambiguous. PyNvVideoCodec's demuxer gives Annex B (h264_mp4toannexb: a 4-byte start
    code first); MP4's length-prefixed form is read where 4-byte lengths chain exactly to the end. Bytes that
    begin 00 00 01 fit both (a length of 256-511 or a 3-byte start code): the header is taken only where both
    readings agree, else None, and the packet is decoded (the safe side)."""
    annexb = _annexb_slice(data)
    if data[:4] == b"\x00\x00\x00\x01":
        return annexb
    chained, prefixed = _prefixed_slice(data)
    if data[:3] == b"\x00\x00\x01" and chained:
        return annexb if prefixed == annexb else None
    return prefixed if chained else annexb


def nal_ref_idc(data: bytes) -> int | None:
    """nal_ref_idc of a whole access unit's first slice (first_slice), None where that is not known."""
    head = first_slice(data)
    return None if head is None else (head >> 5) & 3


def _annexb_slice(data: bytes) -> int | None:
    n, i = len(data), data.find(b"\x00\x00\x01")
    while 0 <= i < n - 3:
        if data[i + 3] & 0x1F in (1, 5):
            return data[i + 3]
        i = data.find(b"\x00\x00\x01", i + 3)
    return None


def _prefixed_slice(data: bytes) -> tuple[bool, int | None]:
    """(whether 4-byte lengths chain exactly to the end, the first slice's header byte in that reading)."""
    n, i, head = len(data), 0, None
    while i < n:
        size = int.from_bytes(data[i : i + 4], "big") if i + 4 < n else 0
        if size <= 0 or i + 4 + size > n:
            return False, None
        if head is None and data[i + 4] & 0x1F in (1, 5):
            head = data[i + 4]
        i += 4 + size
    return n > 0, head


@dataclass(frozen=True)
class Table:
    """A file's video packets in decode order: presentation timestamps and key flags; `order` holds the
    timestamps sorted (display order: frame k has order[k]); `keyat` the keyframes' decode-order positions;
    `size` the stream's (height, width) as the demuxer reads it (0 where it does not); `complete` False when
    the file has packets past the table's (its last REORDER frames are then not numbered)."""

    pts: array
    keyat: array
    order: array
    size: tuple[int, int] = (0, 0)
    complete: bool = True

    @classmethod
    def of(cls, pts: list[int], keys: list[bool], size=(0, 0), complete: bool = True) -> Table | None:
        """None when the timestamps cannot number the frames (missing or repeated) or no packet is a keyframe."""
        if not pts or len(pts) != len(keys) or NOPTS in pts or len(set(pts)) != len(pts) or not any(keys):
            return None
        keyat = array("q", (n for n, k in enumerate(keys) if k))
        return cls(array("q", pts), keyat, array("q", sorted(pts)), size, complete)

    def frames(self) -> int:
        """The frames this table numbers: all of a complete one's, the first len - REORDER of a partial one's."""
        return len(self.order) if self.complete else max(0, len(self.order) - REORDER)

    def __len__(self) -> int:
        return len(self.pts)


def plan_feed(table: Table, wanted: tuple[int, ...]) -> tuple[int, dict[int, int]] | None:
    """(the decode-order position of the keyframe to start from: the last one shown at or before the clip's
    first frame, {pts: frame index} of the wanted frames), or None when a wanted frame is past the table or
    before the file's first keyframe."""
    if not wanted or max(wanted) >= table.frames() or min(wanted) < 0:
        return None
    want = {table.order[k]: k for k in wanted}
    first = min(want)
    starts = [n for n in table.keyat if table.pts[n] <= first]  # the display order of keyframes is their decode order
    if not starts:
        return None
    return starts[-1], want


class Tables:
    """A process's packet tables, least recently used dropped past `frames` entries; shared by the threads."""

    def __init__(self, frames: int = CACHED_FRAMES):
        self.frames, self.held, self.lock, self.items = frames, 0, threading.Lock(), OrderedDict()

    def get(self, key, build):
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key]
        value = build()  # outside the lock: another thread may build the same table once more
        with self.lock:
            if key not in self.items:
                self.items[key] = value
                self.held += len(value) if value is not None else 1
            while self.held > self.frames and len(self.items) > 1:
                _, old = self.items.popitem(last=False)
                self.held -= len(old) if old is not None else 1
        return value


TABLES = Tables()


class SeekCutter:
    """One decode thread's low-level NVDEC sessions (on the thread's CUDA stream); `sent` counts the packets
    it gave NVDEC, `created` the sessions it made."""

    def __init__(self, nvc, device_index: int, stream):
        self.nvc, self.device_index, self.stream = nvc, device_index, stream
        self.decoders: OrderedDict[Any, Any] = OrderedDict()  # (codec, (height, width)) -> decoder
        self.sent = self.created = 0

    def cut(self, path: str, wanted: tuple[int, ...]):
        """planes() of the file's table where the path takes this clip, else None (SimpleDecoder's); a file the
        path fails on is given up (GIVEN_UP, a log line once per reason) and never tried again."""
        if path in GIVEN_UP:
            return None
        try:
            table = self.table(path)
            return self.planes(path, table, wanted) if table is not None else None
        except Exception as err:  # SimpleDecoder decides about this file, and the CPU if it fails too
            give_up(path, err)
            return None

    def table(self, path: str) -> Table | None:
        stat = os.stat(path)

        def build():  # None: SimpleDecoder's file (not H.264, frames under MIN_PIXELS, timestamps that number none)
            dmx = self.nvc.CreateDemuxer(path)
            size = (_call(dmx, "Height") or 0, _call(dmx, "Width") or 0)
            if dmx.GetNvCodecId() != self.nvc.cudaVideoCodec.H264 or size[0] * size[1] < MIN_PIXELS:
                return None
            pts, keys, complete = [], [], True
            for pkt in dmx:
                if pkt.bsl:
                    if len(pts) == SCAN_LIMIT + REORDER:
                        complete = False
                        break
                    pts.append(int(pkt.pts))
                    keys.append(bool(pkt.key) and _idr(pkt))  # the pictures decoding may start at
            return Table.of(pts, keys, size, complete)

        return TABLES.get((path, stat.st_size, stat.st_mtime_ns), build)

    def _decoder(self, dmx, size: tuple[int, int]):
        key = (int(dmx.GetNvCodecId()), size)
        if key not in self.decoders:
            self.created += 1
            self.decoders[key] = self.nvc.CreateDecoder(
                gpuid=self.device_index,
                codec=dmx.GetNvCodecId(),
                cudacontext=0,
                cudastream=self.stream.cuda_stream,
                usedevicememory=True,
            )
            while len(self.decoders) > DECODERS:
                self.decoders.popitem(last=False)
        self.decoders.move_to_end(key)
        return key, self.decoders[key]

    def planes(self, path: str, table: Table, wanted: tuple[int, ...]):
        """(NV12 planes (uint8 (h * 3 / 2) x w, copies) of the frames at `wanted` (sorted, distinct), (h, w)), or
        None when the plan cannot take this clip. Raises what the demuxer or decoder raises."""
        import torch

        plan = plan_feed(table, wanted)
        if plan is None:
            return None
        start, want = plan
        if start > SCAN_LIMIT:
            return None  # too far into the file to demux packet by packet: SimpleDecoder seeks on its own
        dmx = self.nvc.CreateDemuxer(path)
        key, dec = self._decoder(dmx, table.size)  # a table has the size: build() reads it, none without it
        got: dict[int, Any] = {}

        def take(frames):
            for f in frames:
                p = int(f.getPTS())
                if p in want and p not in got:
                    got[p] = torch.from_dlpack(f).clone()  # the surface is reused by a later Decode

        try:
            for n, pkt in _numbered(dmx, start):
                if n >= len(table.pts) + REORDER:  # every wanted packet is in the table: a picture never came
                    break
                if n < len(table.pts) and int(pkt.pts) != table.pts[n]:
                    raise PathFailed(f"packet {n} of the file is not the one its table holds")
                shown = int(pkt.pts) in want
                if not shown and _nal_ref(pkt) == 0:
                    continue  # a picture nothing refers to, not in the clip: NVDEC never sees it
                pkt.discardable = not shown  # decoded for reference, never mapped
                self.sent += 1
                take(dec.Decode(pkt))
                if len(got) == len(want):
                    break
            take(dec.Decode(self.nvc.PacketData()))  # end of stream: the reorder queue drains, the session resets
        except Exception:
            self.decoders.pop(key, None)  # a failed session is not reused
            raise
        if len(got) != len(want):
            raise PathFailed(f"the decoder gave {len(got)} of the {len(want)} frames")
        planes, (h, w) = [got[p] for p in sorted(want)], key[1]
        if any(p.dtype != torch.uint8 or p.ndim != 2 or p.shape[0] < h * 3 // 2 or p.shape[1] != w for p in planes):
            what = f"{planes[0].dtype} {tuple(planes[0].shape)} for {w}x{h}"
            raise PathFailed(f"NVDEC's surfaces are not 8-bit 4:2:0 here ({what})")
        return planes, (h, w)


class PathFailed(Exception):
    """The path cannot give this file's frames (the file goes to SimpleDecoder)."""


def give_up(path: str, err: BaseException) -> None:
    text = str(err).strip().splitlines()
    why = (text[0] if text else type(err).__name__)[:160]
    with _lock:
        GIVEN_UP[path] = why
        reason = re.sub(r"\d+", "N", why.split(" (")[0].split(":")[0])[:60]  # counts and positions aside
        if reason not in _reasons:
            _reasons.add(reason)
            _notes.append(
                f"data: NVDEC's low-level path gave up on {path} ({why}); that file's clips go through "
                f"SimpleDecoder from now on (this line once per reason)"
            )


def take_note() -> str:
    """The oldest line give_up() left for the run's log, else ''."""
    with _lock:
        return _notes.pop(0) if _notes else ""


def _numbered(dmx, start: int):
    """A demuxer's packets with data, in decode order, from position `start` on: (position, packet)."""
    n = -1
    for pkt in dmx:
        if pkt.bsl:
            n += 1
            if n >= start:
                yield n, pkt


def _nal_ref(pkt) -> int | None:
    """nal_ref_idc of a demuxed packet's picture (the whole packet read: first_slice tells its form)."""
    return nal_ref_idc(_bytes(pkt))


def _idr(pkt) -> bool:
    """Whether a packet holds an IDR picture: decoding can start there (h264_mp4toannexb puts the parameter sets
    before it). A keyframe that is not one (an open GOP's I picture) is no start: its parameter sets may not be
    in the packet, and a reused session could decode it with another file's."""
    head = first_slice(_bytes(pkt))
    return head is not None and head & 0x1F == 5


def _bytes(pkt) -> bytes:
    return ctypes.string_at(pkt.bsl_data, int(pkt.bsl))


def _call(obj, name: str):
    try:
        return int(getattr(obj, name)())
    except Exception:
        return None
