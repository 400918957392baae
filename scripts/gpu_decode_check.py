#!/usr/bin/env python3
"""The GPU decode path's test on a GPU machine (issue 23): the trainer's DecodeStage with real NVDEC.

    python scripts/gpu_decode_check.py VIDEO_ROOT [--odd DIR] [--out FILE.json]

VIDEO_ROOT holds folders of videos (e.g. h264_1080p/, hevc_1080p/, h264_2160p/ from
scripts/make_bench_videos.py); --odd adds a folder of odd and broken files (the repo's test videos);
--footage adds copies of the first H.264 MP4 that look like phone footage (scripts/footage.py: display
rotations of 90 and 270 degrees, an edit list starting 30 frames in, re-encodings tagged BT.709, BT.709 full
range and BT.601 full range), checked like a set: NVDEC's clips of the turned and tagged copies must match the
CPU path's (turned upright, in the tagged colours); the trimmed copy goes to the CPU (its frames before the
edit's start would show on NVDEC).
Checks, each printed as PASS/FAIL, exit 1 if any fails:
- every batch is full, uint8, on the GPU, 8 x 12 x 3 x 480 x 720, with 12 DataLoader workers and 4
  decode threads (the h100 profile's settings);
- NVDEC decodes the H.264 files (most clips on the GPU; HEVC and other codecs go to the CPU, logged
  once) and the clips match the CPU path's frame for frame (mean absolute difference per pixel below 2
  of 255 with --output nv12: the resize filters differ) and a decode from frame 0 without seeking;
- files NVDEC refuses are cut on the CPU, each reason logged once; broken files are skipped; a
  truncated file still gives clips;
- GPU memory: torch's peak and the process's total (nvidia-smi) before and while the stage runs at
  1080p and 2160p, for the memory model's per-thread allowance.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from taehv_launch.train.data import nvdec  # noqa: E402
from taehv_launch.train.loop.build import ShardedInfiniteSampler, make_loader  # noqa: E402
from taehv_launch.train.data.clips import VideoClipDataset, render_clip  # noqa: E402
from taehv_launch.train.data.decode import _decode_path  # noqa: E402
from taehv_launch.plan.schema import make_config  # noqa: E402

H, W, T, MICRO, WORKERS, THREADS = 480, 720, 12, 8, 12, 4
RESULTS: list[tuple[str, bool, str]] = []
LIMIT = 2.0  # mean |GPU - CPU| per pixel: the resize filters differ (antialiased bilinear vs INTER_AREA)


def check(name: str, ok: bool, detail: str) -> None:
    RESULTS.append((name, ok, detail))
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)


def process_mib() -> float:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return -1.0
    for line in out.splitlines():
        pid, mib = (x.strip() for x in line.split(","))
        if int(pid) == os.getpid():
            return float(mib)
    return -1.0


def stage_for(files: list[str], lines: list[str], threads: int = THREADS):
    ds = VideoClipDataset(files, H, W, T, 1, 2, random_flip=True, seed=0, train=True)
    ds.defer = True
    cfg = make_config(
        {
            "height": H,
            "width": W,
            "n_frames": T,
            "micro_batch_size": MICRO,
            "dataloader_num_workers": WORKERS,
            "prefetch_factor": 3,
        }
    )
    loader = make_loader(ds, MICRO, ShardedInfiniteSampler(len(ds), 0, 1, seed=0), cfg)
    return ds, nvdec.DecodeStage(
        loader, ds, torch.device("cuda"), H, W, nvdec.NvdecDecoder, threads=threads, log=lines.append
    )


def _first(ds, n: int):
    it = iter(ShardedInfiniteSampler(len(ds), 0, 1, seed=0))
    return [next(it) for _ in range(n)]


def videos(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.iterdir() if p.is_file())


def run_set(name: str, files: list[str], batches: int, report: dict) -> None:
    lines: list[str] = []
    torch.cuda.reset_peak_memory_stats()
    before = process_mib()
    ds, stage = stage_for(files, lines)
    stage_tickets = [ds.plan(i % len(ds), i) for i in list(_first(ds, MICRO))]
    t0, got = time.perf_counter(), []
    try:
        for _ in range(batches):
            got.append(next(stage))
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        during = process_mib()
    finally:
        stage.close()
    shapes_ok = all(
        b["frames"].shape == (MICRO, T, 3, H, W) and b["frames"].dtype == torch.uint8 and b["frames"].is_cuda
        for b in got
    )
    check(f"{name}: full uint8 GPU batches", shapes_ok, f"{len(got)} batches of {tuple(got[0]['frames'].shape)}")
    counts = dict(stage.counts)
    from taehv_launch.train.data.decode import codec_of, trimmed_start

    if codec_of(files[0]) in nvdec.NVDEC_CODECS and not trimmed_start(files[0]):
        check(
            f"{name}: decoded by NVDEC",
            counts["gpu"] >= 0.8 * (counts["gpu"] + counts["cpu"]),
            f"{counts} ({len(got) * MICRO / wall:.1f} clips/s incl. start-up); lines: {lines}",
        )
    else:
        check(
            f"{name}: {codec_of(files[0])} decoded on the CPU",
            counts["gpu"] == 0 and len(lines) == 1,
            f"{counts}; lines: {lines}",
        )
    cpu = VideoClipDataset(files, H, W, T, 1, 2, random_flip=True, seed=0, train=True)
    sampler = iter(ShardedInfiniteSampler(len(ds), 0, 1, seed=0))
    diffs, aligned, frames = [], 0, 0
    for k in range(min(8, MICRO)):
        i = next(sampler)
        want = cpu[i]["frames"].float()
        mine = got[0]["frames"][k].float().cpu()
        diffs.append((mine - want).abs().mean().item())
        for t in range(1, T - 1):  # the GPU frame is closest to the CPU frame at its own position
            near = [(mine[t] - want[u]).abs().mean().item() for u in (t - 1, t, t + 1)]
            aligned += near.index(min(near)) == 1
            frames += 1
    truth_gpu, truth_cpu = [], []  # against decoding from frame 0 without seeking (exact on every codec)
    for k, ticket in enumerate(stage_tickets[:4]):
        seq, _ = _decode_path(ticket.path, sorted(set(ticket.view.frames)), False)
        if seq is None:
            continue
        ref = render_clip([seq[f] for f in ticket.view.frames], ticket.view.crop, H, W).float()
        truth_gpu.append((got[0]["frames"][k].float().cpu() - ref).abs().mean().item())
        truth_cpu.append((cpu[ticket.item]["frames"].float() - ref).abs().mean().item())
    print(
        f"      vs a sequential decode from frame 0: GPU {', '.join(f'{d:.2f}' for d in truth_gpu)}; CPU path (seeks) "
        f"{', '.join(f'{d:.2f}' for d in truth_cpu)}",
        flush=True,
    )
    check(
        f"{name}: matches the CPU path's clips",
        max(diffs) < LIMIT and aligned >= 0.9 * frames,
        f"mean |GPU - CPU| per pixel: {', '.join(f'{d:.2f}' for d in diffs)}; {aligned}/{frames} frames closest "
        f"to the CPU frame at the same position",
    )
    report[name] = {
        "counts": counts,
        "lines": lines,
        "diffs": diffs,
        "torch_peak_mib": torch.cuda.max_memory_allocated() / 2**20,
        "process_mib_before": before,
        "process_mib_during": during,
        "threads": THREADS,
    }
    print(
        f"      memory: torch peak {report[name]['torch_peak_mib']:.0f} MiB; process {before:.0f} -> {during:.0f} "
        f"MiB (nvidia-smi)",
        flush=True,
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--odd", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--footage", action="store_true", help="also check phone-like copies (scripts/footage.py)")
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument(
        "--output",
        default="nv12",
        choices=["nv12", "rgbp"],
        help="NVDEC surfaces: native + our conversion (the trainer's), or NVDEC's own RGB conversion",
    )
    a = ap.parse_args()
    nvdec.NvdecDecoder.output = a.output
    global LIMIT
    LIMIT = 2.0 if a.output == "nv12" else 8.0
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    print(
        f"GPU {torch.cuda.get_device_name(0)}, torch {torch.__version__}, PyNvVideoCodec {nvdec.nvdec_version()}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}",
        flush=True,
    )
    missing = nvdec.nvdec_available()
    check("NVDEC available", not missing, missing or "PyNvVideoCodec imports, CUDA device visible")
    if missing:
        return 1
    root, report = Path(a.root), {}
    for sub in sorted(p for p in root.iterdir() if p.is_dir()):
        run_set(sub.name, videos(sub), a.batches, report)
    if a.footage:
        from taehv_launch.train.data.decode import codec_of
        from footage import TAGS, edit_list_copy, rotated_copy, tagged_copy

        h264 = [f for sub in sorted(p for p in root.iterdir() if p.is_dir()) for f in videos(sub)]
        h264 = [f for f in h264 if f.endswith(".mp4") and codec_of(f) in nvdec.NVDEC_CODECS]
        if not h264:
            check("footage", False, f"no H.264 .mp4 under {root} to copy")
        else:
            out = Path(tempfile.mkdtemp())
            made = [str(rotated_copy(Path(h264[0]), out / f"turn{d}.mp4", d)) for d in (90, 270)]
            made.append(str(edit_list_copy(Path(h264[0]), out / "editlist30.mp4", 30)))
            made += [str(tagged_copy(Path(h264[0]), out / f"{name}.mp4", name)) for name in TAGS]
            for f in made:
                run_set(f"footage {Path(f).name}", [f], a.batches, report)
    if a.odd:
        tmp = Path(tempfile.mkdtemp())
        src = Path(a.odd) / "smpte-2997.mp4"
        if src.is_file():  # header: 251 frames; data to ~118
            (tmp / "truncated.mp4").write_bytes(src.read_bytes()[: src.stat().st_size // 2])
        (tmp / "notes.mp4").write_text("not a video")
        for p in Path(a.odd).iterdir():
            if p.is_file():
                shutil.copy(p, tmp / p.name)
        lines: list[str] = []
        ds, stage = stage_for(videos(tmp), lines)
        try:
            got = [next(stage) for _ in range(a.batches)]
        finally:
            stage.close()
        skipped = sorted({os.path.basename(p) for b in got for p in b["skipped"]})
        check(
            "odd files: full batches", all(b["frames"].shape == (MICRO, T, 3, H, W) for b in got), f"{len(got)} batches"
        )
        check(
            "odd files: broken ones skipped",
            {"empty.webm", "notes.mp4", "test_video.mp4"} <= set(skipped),
            f"skipped {skipped}",
        )
        check(
            "odd files: each refusal reason logged once",
            len(lines) == len(set(stage.reasons)),
            f"{stage.counts}; lines: {lines}",
        )
        check("odd files: the truncated file still gives clips", "truncated.mp4" not in skipped, "not skipped")
        report["odd"] = {"counts": dict(stage.counts), "lines": lines, "skipped": skipped}
    failed = [n for n, ok, _ in RESULTS if not ok]
    print(f"{len(RESULTS) - len(failed)} passed, {len(failed)} failed", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"results": RESULTS, "report": report}, indent=2))
        if "scrub_paths" in sys.modules:  # run as a script: the file says what ran, not where
            sys.modules["scrub_paths"].scrub_file(Path(a.out))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import scrub_paths  # noqa: E402  (the evidence says what ran, not where: <repo>, <tmp>, <python>, ...)

    scrub_paths.scrub_stdio()
    sys.exit(main())
