"""`taehv-launch bench loader`: how many clips per second the data loader delivers.

Three views, side by side in one run, on the same files and the same clip plans:
- decode: one process decoding clips (12 frames at a random start and stride), per decoder,
  to get a per-core rate and see where a clip's time goes (seek, decode, convert, resize);
- pool: the same decode in N plain processes (no DataLoader), to see whether decoding scales;
- loader: the trainer's own dataset and DataLoader (workers, collate, pinned memory) at
  N workers, with FFmpeg's default threads and with one decode thread per worker.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..compat import loader_worker_pids
from ..errors import UserError


def _videos(data_root: str) -> list[str]:
    from ..dataindex.index import VIDEO_EXTENSIONS

    files = sorted(str(p) for p in Path(data_root).rglob("*") if p.suffix.lower() in VIDEO_EXTENSIONS and p.is_file())
    if not files:
        from ..errors import DataError

        raise DataError(f"no video files under {data_root}: give --data-root a folder of .mp4/.webm/.mkv files")
    return files


def clip_plans(files: list[str], n: int, n_frames: int, max_delta: int, seed: int = 0) -> list[tuple[str, list[int]]]:
    from ..train.data.clips import plan_frames
    from ..train.data.decode import header_frame_count

    rng = np.random.default_rng(seed)
    lengths = {f: max(1, header_frame_count(f)) for f in files}
    plans = []
    for i in range(n):
        f = files[i % len(files)]
        plans.append((f, plan_frames(rng, lengths[f], n_frames, 1, max_delta)))
    return plans


# ----------------------------------------------------------------------------- decoders


def decode_opencv(threads: int | None) -> Callable[[str, list[int]], int]:
    def run(path: str, wanted: list[int]) -> int:
        import cv2

        from ..train.data import decode

        cap = decode.capture(path, threads)
        try:
            frames, _ = decode._decode(cap, sorted(set(wanted)), seek=True)
        finally:
            cap.release()
        if frames is None:
            return 0
        return sum(cv2.cvtColor(f, cv2.COLOR_BGR2RGB).shape[0] > 0 for f in frames.values())

    return run


def decode_pyav(threads: int | None) -> Callable[[str, list[int]], int]:
    def run(path: str, wanted: list[int]) -> int:
        import av

        want = set(wanted)
        got = 0
        with av.open(path) as container:
            stream = container.streams.video[0]
            if threads is not None:
                stream.thread_type, stream.thread_count = "NONE" if threads == 1 else "AUTO", threads
            else:
                stream.thread_type = "AUTO"
            rate, tb, start = stream.average_rate, stream.time_base, stream.start_time or 0
            container.seek(int(wanted[0] / rate / tb) + start, stream=stream, backward=True)
            for frame in container.decode(stream):
                idx = int(round((frame.pts - start) * tb * rate))
                if idx in want:
                    got += frame.to_ndarray(format="rgb24").shape[0] > 0
                if idx >= wanted[-1]:
                    break
        return got

    return run


DECODERS: dict[str, Callable[[], Callable[[str, list[int]], int]]] = {
    "opencv": lambda: decode_opencv(None),
    "opencv-1thread": lambda: decode_opencv(1),
    "pyav": lambda: decode_pyav(None),
    "pyav-1thread": lambda: decode_pyav(1),
}


def _available(name: str) -> bool:
    if name.startswith("pyav"):
        try:
            import av  # noqa: F401
        except ImportError:
            return False
    return True


def _pool_worker(args: tuple[str, list[tuple[str, list[int]]]]) -> int:
    name, plans = args
    fn = DECODERS[name]()
    return sum(fn(p, w) for p, w in plans)


def decode_rate(name: str, plans: list[tuple[str, list[int]]], procs: int) -> float:
    """Clips/s of `procs` plain processes decoding the plans (one process: in this one)."""
    if procs <= 1:
        fn = DECODERS[name]()
        fn(*plans[0])
        t0 = time.perf_counter()
        for p, w in plans:
            fn(p, w)
        return len(plans) / (time.perf_counter() - t0)
    per = [plans[i::procs] for i in range(procs)]
    with mp.get_context("fork").Pool(procs) as pool:
        pool.map(_pool_worker, [(name, p[:1]) for p in per])  # start-up and first open
        t0 = time.perf_counter()
        pool.map(_pool_worker, [(name, p) for p in per])
        return len(plans) / (time.perf_counter() - t0)


def _trainer_loader(files: list[str], cfg: dict[str, Any], workers: int, defer: bool):
    """(dataset, DataLoader) as the trainer builds them (make_loader), planning tickets when `defer`."""
    from ..plan.schema import make_config
    from ..train.data.clips import VideoClipDataset
    from ..train.loop.build import ShardedInfiniteSampler, make_loader

    ds = VideoClipDataset(
        files,
        height=cfg["height"],
        width=cfg["width"],
        n_frames=cfg["n_frames"],
        min_frame_delta=cfg["min_frame_delta"],
        max_frame_delta=cfg["max_frame_delta"],
        random_flip=True,
        seed=0,
        train=True,
    )
    ds.defer = defer
    sampler = ShardedInfiniteSampler(len(ds), 0, 1, seed=0)
    return ds, make_loader(ds, cfg["micro_batch_size"], sampler, make_config(cfg | {"dataloader_num_workers": workers}))


def loader_rate(
    files: list[str], cfg: dict[str, Any], workers: int, threads: int | None, seconds: float
) -> tuple[float, float]:
    """(Clips/s, CPU cores) of the trainer's dataset + DataLoader (the make_loader settings) with `workers` workers."""
    from ..train.data import decode

    decode.WORKER_DECODE_THREADS = threads
    _, loader = _trainer_loader(files, cfg, workers, defer=False)
    it = iter(loader)
    try:
        return _timed(it, workers, seconds)
    finally:
        del it, loader
        decode.WORKER_DECODE_THREADS = None


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes (all their threads), from /proc."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def _timed(batches, workers: int, seconds: float) -> tuple[float, float]:
    """(clips/s, CPU cores used by this process and the DataLoader's workers) over `seconds`."""
    for _ in range(max(2, workers)):  # every worker has started and delivered once
        next(batches)
    it = getattr(batches, "it", batches)
    pids = [os.getpid(), *loader_worker_pids(it)]
    cpu0, t0, clips = _cpu_seconds(pids), time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        clips += len(next(batches)["frames"])
    wall = time.perf_counter() - t0
    return clips / wall, (_cpu_seconds(pids) - cpu0) / wall


def stage_rate(
    files: list[str], cfg: dict[str, Any], workers: int, threads: int, seconds: float, log=print
) -> tuple[float, float, int]:
    """(clips/s, CPU cores, threads) of the trainer's GPU path: the dataset planning tickets in `workers`
    DataLoader workers and the DecodeStage decoding them with NVDEC in `threads` threads (0: chosen from
    the files' sources and the GPU as the trainer chooses, without a training plan's memory cap)."""
    import torch

    from ..train.data import nvdec

    ds, loader = _trainer_loader(files, cfg, workers, defer=True)
    stage = nvdec.DecodeStage(
        loader,
        ds,
        torch.device("cuda", torch.cuda.current_device()),
        cfg["height"],
        cfg["width"],
        nvdec.NvdecDecoder,
        threads=threads,
        log=log,
    )
    try:
        return (*_timed(stage, workers, seconds), stage.threads)
    finally:
        stage.close()


def by_height(files: list[str], heights: list[int] | None) -> list[tuple[str, list[str]]]:
    """[(label, files)]: all files, or per requested source height (from the headers)."""
    if not heights:
        return [("", files)]
    from ..errors import DataError
    from ..train.data.decode import header_info

    found: dict[int, list[str]] = {}
    for f in files:
        found.setdefault(header_info(f)[2], []).append(f)
    missing = [h for h in heights if h not in found]
    if missing:
        have = ", ".join(f"{h}p ({len(v)})" for h, v in sorted(found.items()) if h)
        raise DataError(
            f"no videos {missing[0]} pixels high under the data root (it has: {have or 'none'}): "
            f"pass --resolution with one of those heights"
        )
    return [(f"{h}p", found[h]) for h in heights]


def run(
    data_root: str,
    height: int,
    width: int,
    n_frames: int,
    micro: int,
    workers: list[int],
    decoders: list[str],
    seconds: float,
    clips: int,
    as_json: bool,
    resolutions: list[int] | None = None,
    threads: int = 0,
) -> int:
    """threads: NVDEC threads for --decoder nvdec (0: chosen from each set's sources, as the trainer does)."""
    if not 0 <= threads <= 32:
        from ..errors import ConfigError

        raise ConfigError(f"--decode-threads {threads}: give 0 (chosen from the sources) or 1-32 NVDEC threads")
    everything = _videos(data_root)
    groups = by_height(everything, resolutions)
    if "nvdec" in decoders:
        from ..train.data.nvdec import nvdec_available

        why = nvdec_available()
        if why:
            from ..errors import DataError

            raise DataError(f"bench loader --decoder nvdec needs a GPU with PyNvVideoCodec: {why}")
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if as_json else (lambda m: print(m, flush=True))
    rows: list[dict[str, Any]] = []
    report: dict[str, Any] = {}
    for label, files in groups:
        if label:
            log(f"--- sources {label}: {len(files)} files")
        try:
            report = _run_set(
                files, data_root, height, width, n_frames, micro, workers, decoders, seconds, clips, log, threads
            )
        except UserError as err:
            raise type(err)(worker_message(str(err))) from None
        rows += [r | ({"sources": label} if label else {}) for r in report["rows"]]
    report.update(rows=rows, files=len(everything))
    if as_json:
        print(json.dumps(report, indent=2))
    return 0


def worker_message(message: str) -> str:
    """A DataLoader worker's error as torch re-raises it in the main process ("Caught DataError in
    DataLoader worker process 0.\nOriginal Traceback ...\nmodule.DataError: the message"): the message."""
    if not message.startswith("Caught ") or "Original Traceback" not in message:
        return message
    last = message.rstrip().splitlines()[-1]
    name, sep, rest = last.partition(": ")
    return rest if sep and " " not in name else last


def _run_set(
    files: list[str],
    data_root: str,
    height: int,
    width: int,
    n_frames: int,
    micro: int,
    workers: list[int],
    decoders: list[str],
    seconds: float,
    clips: int,
    log,
    threads: int,
) -> dict[str, Any]:
    import torch

    cfg = {
        "height": height,
        "width": width,
        "n_frames": n_frames,
        "min_frame_delta": 1,
        "max_frame_delta": 2,
        "micro_batch_size": micro,
        "prefetch_factor": 2,
    }
    plans = clip_plans(files, clips, n_frames, 2)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    import cv2

    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "cores": cores,
        "files": len(files),
        "data_root": data_root,
        "shape": f"{micro} x {n_frames} x {height}x{width}",
        "opencv": cv2.__version__,
        "torch": torch.__version__,
        "rows": [],
    }
    try:
        import av

        report["pyav"] = av.__version__
    except ImportError:
        report["pyav"] = "absent"
    log(
        f"bench --loader: {len(files)} files under {data_root}, {cores} cores, clips of {n_frames} frames "
        f"cropped to {height}x{width}"
    )
    for name in [d for d in decoders if d != "nvdec"]:
        if not _available(name):
            log(f"  {name}: not installed, skipped")
            continue
        for procs in sorted({1, *workers}):
            rate = decode_rate(name, plans if procs > 1 else plans[: max(4, clips // 4)], procs)
            report["rows"].append({"what": "decode", "decoder": name, "procs": procs, "clips_per_s": rate})
            log(f"  decode  {name:<15} {procs:>3} processes  {rate:8.1f} clips/s")
    for ffmpeg in (0, 1, None) if any(d.startswith("opencv") for d in decoders) else ():
        for w in workers:
            rate, used = loader_rate(files, cfg, w, ffmpeg, seconds)
            label = {0: "opencv-ffmpeg-default", 1: "opencv-1thread", None: "opencv-share"}[ffmpeg]
            report["rows"].append(
                {"what": "loader", "decoder": label, "procs": w, "clips_per_s": rate, "cpu_cores": used}
            )
            log(
                f"  loader  {label:<15} {w:>3} workers    {rate:8.1f} clips/s  {used:5.1f} cores  "
                f"(trainer's dataset + DataLoader)"
            )
    if "nvdec" in decoders:
        for w in workers:
            rate, used, n = stage_rate(files, cfg, w, threads, seconds, log)
            how = "chosen from the sources" if not threads else "as set"
            report["rows"].append(
                {
                    "what": "loader",
                    "decoder": "nvdec",
                    "procs": w,
                    "threads": n,
                    "threads_how": how,
                    "clips_per_s": rate,
                    "cpu_cores": used,
                }
            )
            log(
                f"  loader  {'nvdec':<15} {w:>3} workers    {rate:8.1f} clips/s  {used:5.1f} cores  "
                f"(trainer's dataset planning, {n} NVDEC threads in this process, {how})"
            )
    return report
