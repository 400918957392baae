"""Checking videos before training starts: the first usable training video (so a dataset of unreadable
files fails in seconds with one line) and the usable held-out validation videos."""

from __future__ import annotations

from typing import Sequence

from ...dataindex.flat import VideoEntry
from ...dataindex.listing import name_text
from ...errors import DataError
from .clips import MIN_SIDE
from .decode import read_prefix


def probe_first_usable(entries: Sequence[VideoEntry], n_frames: int, max_tries: int = 16) -> tuple[int, list[str]]:
    """Read the first videos until one gives a usable clip: (its position, unusable paths before it).

    Run at startup so that a dataset of unreadable (or too short) files fails in seconds with one
    line, not after the DataLoader workers have started. Each try reads at most n_frames frames
    from the start: a video with fewer is skipped in training, so it is unusable here too.
    """
    broken: list[str] = []
    for k, entry in enumerate(entries[: max(1, max_tries)]):
        if _gives_usable_frame(entry.path, n_frames):
            return k, broken
        broken.append(entry.path)
    if not broken:
        raise DataError("the dataset has no videos: check data_root / annotation_file")
    raise DataError(
        f"none of the first {len(broken)} videos gives a usable clip of n_frames={n_frames} frames "
        f"(e.g. {name_text(broken[0])}): check data_root / annotation_file, that the files are videos OpenCV can "
        f"read, and that they are at least {n_frames} frames long"
    )


def usable_entries(entries: Sequence[VideoEntry], n_frames: int) -> list[VideoEntry]:
    """The entries that pass probe_first_usable's check (for the few held-out validation videos:
    validation reads only those, so one broken file there would otherwise stop the run)."""
    return [entry for entry in entries if _gives_usable_frame(entry.path, n_frames)]


def _gives_usable_frame(path: str, n_frames: int) -> bool:
    """n_frames decodable frames of at least MIN_SIDE pixels a side."""
    frames = read_prefix(path, max(1, n_frames))
    return len(frames) >= max(1, n_frames) and min(frames[0].shape[:2]) >= MIN_SIDE
