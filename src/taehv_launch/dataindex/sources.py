"""What the sources look like to a decoder: each sampled file's size, keyframe interval and length.

A clip drawn at a random start costs every frame from the keyframe before its start to its last frame,
so the keyframe interval (GOP) decides a clip's decode cost as much as the resolution: x264's default
is 250 frames, as cameras and most encoders write, and a random 12-frame clip then decodes ~125 frames
of seek. plan/decodeplan.py chooses the GPU decoder's threads from this record.

The record is a sample, never the whole dataset (an index may hold millions of files): up to
SAMPLE_FILES files spread evenly over the sorted index (so each folder is represented in proportion to
its files), each probed by reading the key flags of its first PROBE_PACKETS packets in OpenCV's raw
mode: packets are read from the container without decoding, about as cheap as opening the file's
header. It is kept beside the index cache as `index-<name>.sources.json`, where the dry run finds it.
OpenCV is imported only inside probe_source.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

from ..files import write_atomic

SAMPLE_FILES = 32  # files probed per dataset
PROBE_PACKETS = 300  # packets read per file at most: a 250-frame GOP shows its second keyframe
KEYS_ENOUGH = 4  # stop reading a file at its 4th keyframe: three intervals measured
SOURCES_VERSION = 1


@dataclass(frozen=True)
class Source:
    """One probed file. gop: frames between keyframes (the mean interval of those read), the file's length
    when one keyframe opens the whole file, 0 when the stream flags no keyframe; gop_open: only one
    keyframe in PROBE_PACKETS packets, so gop is a lower bound. frames: the header's frame count (or the
    packets counted when the file ended inside the window), -1 when unknown."""

    width: int
    height: int
    gop: int
    frames: int = -1
    codec: str = ""
    gop_open: bool = False


@dataclass
class SourceSample:
    """The probe of a dataset's sample: `files` in the dataset, `sources` probed, `unreadable` that could not be."""

    files: int
    sources: list[Source] = field(default_factory=list)
    unreadable: int = 0
    unit: str = "files"  # what `files` counts ("views" for a latent cache's views)

    def median(self, what: str) -> int:
        values = [getattr(s, what) for s in self.sources if getattr(s, what) > 0]
        return int(statistics.median_low(values)) if values else 0

    def line(self) -> str:
        """e.g. '1920x1080 sources, a keyframe every 250 frames (medians of 32 files sampled from 1200 files)'."""
        if not self.sources:
            return f"no sampled file could be probed ({self.unreadable} of {self.files} tried)"
        gop, open_ = self.median("gop"), sum(s.gop_open for s in self.sources)
        text = (
            f"{self.median('width')}x{self.median('height')} sources, a keyframe every "
            f"{f'{gop}' if gop else '?'} frames (medians of {len(self.sources)} files sampled from {self.files} "
            f"{self.unit}"
        )
        sizes = {(s.width, s.height) for s in self.sources}
        gops = {s.gop for s in self.sources}
        if len(sizes) > 1 or len(gops) > 1:
            text += f"; {len(sizes)} sizes, keyframe intervals {min(gops)}-{max(gops)}"
        if open_:
            text += f"; {open_} with no second keyframe in {PROBE_PACKETS} frames"
        return text + ")"

    def to_json(self) -> str:
        doc = {
            "version": SOURCES_VERSION,
            "files": self.files,
            "unit": self.unit,
            "unreadable": self.unreadable,
            "packets": PROBE_PACKETS,
            "sources": [asdict(s) for s in self.sources],
        }
        return json.dumps(doc, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> SourceSample | None:
        """The record, or None if the text is not one of this version (json.loads' ValueError passes through)."""
        doc = json.loads(text)
        try:
            if not isinstance(doc, dict) or doc.get("version") != SOURCES_VERSION:
                return None
            sources = [Source(**{k: s[k] for k in Source.__dataclass_fields__ if k in s}) for s in doc["sources"]]
            numbers = [getattr(s, k) for s in sources for k in ("width", "height", "gop", "frames")]
            if not all(type(v) is int for v in numbers):
                return None
            return cls(int(doc["files"]), sources, int(doc.get("unreadable", 0)), str(doc.get("unit", "files")))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


def probe_source(path: str, packets: int = PROBE_PACKETS) -> Source | None:
    """The file's size, keyframe interval, length and codec from its first packets (not decoded); None when
    it cannot be opened or has no frame size."""
    import cv2

    try:
        if not os.path.isfile(path) or os.path.getsize(path) == 0:
            return None
        cap = cv2.VideoCapture(path, cv2.CAP_FFMPEG, [cv2.CAP_PROP_FORMAT, -1])
    except (OSError, cv2.error):
        return None
    try:
        if not cap.isOpened():
            return None
        width, height = int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
        count, code = cap.get(cv2.CAP_PROP_FRAME_COUNT), int(cap.get(cv2.CAP_PROP_FOURCC))
        keys, read, ended = [], 0, False
        try:
            while read < packets and len(keys) < KEYS_ENOUGH:
                if not cap.grab():
                    ended = True
                    break
                if cap.get(cv2.CAP_PROP_LRF_HAS_KEY_FRAME):
                    keys.append(read)
                read += 1
        except cv2.error:
            ended = True
    finally:
        cap.release()
    if width <= 0 or height <= 0 or read == 0:
        return None
    frames = int(count) if 0 < count <= 10_000_000 else (read if ended else -1)
    if len(keys) >= 2:
        gop, open_ = round((keys[-1] - keys[0]) / (len(keys) - 1)), False
    elif keys:
        gop, open_ = (read, False) if ended else (read, True)  # the whole file is one GOP / a lower bound
    else:
        gop, open_ = 0, False
    codec = code.to_bytes(4, "little").decode("latin-1").strip("\x00 ").lower() if code > 0 else ""
    return Source(width, height, gop, frames, codec, open_)


def sample_positions(n: int, k: int = SAMPLE_FILES) -> list[int]:
    """min(n, k) positions spread evenly over range(n), the middle of each of k equal parts."""
    k = min(n, k)
    return [min(n - 1, (2 * i + 1) * n // (2 * k)) for i in range(k)]


def sample_sources(
    paths: Sequence[str] | Callable[[int], str],
    n: int | None = None,
    k: int = SAMPLE_FILES,
    probe: Callable[[str], Source | None] = probe_source,
    unit: str = "files",
) -> SourceSample:
    """Probe k files spread evenly over `paths` (a sequence, or a function of a position with n given)."""
    total = len(paths) if n is None else n  # type: ignore[arg-type]
    path_at = paths if callable(paths) else paths.__getitem__
    sample = SourceSample(total, unit=unit)
    for pos in sample_positions(total, k):
        got = probe(path_at(pos))
        if got is None:
            sample.unreadable += 1
        else:
            sample.sources.append(got)
    return sample


def sources_path(index_cache_path: str) -> str:
    """The sources record beside an index cache file: index-<name>.npz -> index-<name>.sources.json."""
    stem = index_cache_path[: -len(".npz")] if index_cache_path.endswith(".npz") else index_cache_path
    return stem + ".sources.json"


def read_sources(path: str) -> SourceSample | None:
    """The record at `path`, or None when it is missing or not one."""
    try:
        with open(path, encoding="utf-8") as f:
            return SourceSample.from_json(f.read(1 << 20))
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None


def write_sources(path: str, sample: SourceSample) -> bool:
    """Write the record atomically; False (nothing written) when the folder is not writable."""
    try:
        write_atomic(path, sample.to_json())
    except OSError:
        return False
    return True
