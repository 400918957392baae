"""`taehv-launch bench index --files N --workers W`: what the video index costs at millions of files.

N synthetic paths (no files: the index never opens one) go through the trainer's own code: the
flat index (FlatIndex.from_paths, as build_index makes it), the index cache write and read
(index._write_index / _read_index), split_train_val and VideoClipDataset. Then one epoch of index
reads through a DataLoader of W forked workers: worker w reads `dataset.entries[i].path` for
i = w, w + W, ... (every page of the index, as a shuffled sampler does) and reports its private
memory (Private_Clean + Private_Dirty of /proc/self/smaps_rollup) before and after.

The baseline row is the list of frozen VideoEntry the trainer used before #27, with its JSON
cache and its split, read the same way. Each row runs in a fresh interpreter, so one row's
memory does not count in the other's.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = "/mnt/shared/datasets/videos"  # a plausible shared-filesystem root for the synthetic paths
SPLIT = dict(validation_fraction=0.05, max_validation_videos=64, seed=42)  # the schema's defaults


def synthetic_paths(n: int) -> list[str]:
    """n sorted absolute paths, 1000 per folder, like a scan of a sharded dataset gives."""
    return [f"{ROOT}/part-{i // 1000:05d}/clip-{i:08d}.mp4" for i in range(n)]


def private_bytes() -> int:
    """This process's private memory (bytes): what it does not share with its parent after fork."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            return sum(int(line.split()[1]) * 1024 for line in f if line.startswith(("Private_Clean", "Private_Dirty")))
    except OSError:
        import psutil

        return psutil.Process().memory_full_info().uss


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# --- one row, in its own interpreter --------------------------------------------------------


def _flat(paths: list[str], tmp: str) -> tuple[Any, dict[str, float]]:
    from ..train.data.clips import VideoClipDataset
    from ..dataindex.flat import FlatIndex
    from ..dataindex.index import _read_index, _write_index, split_train_val

    t: dict[str, float] = {}
    t0 = time.perf_counter()
    index = FlatIndex.from_paths(paths)
    t["build_s"], t0 = time.perf_counter() - t0, time.perf_counter()
    cache, key = os.path.join(tmp, "index.npz"), {"bench": len(paths)}
    _write_index(cache, key, index)
    t["save_s"], t0 = time.perf_counter() - t0, time.perf_counter()
    del index
    index = _read_index(cache, key)
    assert index is not None, f"cannot read back {cache}"
    t["load_s"], t0 = time.perf_counter() - t0, time.perf_counter()
    train, _ = split_train_val(index, **SPLIT)
    ds = VideoClipDataset(train, 480, 720, 12)
    t["split_s"] = time.perf_counter() - t0
    return ds.entries, t


def _list(paths: list[str], tmp: str) -> tuple[Any, dict[str, float]]:
    """The pre-#27 index: a list of frozen VideoEntry dataclasses, cached as JSON, split by sorting."""
    from ..dataindex.flat import VideoEntry

    t: dict[str, float] = {}
    t0 = time.perf_counter()
    entries = [VideoEntry(p, -1) for p in paths]
    t["build_s"], t0 = time.perf_counter() - t0, time.perf_counter()
    cache = os.path.join(tmp, "index.json")
    with open(cache, "w") as f:
        f.write(json.dumps({"key": {}, "missing": 0, "entries": [[e.path, e.frame_count] for e in entries]}))
    t["save_s"], t0 = time.perf_counter() - t0, time.perf_counter()
    del entries
    with open(cache) as f:
        entries = [VideoEntry(str(p), int(n)) for p, n in json.load(f)["entries"]]
    t["load_s"], t0 = time.perf_counter() - t0, time.perf_counter()
    n, seed = len(entries), SPLIT["seed"]
    k = min(max(1, round(SPLIT["validation_fraction"] * n)), SPLIT["max_validation_videos"], n - 1)
    held = set(sorted(range(n), key=lambda i: hashlib.sha1(f"{seed}:{entries[i].path}".encode()).digest())[:k])
    train = [e for i, e in enumerate(entries) if i not in held]
    del entries, held
    t["split_s"] = time.perf_counter() - t0
    return train, t


def _reads(entries, workers: int) -> list[dict[str, int]]:
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    class IndexReads(IterableDataset):
        def __iter__(self):
            info = get_worker_info()
            w, k = (info.id, info.num_workers) if info is not None else (0, 1)
            gc.collect()
            before, total = private_bytes(), 0
            for i in range(w, len(entries), k):
                total += len(entries[i].path)
            yield torch.tensor([w, before, private_bytes(), total], dtype=torch.int64)

    loader = DataLoader(IndexReads(), batch_size=None, num_workers=workers)
    rows = [dict(zip(("worker", "before", "after", "chars"), r.tolist())) for r in loader]
    return sorted(rows, key=lambda r: r["worker"])


def measure(variant: str, files: int, workers: int) -> dict[str, Any]:
    """One row: build the index `variant` ("flat" or "list") of `files` entries and read it with `workers`."""
    import torch  # noqa: F401  (imported before the first memory reading, as in the trainer)

    gc.collect()
    base = private_bytes()
    paths = synthetic_paths(files)
    with tempfile.TemporaryDirectory(prefix="taehv-bench-index-") as tmp:
        entries, times = (_flat if variant == "flat" else _list)(paths, tmp)
        disk = sum(os.path.getsize(os.path.join(tmp, f)) for f in os.listdir(tmp))
    del paths
    gc.collect()
    rank = private_bytes() - base
    reads = _reads(entries, workers)
    growth = [r["after"] - r["before"] for r in reads]
    return {
        "variant": variant,
        "files": files,
        "train_entries": len(entries),
        "workers": workers,
        **times,
        "cache_bytes": disk,
        "rank_index_bytes": rank,
        "rss_bytes": rss_bytes(),
        "worker_growth_max": max(growth),
        "worker_growth_mean": sum(growth) / len(growth),
        "paths_read": sum(len(range(r["worker"], len(entries), workers)) for r in reads),
    }


# --- the command ----------------------------------------------------------------------------

TARGET_WORKER, TARGET_RANK = 20e6, 200e6


def run(files: int, workers: list[int], baseline: bool = True, as_json: bool = False) -> int:
    from ..errors import ConfigError, LaunchError

    if files < 2:
        raise ConfigError(f"--files {files}: give at least 2 synthetic videos (e.g. --files 3000000)")
    if any(w < 1 for w in workers):
        raise ConfigError(f"--workers {min(workers)}: give at least 1 DataLoader worker")
    rows = []
    for w in workers:
        for variant in (["list"] if baseline else []) + ["flat"]:
            argv = [sys.executable, "-m", "taehv_launch.bench.index", variant, str(files), str(w)]
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
                raise LaunchError(
                    f"bench index: the {variant} row at {w} workers failed ({tail}): try fewer --files or --workers"
                )
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            if not as_json:
                print(_line(rows[-1]), flush=True)
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    flat = [r for r in rows if r["variant"] == "flat"]
    ok = all(r["worker_growth_max"] < TARGET_WORKER and r["rank_index_bytes"] < TARGET_RANK for r in flat)
    print(
        f"target (#27): per-worker growth < 20 MB and per-rank index memory < 200 MB: "
        f"{'met' if ok else 'NOT met'} by the flat index ({os.cpu_count()} CPU cores here)"
    )
    return 0


def _line(r: dict[str, Any]) -> str:
    mb = 1e6
    name = {"list": "list of VideoEntry (before #27)", "flat": "flat arrays (now)"}[r["variant"]]
    return (
        f"{name:32s} {r['files']:,} videos, {r['workers']} workers: build {r['build_s']:.2f} s, cache write "
        f"{r['save_s']:.2f} s ({r['cache_bytes'] / mb:.0f} MB), read {r['load_s']:.2f} s, split + dataset "
        f"{r['split_s']:.2f} s; rank index memory {r['rank_index_bytes'] / mb:.0f} MB; per-worker growth over "
        f"one epoch of reads: max {r['worker_growth_max'] / mb:.1f} MB, mean {r['worker_growth_mean'] / mb:.1f} MB"
    )


if __name__ == "__main__":  # one row: python -m taehv_launch.bench.index VARIANT FILES WORKERS
    print(json.dumps(measure(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
