"""The latent cache on disk: what `taehv-launch cache` writes and training with `latent_cache=PATH` reads.

    CACHE/cache.json                       the job: what the latents depend on (the fingerprint) and
                                           the work (videos, split, views per video, shard size)
    CACHE/shards/train-000000.safetensors  latents of up to cache_shard_size views, [n, T', C, h, w]
    CACHE/shards/train-000000.json         the shard's index: each view's video, frames, crop, row, CRC-32
    CACHE/shards/val-000000.*              the validation videos' centre clips, the same way
    CACHE/manifest.json                    written last, when every shard is complete

A shard is complete when its .json exists: the .safetensors is written first, each by an atomic
rename, so a killed job leaves at most a temporary file, which the next writer of that shard deletes. The work is
cut into shards by position, not by rank, so a job resumed on another GPU count continues with the
same shards, and a resumed job's manifest equals an uninterrupted one's.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import ConfigError, DataError
from ..files import disk_errors, write_atomic

FORMAT = 1
# How a view is drawn (data.VideoClipDataset.make_view with these random streams): a change here
# changes what a cache means, so it is part of the fingerprint.
VIEW_RULE = (
    "v1: video key = first 8 bytes of sha1(path under data_root); view k of a training video draws "
    "frames from default_rng([seed, key, k, 0]) and the crop/flip from default_rng([seed, key, k, 1]); "
    "validation videos: the centre clip at stride 1"
)
# Which latent space the stored latents are in: each family's normalized latent (plan/families.py, the
# space upstream's TAE of the family decodes), or (z - ref_latent_mean) / ref_latent_std when those are
# given. Caches written before (no such field) hold raw latents and are refused. Change the text when a
# family's normalization changes.
LATENT_SPACE = "v2: the family's normalized latent (docs/families.md), or ref_latent_mean/std when given"
# The config keys the stored latents depend on; a training run must agree on each.
FINGERPRINT_KEYS = (
    "ref_vae_type",
    "ref_vae_dtype",
    "ref_latent_mean",
    "ref_latent_std",
    "latent_channels",
    "height",
    "width",
    "n_frames",
    "min_frame_delta",
    "max_frame_delta",
    "random_flip",
)
MANIFEST, JOB, SHARDS = "manifest.json", "cache.json", "shards"
# after a failed write (disk full ...): a resumed job keeps every complete shard
_THEN = "then run the same command again: the complete shards are kept"


def fingerprint(cfg: Any, weights: str) -> dict[str, Any]:
    """What the latents depend on: the reference VAE (family, weights, dtype, mean/std) and the clips."""
    out = {k: list(v) if isinstance(v, tuple) else v for k, v in ((k, getattr(cfg, k)) for k in FINGERPRINT_KEYS)}
    return {
        "format": FORMAT,
        **out,
        "ref_vae_weights": weights,
        "latent_dtype": cfg.latent_cache_dtype,
        "view_rule": VIEW_RULE,
        "latent_space": LATENT_SPACE,
    }


def check_fingerprint(stored: dict[str, Any], cfg: Any, weights: str | None, where: str) -> None:
    """One ConfigError naming the first field where the cache and this run disagree."""
    if stored.get("format") != FORMAT:
        raise ConfigError(
            f"{where} is a latent cache of format {stored.get('format')}, this version reads "
            f"format {FORMAT}: write it again with `taehv-launch cache`"
        )
    mine = fingerprint(cfg, weights or stored.get("ref_vae_weights", ""))
    if stored.get("latent_space") != LATENT_SPACE:
        what = (
            "raw reference latents: it was written before each family's latents were normalized"
            if "latent_space" not in stored
            else _show(stored.get("latent_space"))
        )
        raise ConfigError(
            f"latent cache {where} holds latents in another space than this version trains on ({what}; "
            f"docs/families.md): write it again with `taehv-launch cache ... --set latent_cache=NEW`"
        )
    for key in (*FINGERPRINT_KEYS, "ref_vae_weights", "view_rule"):
        if stored.get(key) != mine[key]:
            what = (
                "the reference VAE's weights differ (ref_vae_path)"
                if key == "ref_vae_weights"
                else f"it has {key}={_show(stored.get(key))}, this run {key}={_show(mine[key])}"
            )
            raise ConfigError(
                f"latent cache {where} does not match this run: {what}: use the cache's setting, or "
                f"write a cache for this config with `taehv-launch cache ... --set latent_cache=NEW`"
            )


def _show(value: Any) -> str:
    return repr(tuple(value)) if isinstance(value, list) else repr(value)


# --- views ------------------------------------------------------------------------------


def video_key(relpath: str) -> int:
    return int.from_bytes(hashlib.sha1(relpath.encode()).digest()[:8], "little")


def view_rng(seed: int, relpath: str, view: int) -> Callable[[int], np.random.Generator]:
    """The random streams of view `view` of a video: a pure function of (seed, path, view)."""
    key = video_key(relpath)
    return lambda stream: np.random.default_rng([seed % 2**63, key, view, stream])


def relative(path: str, root: str) -> str:
    rel = os.path.relpath(path, root)
    return path if rel.startswith("..") else rel


def index_digest(relpaths: Sequence[str]) -> str:
    return hashlib.sha1("\n".join(relpaths).encode()).hexdigest()


def shard_plan(n_items: int, shard_size: int, split: str) -> list[tuple[str, range]]:
    """(shard name, item positions) for n_items work items cut into shards of shard_size, by position."""
    return [
        (shard_name(split, k), range(start, min(start + shard_size, n_items)))
        for k, start in enumerate(range(0, n_items, shard_size))
    ]


def shard_name(split: str, k: int) -> str:
    return f"{split}-{k:06d}"


def rank_share(shards: Sequence[Any], rank: int, world: int) -> list[Any]:
    """Shard k goes to rank k % world: no overlap, and every shard has an owner."""
    return [s for k, s in enumerate(shards) if k % world == rank]


# --- shards -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardRecord:
    name: str
    clips: int
    skipped: int
    bytes: int
    crc32: int


def row_crc(row) -> int:
    """CRC-32 of one stored view's latent bytes (a torch tensor of any dtype)."""
    import torch

    return zlib.crc32(row.contiguous().view(torch.uint8).numpy().tobytes())


def write_shard(root: Path, name: str, latents, views: list[dict[str, Any]]) -> ShardRecord:
    """latents [n, T', C, h, w] (the stored dtype) for the views whose "row" is set; views without a row
    are skipped ones (they carry "skipped": why). Atomic: .safetensors first, then the .json index."""
    from safetensors.torch import save

    folder = root / SHARDS
    with disk_errors(f"latent cache shard {name}", folder, _THEN):
        folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(f".{name}.*.tmp"):  # what a killed writer of this shard left
        stale.unlink(missing_ok=True)
    # No safetensors metadata: its header is written from a hash map in an order that changes from one
    # process to the next, and a shard's bytes must depend on its content only (the manifest's CRC-32).
    data = save({"latents": latents.contiguous()})
    rows = [v for v in views if "row" in v]
    assert len(rows) == latents.shape[0], (len(rows), tuple(latents.shape))
    for v in rows:
        v["crc32"] = row_crc(latents[v["row"]])
    record = ShardRecord(name, len(rows), len(views) - len(rows), len(data), zlib.crc32(data))
    with disk_errors(f"latent cache shard {name}", folder, _THEN):  # write_atomic leaves no partial file
        write_atomic(folder / f"{name}.safetensors", data, durable=True)
        write_atomic(
            folder / f"{name}.json",
            json.dumps({**record.__dict__, "views": views}, separators=(",", ":")) + "\n",
            durable=True,
        )
    return record


def read_index(root: Path, name: str) -> dict[str, Any]:
    """A shard's .json index, checked against its .safetensors file's size; DataError if unusable."""
    folder = root / SHARDS
    try:
        index = json.loads((folder / f"{name}.json").read_text())
        size = (folder / f"{name}.safetensors").stat().st_size
    except (OSError, ValueError) as err:
        raise DataError(f"shard {name} is missing or damaged ({type(err).__name__})") from None
    if not isinstance(index, dict) or not isinstance(index.get("views"), list):
        raise DataError(f"shard {name}: its index is damaged")
    if size != index.get("bytes"):
        raise DataError(f"shard {name}: {size} bytes on disk, its index says {index.get('bytes')}")
    return index


def is_complete(root: Path, name: str) -> bool:
    try:
        read_index(root, name)
        return True
    except DataError:
        return False


# --- the job record and the manifest ----------------------------------------------------


def claim(root: Path, job: dict[str, Any]) -> bool:
    """Write CACHE/cache.json for a new cache, or check that an existing one is the same job.
    True when the folder was new."""
    path = root / JOB
    if path.exists():
        same_job(read_job(root), job, root)
        return False
    with disk_errors(f"the latent cache's {JOB}", root, _THEN):
        root.mkdir(parents=True, exist_ok=True)
    if (root / SHARDS).exists() and any((root / SHARDS).iterdir()):
        raise DataError(f"{root} holds shards but no {JOB}: use an empty folder for latent_cache")
    with disk_errors(f"the latent cache's {JOB}", root, _THEN):
        write_atomic(path, json.dumps(job, indent=1) + "\n", durable=True)
    return True


def read_job(root: Path) -> dict[str, Any]:
    """CACHE/cache.json, or one DataError."""
    path = root / JOB
    try:
        job = json.loads(path.read_text())
        if not isinstance(job, dict) or not isinstance(job.get("fingerprint"), dict):
            raise ValueError
    except (OSError, ValueError):
        raise DataError(
            f"{path} is missing or damaged: delete the folder {root} or use another latent_cache path"
        ) from None
    return job


def same_job(old: dict[str, Any], job: dict[str, Any], root: Path) -> None:
    """A resumed cache job must do the same work: one line naming what differs."""
    fix = f"run it with the settings it was started with, or use another latent_cache path than {root}"
    if old.get("fingerprint", {}).get("latent_dtype") != job["fingerprint"]["latent_dtype"]:
        raise ConfigError(
            f"{root} stores latents as {old['fingerprint'].get('latent_dtype')}, this job asks for "
            f"latent_cache_dtype={job['fingerprint']['latent_dtype']}: {fix}"
        )
    for key in ("views", "shard_size", "seed"):
        if old.get(key) != job.get(key):
            label = {"views": "--views", "shard_size": "cache_shard_size", "seed": "seed"}[key]
            raise ConfigError(
                f"{root} was started with {label} {old.get(key)}, this job asks for {job.get(key)}: {fix}"
            )
    if old.get("index") != job.get("index"):
        raise ConfigError(
            f"{root} was started on another list of videos ({old.get('videos')} then, "
            f"{job.get('videos')} now, or files renamed): {fix}"
        )
    check_fingerprint(old["fingerprint"], _Cfg(job["fingerprint"]), job["fingerprint"]["ref_vae_weights"], str(root))


class _Cfg:
    """A fingerprint read back as attributes (check_fingerprint compares two of them)."""

    def __init__(self, fp: dict[str, Any]):
        self.__dict__.update({k: tuple(v) if isinstance(v, list) else v for k, v in fp.items()})
        self.latent_cache_dtype = fp["latent_dtype"]


def write_manifest(root: Path, job: dict[str, Any], records: list[ShardRecord]) -> dict[str, Any]:
    manifest = {
        "format": FORMAT,
        "fingerprint": job["fingerprint"],
        "views": job["views"],
        "shard_size": job["shard_size"],
        "seed": job["seed"],
        "videos": job["videos"],
        "validation_videos": len(job["val"]),
        "clips": sum(r.clips for r in records),
        "skipped_views": sum(r.skipped for r in records),
        "bytes": sum(r.bytes for r in records),
        "shards": [r.__dict__ for r in records],
    }
    with disk_errors(f"the latent cache's {MANIFEST}", root, _THEN):
        write_atomic(root / MANIFEST, json.dumps(manifest, indent=1) + "\n", durable=True)
    return manifest


def read_manifest(root: str) -> dict[str, Any]:
    """CACHE/manifest.json, or one ConfigError saying what to do."""
    path = Path(root).expanduser()
    if not path.is_dir():
        raise ConfigError(
            f"latent_cache={root}: no such folder: write it first with "
            f"`taehv-launch cache GPUS PROFILE --set latent_cache={root}`"
        )
    if not (path / MANIFEST).exists():
        unfinished = (path / JOB).exists()
        raise ConfigError(
            f"latent_cache={root} has no {MANIFEST}: "
            + (
                "its cache job did not finish: run the same `taehv-launch cache` command again to complete it"
                if unfinished
                else "it is not a latent cache (taehv-launch cache writes one)"
            )
        )
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        if not (
            isinstance(manifest, dict)
            and isinstance(manifest.get("fingerprint"), dict)
            and isinstance(manifest.get("shards"), list)
            and all(isinstance(s, dict) and {"name", "clips", "bytes", "crc32"} <= set(s) for s in manifest["shards"])
        ):
            raise ValueError
    except (OSError, ValueError):
        raise ConfigError(
            f"{path / MANIFEST} is damaged: run the same `taehv-launch cache` command again (complete shards are kept)"
        ) from None
    return manifest
