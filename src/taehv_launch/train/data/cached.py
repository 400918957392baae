"""Training from a latent cache (`--set latent_cache=PATH`): every item is one cached view.

The view's frames are decoded again from the video (they are the decoder's target: the cache holds
latents only) and its reference latents are read from the shard, checked against their CRC-32.
What cannot be used is skipped and reported like a broken video: a video that is gone, changed
since it was cached or undecodable, a shard that is missing or damaged. With
latent_cache_encode="missing" such views (and videos the cache does not have) are encoded online
instead; with "always" every view is (the stored latents are not read).
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from ...errors import DataError
from ...plan.schema import Config
from ...dataindex import latentcache as lc
from .clips import Crop, Ticket, View, VideoClipDataset, read_view
from .decode import ticket_traits
from ...dataindex.refweights import weights_digest
from ...dataindex.viewtable import ViewTable, as_table

log = logging.getLogger(__name__)
OPEN_SHARDS = 32  # safetensors handles kept open per worker


class CachedViewDataset(Dataset):
    """Item i -> {"frames": uint8 TCHW, "latents": stored latents TCHW (float32) or None, "online": whether
    the reference VAE must encode this item, "skipped": what was skipped}. Views are (shard, record)
    pairs; `extra` (latent_cache_encode="missing") adds fresh random clips of videos the cache lacks."""

    def __init__(
        self,
        cache: Path,
        views: Sequence[tuple[str, dict[str, Any]]],
        data_root: str,
        height: int,
        width: int,
        seed: int,
        *,
        read_latents: bool,
        online_fallback: bool,
        extra: VideoClipDataset | None = None,
    ):
        if not views and extra is None:
            raise DataError(f"the latent cache {cache} has no usable views: write it again with taehv-launch cache")
        self.cache, self.views, self.data_root = cache, as_table(views), data_root  # flat: no copy in workers
        self.height, self.width, self.seed = height, width, seed
        self.read_latents, self.online_fallback, self.extra = read_latents, online_fallback, extra
        self._broken: dict[str, str] = {}  # video path or shard label -> why (per worker)
        self._handles: OrderedDict[str, Any] = OrderedDict()
        self._quiet = False
        self.defer = False  # True: items carry a Ticket, not frames (GPU decode, train/data/nvdec.py)

    def __len__(self) -> int:
        return len(self.views) + (len(self.extra) if self.extra is not None else 0)

    def __getitem__(self, i: int) -> dict[str, Any]:
        skipped: list[str] = []
        for j in self._candidates(int(i)):
            item, label = self._item(j, int(i))
            if item is not None:
                item["skipped"] = skipped
                return item
            skipped.append(label)
        raise DataError(
            f"no usable view in the latent cache {self.cache}: every video is gone, changed or "
            f"unreadable, or every shard is damaged (e.g. {skipped[0]}): check data_root and the cache"
        )

    def _candidates(self, i: int) -> Iterable[int]:
        n = len(self)
        first = i % n
        yield first
        if n > 1:
            for j in np.random.default_rng([self.seed % 2**63, i, 2]).permutation(n):
                if j != first:
                    yield int(j)

    def _item(self, j: int, i: int) -> tuple[dict[str, Any] | None, str]:
        if j >= len(self.views):  # a video the cache does not have: a fresh clip
            video = j - len(self.views)
            path = self.extra.entries[video].path
            clip = self.extra.plan(video, i) if self.defer else self.extra.clip(video, i)
            key = "ticket" if self.defer else "frames"
            return ({key: clip, "latents": None, "online": True} if clip is not None else None), path
        shard, rec = self.views[j]
        path = os.path.join(self.data_root, rec["video"])
        if path in self._broken:
            return None, path
        frames = self._frames(path, rec)
        if frames is None:
            return None, path
        key = "ticket" if isinstance(frames, Ticket) else "frames"
        if not self.read_latents:
            return {key: frames, "latents": None, "online": True}, ""
        label = f"latent cache shard {shard}"
        row_label = f"{label} row {rec['row']}"
        latents = None if (label in self._broken or row_label in self._broken) else self._latents(shard, rec, label)
        if latents is None:
            if self.online_fallback:
                return {key: frames, "latents": None, "online": True}, ""
            return None, (label if label in self._broken else row_label)
        return {key: frames, "latents": latents, "online": False}, ""

    def probe(self, tries: int = 16) -> None:
        """Read the first views until one is usable, so that a moved data_root or a cache of other files
        fails at start with one line, not in a DataLoader worker."""
        if not self.views:
            return
        labels, self._quiet = [], True  # one error line below, not a warning per view
        try:
            for j in range(min(tries, len(self.views))):
                item, label = self._item(j, j)
                if item is not None:
                    return
                labels.append(label)
        finally:
            self._quiet = False
        raise DataError(
            f"none of the first {len(labels)} cached views can be read (e.g. {labels[0]}: "
            f"{self._broken.get(labels[0], 'unreadable')}): point data_root at the videos the cache was "
            f"written from, or write the cache again"
        )

    def recover(self, ticket: Ticket) -> torch.Tensor | None:
        """The ticket's clip decoded on the CPU (when the GPU decoder cannot take the file); None: unusable."""
        if ticket.video >= 0 and self.extra is not None:
            return self.extra.recover(ticket)
        clip = read_view(ticket.path, ticket.view, self.height, self.width)
        return clip if clip is not None else self._mark(ticket.path, "cannot be decoded")

    def _frames(self, path: str, rec: dict[str, Any]) -> torch.Tensor | Ticket | None:
        try:
            size = os.path.getsize(path)
        except OSError:
            return self._mark(path, "is gone")
        if size != rec["bytes"]:
            return self._mark(path, f"changed since it was cached ({rec['bytes']} bytes then, {size} now)")
        view = View(tuple(rec["frames"]), Crop(*rec["crop"]), rec["seek"])
        if self.defer:
            return Ticket(path, view, **ticket_traits(path))
        clip = read_view(path, view, self.height, self.width)
        return clip if clip is not None else self._mark(path, "cannot be decoded")

    def _latents(self, shard: str, rec: dict[str, Any], label: str) -> torch.Tensor | None:
        try:
            handle = self._open(shard)
            row = handle.get_slice("latents")[rec["row"] : rec["row"] + 1][0]
        except Exception as err:  # safetensors raises its own error types for a damaged file
            return self._mark(label, f"cannot be read ({type(err).__name__})")
        if lc.row_crc(row) != rec["crc32"]:  # this view only: the shard's other rows may be fine
            return self._mark(
                f"{label} row {rec['row']}", f"is damaged (CRC-32 mismatch: {rec['video']} view {rec['view']})"
            )
        return row.float()

    def _open(self, shard: str):
        from safetensors import safe_open

        if shard in self._handles:
            self._handles.move_to_end(shard)
            return self._handles[shard]
        handle = safe_open(str(self.cache / lc.SHARDS / f"{shard}.safetensors"), framework="pt")
        self._handles[shard] = handle
        if len(self._handles) > OPEN_SHARDS:
            self._handles.popitem(last=False)
        return handle

    def _mark(self, what: str, why: str) -> None:
        if what not in self._broken and not self._quiet:
            log.warning("latent cache: skipping %s: %s", what, why)
        self._broken[what] = why
        return None

    def __getstate__(self) -> dict[str, Any]:  # open file handles stay in the process that opened them
        return {**self.__dict__, "_handles": OrderedDict()}


def collate_cached(batch: list[dict[str, Any]]) -> dict[str, Any]:
    """frames uint8 NTCHW (or "tickets": planned clips); latents float32 NTCHW with zeros where `online`
    (None when no item has any)."""
    frames = (
        {"tickets": [it["ticket"] for it in batch]}
        if "ticket" in batch[0]
        else {"frames": torch.stack([it["frames"] for it in batch])}
    )
    stored = [it["latents"] for it in batch if it["latents"] is not None]
    latents = None
    if stored:
        latents = torch.stack(
            [it["latents"] if it["latents"] is not None else torch.zeros_like(stored[0]) for it in batch]
        )
    return {
        **frames,
        "latents": latents,
        "online": [it["online"] for it in batch],
        "skipped": [p for it in batch for p in it["skipped"]],
    }


def build_cached_datasets(cfg: Config, accelerator, log_line) -> tuple[CachedViewDataset, CachedViewDataset]:
    """The training and validation sets of a latent cache, checked against this run's config."""
    from ...dataindex.index import check_root

    cache = Path(cfg.latent_cache).expanduser().resolve()
    manifest = lc.read_manifest(cfg.latent_cache)
    weights = None
    if accelerator.is_main_process and cfg.ref_vae_path and os.path.isdir(cfg.ref_vae_path):
        weights = weights_digest(cfg.ref_vae_path)  # once: it reads every weight file
    lc.check_fingerprint(manifest["fingerprint"], cfg, weights, str(cache))
    data_root = check_root(cfg.data_root, cfg.annotation_file)
    train, val, bad = ViewTable(), ViewTable(), []
    for shard in manifest["shards"]:
        name = shard["name"]
        try:
            index = lc.read_index(cache, name)
            if index["bytes"] != shard["bytes"] or index["crc32"] != shard["crc32"]:
                raise DataError(f"shard {name} is not the one the manifest lists")
        except DataError as err:
            bad.append((name, shard["clips"], str(err)))
            continue
        table = val if name.startswith("val") else train
        for rec in index["views"]:
            if "row" in rec:
                table.add(name, rec)
    train.freeze(), val.freeze()
    mode = cfg.latent_cache_encode
    held_out = set(lc.read_job(cache).get("val", []))  # never trained on, even when their shard is gone
    extra = (
        _videos_not_cached(cfg, accelerator, data_root, train.video_names() | val.video_names() | held_out)
        if mode == "missing"
        else None
    )
    common = dict(
        data_root=data_root,
        height=cfg.height,
        width=cfg.width,
        seed=cfg.seed,
        read_latents=mode != "always",
        online_fallback=mode == "missing",
    )
    train_ds = CachedViewDataset(cache, train, extra=extra, **common)
    train_ds.probe()
    val_ds = CachedViewDataset(cache, val if len(val) else train[:1], **common)
    if not len(val) and len(train):
        log_line("data: the latent cache has no usable validation clips: validation uses one training view")
    videos = len(train.videos)
    log_line(
        f"data: latent cache {cache}: {len(train)} views of {videos} videos, {len(val)} validation clips "
        f"(reference encode: {mode})"
        + (f"; {len(extra)} videos not in the cache are encoded online" if extra is not None else "")
    )
    if manifest.get("skipped_views"):
        log_line(f"data: the cache job skipped {manifest['skipped_views']} views of unusable videos")
    if bad:
        lost = sum(n for _, n, _ in bad)
        log_line(
            f"data: {len(bad)} of {len(manifest['shards'])} cache shards are missing or damaged (e.g. "
            f"{bad[0][2]}): their {lost} views are left out; run the same `taehv-launch cache` command "
            f"to rewrite them"
        )
    return train_ds, val_ds


def _videos_not_cached(cfg: Config, accelerator, data_root: str, cached: set[str]) -> VideoClipDataset | None:
    from ...dataindex.index import index_once

    entries = index_once(cfg, accelerator)
    missing = [e for e in entries if lc.relative(e.path, data_root) not in cached]
    if not missing:
        return None
    return VideoClipDataset(
        missing,
        cfg.height,
        cfg.width,
        cfg.n_frames,
        cfg.min_frame_delta,
        cfg.max_frame_delta,
        cfg.random_flip,
        cfg.seed,
        train=True,
    )
