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
  before frame k, but on a demuxer opened per clip it cut fewer clips than the scan: docs/benchmarks.md.)

Only frames of MIN_PIXELS or more take the path: on smaller ones the Python work a packet costs more than the
mapping it saves (docs/benchmarks.md). Frame k is the k-th smallest presentation timestamp among the file's
video packets, as SimpleDecoder and OpenCV count. That table is read once per file and process by demuxing it whole (no decoding) and kept in a
cache bounded by frames. Files it cannot number (missing or repeated timestamps, no keyframe), other codecs,
and clips it cannot plan go through SimpleDecoder; a file on which this path fails once goes there for good.
TAEHV_NVDEC_SEEK=0 turns the path off (side-by-side benchmarks). Pure parts have CPU tests.
"""

from __future__ import annotations

import ctypes
import os
import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

HEAD_BYTES = 4096  # bytes of a packet read for its first slice's header (SPS/PPS/SEI may come first)
NOPTS = -(1 << 63)  # FFmpeg's AV_NOPTS_VALUE
CACHED_FRAMES = 4_000_000  # packet-table entries kept per process (~10 bytes each)
SCAN_LIMIT = 3000  # packets demuxed from the file's start at most; a clip starting further in: SimpleDecoder
DECODERS = 3  # low-level NVDEC sessions a thread keeps (one per stream size)
# Frames this size or larger take the path. On one H200 (docs/benchmarks.md, session 23) 11 decode threads alone
# cut 1.5x the clips on long-GOP 1080p and 1.4x on 720p, but 0.55x on long-GOP 360p and 0.97x on 480p: where a
# picture is cheap to map, the path's Python work a packet costs more than the mapping it saves.
MIN_PIXELS = 1280 * 720


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


def nal_ref_idc(data: bytes) -> int | None:
    """nal_ref_idc of the first slice NAL unit (types 1 and 5) of an H.264 access unit, in Annex B (start
    codes) or 4-byte length-prefixed form; None when no slice header is within `data`."""
    n = len(data)
    if data[:3] == b"\x00\x00\x01" or data[:4] == b"\x00\x00\x00\x01":
        i = data.find(b"\x00\x00\x01")
        while 0 <= i < n - 3:
            head = data[i + 3]
            if head & 0x1F in (1, 5):
                return (head >> 5) & 3
            i = data.find(b"\x00\x00\x01", i + 3)
        return None
    i = 0
    while i + 4 < n:
        size = int.from_bytes(data[i : i + 4], "big")
        head = data[i + 4]
        if head & 0x1F in (1, 5):
            return (head >> 5) & 3
        if size <= 0:
            return None
        i += 4 + size
    return None


@dataclass(frozen=True)
class Table:
    """A file's video packets in decode order: presentation timestamps and key flags; `order` holds the
    timestamps sorted (display order: frame k has order[k]); `keyat` the keyframes' decode-order positions;
    `size` the stream's (height, width) as the demuxer reads it (0 where it does not)."""

    pts: array
    keyat: array
    order: array
    size: tuple[int, int] = (0, 0)

    @classmethod
    def of(cls, pts: list[int], keys: list[bool], size: tuple[int, int] = (0, 0)) -> Table | None:
        """None when the timestamps cannot number the frames (missing or repeated) or no packet is a keyframe."""
        if not pts or len(pts) != len(keys) or NOPTS in pts or len(set(pts)) != len(pts) or not any(keys):
            return None
        return cls(array("q", pts), array("q", (n for n, k in enumerate(keys) if k)), array("q", sorted(pts)), size)

    def pays(self) -> bool:
        """Whether the path is worth its per-packet Python work here: frames of at least MIN_PIXELS."""
        return self.size[0] * self.size[1] >= MIN_PIXELS

    def __len__(self) -> int:
        return len(self.pts)


def plan_feed(table: Table, wanted: tuple[int, ...]) -> tuple[int, dict[int, int]] | None:
    """(the decode-order position of the keyframe to start from: the last one shown at or before the clip's
    first frame, {pts: frame index} of the wanted frames), or None when a wanted frame is past the table or
    before the file's first keyframe."""
    if not wanted or max(wanted) >= len(table.order) or min(wanted) < 0:
        return None
    want = {table.order[k]: k for k in wanted}
    first = min(want)
    starts = [n for n in table.keyat if table.pts[n] <= first]
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
                self.held += len(value) if value is not None else 0
            while self.held > self.frames and len(self.items) > 1:
                _, old = self.items.popitem(last=False)
                self.held -= len(old) if old is not None else 0
        return value


TABLES = Tables()


class SeekCutter:
    """One decode thread's low-level NVDEC sessions (on the thread's CUDA stream); `sent` counts the packets
    it gave NVDEC, `created` the sessions it made."""

    def __init__(self, nvc, device_index: int, stream):
        self.nvc, self.device_index, self.stream = nvc, device_index, stream
        self.decoders: OrderedDict[Any, Any] = OrderedDict()  # (codec, (height, width)) -> decoder
        self.failed: dict[str, str] = {}  # path -> why this path failed on it (SimpleDecoder takes it)
        self.sent = self.created = 0

    def table(self, path: str) -> Table | None:
        stat = os.stat(path)

        def build():
            dmx = self.nvc.CreateDemuxer(path)
            if dmx.GetNvCodecId() != self.nvc.cudaVideoCodec.H264:
                return None
            pts, keys = [], []
            for pkt in dmx:
                if pkt.bsl:
                    pts.append(int(pkt.pts))
                    keys.append(bool(pkt.key))
            return Table.of(pts, keys, (_call(dmx, "Height") or 0, _call(dmx, "Width") or 0))

        return TABLES.get((path, stat.st_size, stat.st_mtime_ns), build)

    def _decoder(self, dmx):
        size = (_call(dmx, "Height"), _call(dmx, "Width"))
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
        key, dec = self._decoder(dmx)
        if None in key[1]:
            raise RuntimeError("the demuxer does not give the stream's size")
        got: dict[int, Any] = {}

        def take(frames):
            for f in frames:
                p = int(f.getPTS())
                if p in want and p not in got:
                    got[p] = torch.from_dlpack(f).clone()  # the surface is reused by a later Decode

        try:
            for n, pkt in _numbered(dmx, start):
                if n >= len(table.pts) or int(pkt.pts) != table.pts[n]:
                    raise RuntimeError(f"packet {n} of the file is not the one its table holds")
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
            raise RuntimeError(f"the decoder gave {len(got)} of the {len(want)} frames")
        return [got[p] for p in sorted(want)], key[1]


def _numbered(dmx, start: int):
    """A demuxer's packets with data, in decode order, from position `start` on: (position, packet)."""
    n = -1
    for pkt in dmx:
        if pkt.bsl:
            n += 1
            if n >= start:
                yield n, pkt


def _nal_ref(pkt) -> int | None:
    """nal_ref_idc of a packet's picture: its first bytes, then HEAD_BYTES where parameter sets or SEI come first."""
    size = int(pkt.bsl)
    got = nal_ref_idc(ctypes.string_at(pkt.bsl_data, min(size, 64)))
    if got is None and size > 64:
        got = nal_ref_idc(ctypes.string_at(pkt.bsl_data, min(size, HEAD_BYTES)))
    return got


def _call(obj, name: str):
    try:
        return int(getattr(obj, name)())
    except Exception:
        return None
