"""Cutting an H.264 clip on NVDEC without decoding the frames nothing needs (issue 38).

A clip at a random start decodes every frame from the keyframe before it; on long-GOP sources that seek
is most of a clip's NVDEC work (~65 of ~77 frames a clip on 1080p files with a keyframe every 150), and
NVDEC is the limit there (12 and 14 threads cut the same clips/s). A picture whose slices have
nal_ref_idc 0 is never used to predict another, so it need not be decoded unless it is one of the
clip's frames: x264's default stream (3 B-frames, B-pyramid) has about half its frames so.
PyNvVideoCodec's SimpleDecoder decodes all of them, so here the low-level demuxer feeds the decoder
itself, leaving out the packets of non-reference pictures the clip does not show (docs/benchmarks.md,
"Long keyframe intervals": 74.0 against 44.7 clips/s at 12 threads, the same NV12 bytes).

Frame k is the k-th smallest presentation timestamp among the file's video packets, as SimpleDecoder
and OpenCV count. That table is read once per file by demuxing it whole (no decoding), so only files up
to MAX_BYTES take this path; larger ones, other codecs and streams whose timestamps do not give a
clean order keep SimpleDecoder (NvdecDecoder decides). Pure parts (nal_ref_idc, plan_feed) have CPU tests.
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

MAX_BYTES = 64 << 20  # files demuxed whole for their table: about 30 s of 1080p camera footage
TABLES = 4096  # packet tables kept per process (pts and key flags: ~9 bytes a frame)
HEAD_BYTES = 4096  # bytes of a packet read for its first slice's header (SPS/PPS/SEI may come first)
NOPTS = -(1 << 63)  # FFmpeg's AV_NOPTS_VALUE


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
    """A file's video packets in decode order: their presentation timestamps and key flags; `order` holds
    the timestamps sorted (display order: frame k has order[k])."""

    pts: tuple[int, ...]
    keys: tuple[bool, ...]
    order: tuple[int, ...]

    @classmethod
    def of(cls, pts: list[int], keys: list[bool]) -> Table | None:
        """None when the timestamps cannot number the frames (missing or repeated) or no packet is a keyframe."""
        if not pts or NOPTS in pts or len(set(pts)) != len(pts) or not any(keys):
            return None
        return cls(tuple(pts), tuple(keys), tuple(sorted(pts)))


def plan_feed(table: Table, indices: tuple[int, ...]) -> tuple[int, dict[int, int]] | None:
    """(the decode-order position of the keyframe to start from, {pts: frame index} of the wanted frames), or
    None when a wanted frame is past the table or comes before the file's first keyframe."""
    if not indices or max(indices) >= len(table.order) or min(indices) < 0:
        return None
    want = {table.order[k]: k for k in indices}
    first = min(want)
    starts = [n for n, (p, key) in enumerate(zip(table.pts, table.keys)) if key and p <= first]
    if not starts:
        return None
    return starts[-1], want


class Tables:
    """A process's packet tables, least recently used dropped past TABLES; shared by the decode threads."""

    def __init__(self, limit: int = TABLES):
        self.limit, self.lock, self.items = limit, threading.Lock(), OrderedDict()

    def get(self, key, build):
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key]
        value = build()  # outside the lock: another thread may build the same table once more
        with self.lock:
            self.items[key] = value
            while len(self.items) > self.limit:
                self.items.popitem(last=False)
        return value


TABLE_CACHE = Tables()


class SkipSeek:
    """One decode thread's low-level NVDEC session(s) for the skip path (the thread's CUDA stream)."""

    def __init__(self, nvc, device_index: int, stream):
        self.nvc, self.device_index, self.stream = nvc, device_index, stream
        self.decoders: OrderedDict[Any, Any] = OrderedDict()  # (codec, (height, width)) -> decoder
        self.failed: dict[str, str] = {}  # path -> why this path failed on it (SimpleDecoder takes it)

    def table(self, path: str, stat) -> Table | None:
        def build():
            dmx = self.nvc.CreateDemuxer(path)
            if dmx.GetNvCodecId() != self.nvc.cudaVideoCodec.H264:
                return None
            pts, keys = [], []
            for pkt in dmx:
                if pkt.bsl:
                    pts.append(int(pkt.pts))
                    keys.append(bool(pkt.key))
            return Table.of(pts, keys)

        return TABLE_CACHE.get((path, stat.st_size, stat.st_mtime_ns), build)

    def _decoder(self, dmx):
        size = (_call(dmx, "Height"), _call(dmx, "Width"))
        key = (int(dmx.GetNvCodecId()), size)
        if key not in self.decoders:
            self.decoders[key] = self.nvc.CreateDecoder(
                gpuid=self.device_index,
                codec=dmx.GetNvCodecId(),
                cudacontext=0,
                cudastream=self.stream.cuda_stream,
                usedevicememory=True,
            )
            while len(self.decoders) > 2:
                self.decoders.popitem(last=False)
        self.decoders.move_to_end(key)
        return key, self.decoders[key]

    def planes(self, path: str, table: Table, indices: tuple[int, ...]):
        """(NV12 planes (uint8 (h * 3 / 2) x w, copies) of the frames at sorted(set(indices)), (h, w)), or None
        when the plan cannot take this clip (the caller uses SimpleDecoder). Raises what the decoder raises."""
        import torch

        plan = plan_feed(table, tuple(sorted(set(indices))))
        if plan is None:
            return None
        start, want = plan
        dmx = self.nvc.CreateDemuxer(path)
        key, dec = self._decoder(dmx)
        got: dict[int, Any] = {}

        def take(frames):
            for f in frames:
                p = int(f.getPTS())
                if p in want and p not in got:
                    got[p] = torch.from_dlpack(f).clone()  # the surface is reused by the next Decode

        try:
            n = -1
            for pkt in dmx:
                if not pkt.bsl:
                    continue
                n += 1
                if n < start:
                    continue
                if int(pkt.pts) not in want and nal_ref_idc(_head(pkt)) == 0:
                    continue  # a picture nothing refers to, not in the clip: NVDEC never sees it
                take(dec.Decode(pkt))
                if len(got) == len(want):
                    break
            take(dec.Decode(self.nvc.PacketData()))  # end of stream: the reorder queue drains, the session resets
        except Exception:
            self.decoders.pop(key, None)  # a failed session is not reused
            raise
        if len(got) != len(want):
            raise RuntimeError(f"the decoder gave {len(got)} of the {len(want)} frames")
        planes = [got[p] for p in sorted(want)]
        h, w = key[1]
        if h is None or w is None:
            h, w = planes[0].shape[0] * 2 // 3, planes[0].shape[1]
        return planes, (h, w)


def _head(pkt) -> bytes:
    return ctypes.string_at(pkt.bsl_data, min(int(pkt.bsl), HEAD_BYTES))


def _call(obj, name: str):
    try:
        return int(getattr(obj, name)())
    except Exception:
        return None
