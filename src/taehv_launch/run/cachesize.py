"""How big a latent cache will be, before `taehv-launch cache` writes it, and whether it fits.

What the job writes (dataindex/latentcache.py): per view, its latents [T', C, H/s, W/s] in
latent_cache_dtype inside a shard's .safetensors, and one JSON record in the shard's .json index
(video path, view, size, frames, crop, row, CRC-32); per shard, a safetensors header and the index's
header, and a line of manifest.json; once, cache.json (the fingerprint and the validation list).
The latents are exact; the records are estimated from the paths' mean length. Views of unusable
videos are skipped, so the real cache is at most this size.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..errors import ConfigError
from ..plan.families import get_family

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
SHARD_OVERHEAD = 640  # safetensors header + the index's own fields + a manifest line, bytes
JOB_OVERHEAD = 4096  # cache.json's fingerprint and manifest.json's header, bytes


@dataclass(frozen=True)
class CacheSize:
    train_videos: int
    val_videos: int
    views: int  # per training video (validation videos: 1 centre clip)
    shape: tuple[int, int, int, int]  # one view's latents: T', C, h, w
    dtype: str
    view_bytes: int  # one view's latents
    record_bytes: int  # one view's record in its shard's index (estimate)
    shards: int
    total: int  # bytes of the whole cache
    written: int  # bytes already in the folder (a resumed job keeps its complete shards)
    entries: Any = field(default=None, repr=False, compare=False)  # the index listed (index.keep_index)

    @property
    def clips(self) -> int:
        return self.train_videos * self.views + self.val_videos

    @property
    def needed(self) -> int:
        return max(0, self.total - self.written)

    @property
    def overhead(self) -> int:
        """Bytes of the cache that are no view's: shard headers, manifest.json, cache.json's validation list."""
        return self.total - self.clips * (self.view_bytes + self.record_bytes)

    def line(self) -> str:
        """`... = 13 views x 1,745 B (...) + 5.39 kB of shard headers and job files = about 28.07 kB`: the
        terms add up to the total (a view in whole bytes, so views x bytes is exact; the rest rounded)."""
        t, c, h, w = self.shape
        return (
            f"{self.train_videos:,} videos x {self.views} views + {self.val_videos:,} validation clips = "
            f"{self.clips:,} views x {self.view_bytes + self.record_bytes:,} B ({t}x{c}x{h}x{w} {self.dtype} "
            f"latents = {self.view_bytes:,} B + ~{self.record_bytes} B of index) + {_size(self.overhead)} of "
            f"shard headers and job files = about {_size(self.total)}"
            + (f", {_size(self.written)} of it already written" if self.written else "")
        )

    def short(self) -> str:
        return f"{self.clips:,} views x {_size(self.view_bytes + self.record_bytes)}"

    def as_dict(self) -> dict[str, Any]:
        return {
            **{k: v for k, v in self.__dict__.items() if k != "entries"},
            "shape": list(self.shape),
            "clips": self.clips,
            "needed": self.needed,
            "overhead": self.overhead,
        }


def _size(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def cache_size(config: dict[str, Any]) -> CacheSize | None:
    """The cache this config's job writes; None when the videos cannot be listed yet (the cpu demo's set
    is made by the job itself). Lists the videos as the job does, reading the index cache if there is
    one and writing none (index.keep_index(size.entries) writes it once the job is sure to start)."""
    from ..dataindex.index import build_index, check_root, held_out_count, index_dir

    root = config["data_root"]
    if not config["annotation_file"] and not (root and os.path.isdir(os.path.expanduser(root))):
        return None
    entries = build_index(root, config["annotation_file"], index_dir(SimpleNamespace(**config)), read_only=True)
    n = len(entries)
    val = held_out_count(n, config["validation_fraction"], config["max_validation_videos"])
    if n == 1 and config["validation_fraction"] > 0 and config["max_validation_videos"] > 0:
        val = 1  # one video: trained on and validated on
    train = n - val if n > 1 else n
    family = get_family(config["ref_vae_type"])
    s = family.space_stride
    shape = (
        family.latent_frames(config["n_frames"]),
        config["latent_channels"],
        config["height"] // s,
        config["width"] // s,
    )
    dtype = config["latent_cache_dtype"]
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"latent_cache_dtype={dtype!r}: use one of {', '.join(DTYPE_BYTES)}")
    view_bytes = shape[0] * shape[1] * shape[2] * shape[3] * DTYPE_BYTES[dtype]
    rel_len = _mean_relative_length(entries, check_root(root, config["annotation_file"]))
    record = (
        len(
            json.dumps(
                {
                    "video": "x" * rel_len,
                    "view": config["cache_views"] - 1,
                    "bytes": 10**9,
                    "frames": [99999] * config["n_frames"],
                    "crop": [9999, 9999, 9999, 9999, False],
                    "seek": True,
                    "row": config["cache_shard_size"],
                    "crc32": 4294967295,
                },
                separators=(",", ":"),
            )
        )
        + 1
    )
    size = config["cache_shard_size"]
    shards = -(-train * config["cache_views"] // size) + -(-val // size)
    clips = train * config["cache_views"] + val
    total = clips * (view_bytes + record) + shards * SHARD_OVERHEAD + JOB_OVERHEAD + val * (rel_len + 3)
    return CacheSize(
        train,
        val,
        config["cache_views"],
        shape,
        dtype,
        view_bytes,
        record,
        shards,
        total,
        _written(Path(config["latent_cache"]).expanduser()),
        entries,
    )


def _mean_relative_length(entries, root: str) -> int:
    """Mean length of the paths under data_root, from the flat index's sizes (no path is decoded)."""
    n = len(entries)
    if not n:
        return 0
    under = len(entries.prefix) - len(root.rstrip(os.sep)) - 1  # the part of the common folder below root
    return max(1, round(int(entries.buf.nbytes) / n + max(0, under)))


def _written(cache: Path) -> int:
    try:
        return sum(f.stat().st_size for f in (cache / "shards").iterdir() if not f.name.startswith("."))
    except OSError:
        return 0


def free_space(where: str) -> tuple[int, Path]:
    """Free bytes on the filesystem that holds `where` (its nearest existing folder), and that folder."""
    path = Path(where).expanduser().resolve()
    probe = next((p for p in (path, *path.parents) if p.exists()), Path("/"))
    return shutil.disk_usage(probe).free, probe


def space_problem(size: CacheSize, where: str) -> str:
    """One line when the cache does not fit on its filesystem, else ''."""
    free, probe = free_space(where)
    if free >= size.needed:
        return ""
    return (
        f"the latent cache needs about {_size(size.needed)} more ({size.short()}), but {probe} has "
        f"{_size(free)} free: free space, lower --views or the clip size, or set latent_cache to a folder "
        f"on a larger filesystem"
    )
