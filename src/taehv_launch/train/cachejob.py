"""`taehv-launch cache`: encode each (video, view) once with the reference VAE and store the latents.

Runs under `accelerate launch` like training (same plan, topology, NCCL set-up). The work, every
(training video, view) pair plus each validation video's centre clip, is cut into shards by
position; rank r encodes shards r, r + world, ... that are not complete yet. Stop signals are
honoured between shards (exit 75: run the same command again to continue).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from ..errors import EXIT_OK, EXIT_RESUMABLE
from ..plan.schema import Config
from .loop import build
from ..dataindex import latentcache as lc
from ..dataindex.refweights import weights_digest
from .durability.stop import StopFlag
from .loop.timing import hms


class ViewDataset(Dataset):
    """Work item j -> {"frames": uint8 TCHW or None, "view": the record stored in the shard index}."""

    def __init__(self, work: list[tuple[str, str, int]], root: str, cfg: Config):
        from .data.clips import VideoClipDataset
        from ..dataindex.index import VideoEntry

        self.work, self.root, self.seed = work, root, cfg.seed
        self.clips = VideoClipDataset(
            [VideoEntry(os.path.join(root, "_"))],
            cfg.height,
            cfg.width,
            cfg.n_frames,
            cfg.min_frame_delta,
            cfg.max_frame_delta,
            cfg.random_flip,
            cfg.seed,
        )

    def __len__(self) -> int:
        return len(self.work)

    def __getitem__(self, j: int) -> dict[str, Any]:
        split, rel, view = self.work[j]
        path = os.path.join(self.root, rel)
        rng = lc.view_rng(self.seed, rel, view) if split == "train" else None
        got = self.clips.make_view(path, rng)
        record: dict[str, Any] = {"video": rel, "view": view}
        if isinstance(got, str):
            return {"frames": None, "view": {**record, "skipped": got}}
        clip, v = got
        c = v.crop
        record.update(
            bytes=os.path.getsize(path), frames=list(v.frames), crop=[c.y, c.x, c.h, c.w, c.flip], seek=v.seek
        )
        return {"frames": clip, "view": record}


def collate_views(items: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [it["frames"] for it in items if it["frames"] is not None]
    return {"frames": torch.stack(ok) if ok else None, "views": [it["view"] for it in items]}


def plan_work(
    cfg: Config, log, weights: str | None = None
) -> tuple[dict[str, Any], list[tuple[str, range]], list[tuple[str, str, int]], str]:
    """The job record, the shards (name, work positions), the work items and the data root.
    weights: the reference VAE's digest if known (else it is computed: it reads every weight file)."""
    from ..dataindex.index import build_index, check_root, index_dir, split_train_val

    entries = build_index(cfg.data_root, cfg.annotation_file, index_dir(cfg))  # rank 0 first: run_cache_job
    root = check_root(cfg.data_root, cfg.annotation_file)
    train_e, val_e = split_train_val(entries, cfg.validation_fraction, cfg.max_validation_videos, cfg.seed)
    train_rel = [lc.relative(e.path, root) for e in train_e]
    val_rel = [lc.relative(e.path, root) for e in val_e]
    weights = weights or weights_digest(cfg.ref_vae_path)
    job = {
        "format": lc.FORMAT,
        "fingerprint": lc.fingerprint(cfg, weights),
        "views": cfg.cache_views,
        "shard_size": cfg.cache_shard_size,
        "seed": cfg.seed,
        "videos": len(entries),
        "index": lc.index_digest(train_rel + ["--"] + val_rel),
        "val": val_rel,
    }
    work = [("train", rel, k) for rel in train_rel for k in range(cfg.cache_views)]
    n_train = len(work)
    work += [("val", rel, 0) for rel in val_rel]
    shards = lc.shard_plan(n_train, cfg.cache_shard_size, "train")
    shards += [
        (name, range(n_train + p.start, n_train + p.stop))
        for name, p in lc.shard_plan(len(val_rel), cfg.cache_shard_size, "val")
    ]
    log(
        f"cache: {len(train_rel)} training videos x {cfg.cache_views} views + {len(val_rel)} validation clips = "
        f"{len(work)} clips in {len(shards)} shards of up to {cfg.cache_shard_size} -> {cfg.latent_cache}"
    )
    return job, shards, work, root


def run_cache_job(cfg: Config, run_dir: Path, debug: bool) -> int:
    stop = StopFlag()
    acc = build.make_accelerator(cfg)
    rank, world, device = acc.process_index, acc.num_processes, acc.device

    bar = None

    def log(msg: str) -> None:
        if acc.is_main_process or debug:
            line = f"[rank {rank}] {msg}" if debug else msg
            bar.write(line, file=sys.stdout) if bar is not None else print(line, flush=True)

    # the demo assets (cpu profile) with the reference VAE this job loads, whatever latent_cache_encode says
    cfg = replace(build.resolve_demo_paths(replace(cfg, latent_cache=""), device, log), latent_cache=cfg.latent_cache)
    out = Path(cfg.latent_cache).expanduser().resolve()
    if acc.is_main_process:  # index once, and claim the folder; the other ranks then check the same job
        job, shards, work, root = plan_work(cfg, log)
        if not lc.claim(out, job):
            log(f"cache: continuing the job in {out} (complete shards are kept)")
    acc.wait_for_everyone()
    if not acc.is_main_process:  # the digest rank 0 wrote: one read of the weights per job, not per rank
        weights = lc.read_job(out)["fingerprint"]["ref_vae_weights"]
        job, shards, work, root = plan_work(cfg, lambda _: None, weights)
        lc.claim(out, job)
    todo = [(name, part) for name, part in lc.rank_share(shards, rank, world) if not lc.is_complete(out, name)]
    rounds = _max_over_ranks(len(todo), device, world)
    done_before = len(shards) - _sum_over_ranks(len(todo), device, world)
    log(f"cache: {done_before} of {len(shards)} shards already complete; {world} process(es) encode the rest")
    ref = build.load_reference(replace(cfg, latent_cache=""), device)  # the job that fills the cache encodes
    if cfg.compile != "none" and device.type == "cuda":
        from .loop.speed import compile_reference, enable_compile_cache

        enable_compile_cache(cfg)
        compile_reference(ref, cfg.ref_channels_last)
        log("compile: reference VAE encoder (the first shard is slow while kernels are built)")
    batches = [
        list(part[k : k + cfg.micro_batch_size]) for _, part in todo for k in range(0, len(part), cfg.micro_batch_size)
    ]
    loader = _loader(ViewDataset(work, root, cfg), batches, cfg)
    dtype = getattr(torch, cfg.latent_cache_dtype)
    if acc.is_main_process and not debug and os.environ.get("TAEHV_TTY") == "1":  # a person at a terminal
        from tqdm.auto import tqdm

        bar = tqdm(
            total=sum(len(p) for _, p in todo),
            desc="cache (this rank)",
            unit="clip",
            dynamic_ncols=True,
            file=sys.stdout,
            mininterval=2.0,
        )
    it, clock = iter(loader), Clock(bar)
    pad = cfg.micro_batch_size if (cfg.compile != "none" and device.type == "cuda") else 0  # one shape: no recompile
    for r in range(rounds):
        if r < len(todo):
            name, part = todo[r]
            _encode_shard(out, name, part, it, ref, dtype, cfg.micro_batch_size, pad, clock)
            rate = clock.rate()
            left = sum(len(p) for _, p in todo[r + 1 :])
            log(
                f"cache: shard {name} written ({r + 1}/{len(todo)} of this rank's); "
                f"{rate:.1f} clips/s on this rank, {rate * world:.1f} on {world}; "
                f"ETA {hms(left / rate) if rate > 0 else '-'}"
            )
        if _max_over_ranks(int(stop.local), device, world):
            log(
                f"cache: stopped by a signal; complete shards are kept: run the same command to continue "
                f"(exit code {EXIT_RESUMABLE})"
            )
            return EXIT_RESUMABLE
    if bar is not None:
        bar.close()
        bar = None
    acc.wait_for_everyone()
    if acc.is_main_process:
        indexes = [lc.read_index(out, name) for name, _ in shards]
        records = [lc.ShardRecord(**{k: v for k, v in ix.items() if k != "views"}) for ix in indexes]
        manifest = lc.write_manifest(out, job, records)
        _write_speed(run_dir, clock, world, device)
        log(
            f"cache: done: {manifest['clips']} clips{_skipped_note(indexes, manifest['skipped_views'])}, "
            f"{manifest['bytes'] / 2**30:.2f} GiB in {out}; train with --set latent_cache={out}"
        )
    _end(world)
    return EXIT_OK


def _skipped_note(indexes: list[dict[str, Any]], n: int) -> str:
    """' (3 views of unusable videos skipped, e.g. a.mp4: 5 frames, fewer than n_frames=12)', or ''."""
    first = next((v for ix in indexes for v in ix["views"] if "skipped" in v), None)
    if not n or first is None:
        return ""
    return f" ({n} view{'s' if n > 1 else ''} of unusable videos skipped, e.g. {first['video']}: {first['skipped']})"


class Clock:
    """Clips encoded by this rank and when; `steady` leaves out the first batch (compile warm-up)."""

    def __init__(self, bar=None) -> None:
        self.clips, self.t0, self.first, self.bar = 0, time.perf_counter(), None, bar

    def tick(self, n: int) -> None:
        self.clips += n
        if self.bar is not None:
            self.bar.update(n)
        if self.first is None:
            self.first = (self.clips, time.perf_counter())

    def rate(self) -> float:
        return self.clips / max(time.perf_counter() - self.t0, 1e-9)

    def steady(self) -> float | None:
        if self.first is None or self.clips <= self.first[0]:
            return None
        return (self.clips - self.first[0]) / max(time.perf_counter() - self.first[1], 1e-9)


def _write_speed(run_dir: Path, clock: Clock, world: int, device: torch.device) -> None:
    """run_dir/cache_speed.json: this rank's clips/s overall and after its first batch (compile warm-up)."""
    import json

    from ..files import write_atomic

    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    write_atomic(
        run_dir / "cache_speed.json",
        json.dumps(
            {
                "clips_this_rank": clock.clips,
                "seconds": time.perf_counter() - clock.t0,
                "clips_per_s": clock.rate(),
                "steady_clips_per_s": clock.steady(),
                "processes": world,
                "peak_allocated_gib": peak,
            },
            indent=1,
        )
        + "\n",
    )


def _encode_shard(
    out: Path, name: str, part: range, it, ref, dtype: torch.dtype, micro: int, pad: int, clock: Clock
) -> None:
    views, latents = [], []
    for _ in range(0, len(part), micro):
        batch = next(it)
        frames = batch["frames"]
        if frames is not None:
            n = len(frames)
            if n < pad:  # a shard's last batch: repeat its last clip up to the compiled shape
                frames = torch.cat([frames, frames[-1:].expand(pad - n, *frames.shape[1:])])
            z = ref.encode(frames.to(ref.device, non_blocking=True))[:n]
            latents.append(z.to(dtype).cpu())
            clock.tick(n)
        for v in batch["views"]:
            if "skipped" not in v:
                v["row"] = sum(1 for u in views if "row" in u)
            views.append(v)
    stacked = torch.cat(latents) if latents else torch.zeros(0, dtype=dtype)
    lc.write_shard(out, name, stacked, views)


def _loader(dataset: Dataset, batches: list[list[int]], cfg: Config) -> DataLoader:
    from .data.clips import worker_init_fn
    from .data.workers import WorkerLoader  # workers started with the stop signals blocked

    workers = cfg.dataloader_num_workers
    extra = dict(prefetch_factor=cfg.prefetch_factor) if workers > 0 else {}
    return WorkerLoader(
        dataset,
        batch_sampler=batches,
        num_workers=workers,
        collate_fn=collate_views,
        worker_init_fn=worker_init_fn,
        pin_memory=torch.cuda.is_available(),
        **extra,
    )


def _end(world: int) -> None:
    if world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()


def _max_over_ranks(value: int, device: torch.device, world: int) -> int:
    return _reduce(value, device, world, "max")


def _sum_over_ranks(value: int, device: torch.device, world: int) -> int:
    return _reduce(value, device, world, "sum")


def _reduce(value: int, device: torch.device, world: int, op: str) -> int:
    if world == 1:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], device=device, dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return int(t.item())


if __name__ == "__main__":  # pragma: no cover - run through train/main.py --task cache
    sys.exit("run `taehv-launch cache GPUS PROFILE`")
