"""Checking videos before training starts: the first usable training video (so a dataset of unreadable
files fails in seconds with one line), the usable held-out validation videos, and the sources' sizes
and keyframe intervals from which the GPU decoder's threads are chosen (choose_threads)."""

from __future__ import annotations

import os
from typing import Sequence

from ...dataindex.flat import VideoEntry
from ...dataindex.listing import name_text
from ...dataindex.sources import SourceSample, sample_sources
from ...plan.decodeplan import DecodeChoice
from ...errors import DataError
from .clips import MIN_SIDE
from .decode import opencv_garbles, read_prefix


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
    garbled = opencv_garbles(broken[0])
    if garbled:  # the first of them is interlaced footage: say that, and what to do
        raise DataError(
            f"none of the first {len(broken)} videos gives a usable clip (e.g. {name_text(broken[0])}: {garbled})"
        )
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


# --- the sources, for the GPU decoder's thread choice (plan/decodeplan.py) ------------------------------


def dataset_sources(dataset) -> SourceSample:
    """A training dataset's probed sources: its index's record (build_index keeps one beside the index cache),
    else a sample probed now: of its videos, or of a latent cache's views."""
    entries = getattr(dataset, "entries", None)
    if getattr(entries, "sources", None) is not None:
        return entries.sources
    views = getattr(dataset, "views", None)
    if views is not None and len(views):
        root = dataset.data_root
        return sample_sources(lambda j: os.path.join(root, views[j][1]["video"]), len(views), unit="views")
    if getattr(dataset, "extra", None) is not None:
        return dataset_sources(dataset.extra)
    if entries is not None:
        return sample_sources(entries.path if hasattr(entries, "path") else (lambda i: entries[i].path), len(entries))
    return SourceSample(0)


def process_cores() -> float:
    """CPU cores of this process: the node's (its affinity) shared by the node's ranks."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores / max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def choose_threads(dataset, device, height: int, width: int, cfg=None) -> DecodeChoice:
    """NVDEC threads for this process when video_decode_threads is 0: from the dataset's sources, the GPU (its
    NVDEC engines and, with the run's config, the memory the plan leaves) and the process's cores."""
    import torch

    from ...plan.decodeplan import decode_choice, largest_pixels, memory_cap, nvdec_engines
    from ...plan.schema import config_dict

    cuda = getattr(device, "type", "") == "cuda"
    name = torch.cuda.get_device_name(device) if cuda else str(device)
    sources, mem = dataset_sources(dataset), None
    if cfg is not None and cuda:
        gib = torch.cuda.get_device_properties(device).total_memory / 2**30
        world = int(os.environ.get("WORLD_SIZE", "1"))
        mem = memory_cap(config_dict(cfg), gib, world, largest_pixels(sources))
    n = int(getattr(cfg, "n_frames", 0) or getattr(dataset, "n_frames", 12))
    lo = int(getattr(cfg, "min_frame_delta", 0) or getattr(dataset, "min_frame_delta", 1))
    hi = int(getattr(cfg, "max_frame_delta", 0) or getattr(dataset, "max_frame_delta", 2))
    return decode_choice(
        0,
        sources,
        n_frames=n,
        min_delta=lo,
        max_delta=hi,
        clip_pixels=n * height * width,
        engines=nvdec_engines(name),
        gpu=name,
        cores=process_cores(),
        memory=mem,
    )
