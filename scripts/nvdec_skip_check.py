"""The trainer's NVDEC decoder with and without nvdec_skip's path: the same RGB clips, and clips/s (GPU machine).

    python scripts/nvdec_skip_check.py FILE_OR_DIR ... [--clips 40] [--threads 12] [--seconds 8]

For every H.264 file given (folders: their *.mp4, *.mov, *.mkv), CLIPS random clips (12 frames at stride
1-2, as the trainer draws them) are cut by train/data/nvdec.NvdecDecoder twice, with SKIP_NONREF on and off,
and compared byte for byte (uint8 RGB); then THREADS threads cut random clips of the folders' files for
SECONDS each way, as the trainer's decode threads do (crop and resize to 480x720 included). One JSON line a
result; the last line says whether every clip matched.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import sys
import threading
import time

EXT = (".mp4", ".mov", ".mkv", ".m4v")


def clip(rng, length):
    stride = rng.randint(1, 2)
    span = 11 * stride + 1
    start = rng.randint(0, max(0, length - span))
    return tuple(min(length - 1, start + k * stride) for k in range(12))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--clips", type=int, default=40)
    ap.add_argument("--threads", type=int, default=12)
    ap.add_argument("--seconds", type=float, default=8)
    a = ap.parse_args()
    import cv2
    import torch

    from taehv_launch.train.data import nvdec
    from taehv_launch.train.data.clips import Crop

    files = []
    for p in a.paths:
        files += (
            sorted(f for f in glob.glob(os.path.join(p, "*")) if f.lower().endswith(EXT)) if os.path.isdir(p) else [p]
        )
    dev = torch.device("cuda", 0)
    lengths = {}
    for f in files:
        cap = cv2.VideoCapture(f)
        n = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
        codec = int(cap.get(cv2.CAP_PROP_FOURCC)).to_bytes(4, "little").decode("latin-1")
        cap.release()
        if n >= 12 and codec.lower() in ("avc1", "h264"):
            lengths[f] = n
    on, off = nvdec.NvdecDecoder(dev), nvdec.NvdecDecoder(dev)
    rng, bad, total, errors = random.Random(11), 0, 0, []
    for f, n in lengths.items():
        fb = 0
        picks = [clip(rng, n) for _ in range(a.clips)] + [tuple(range(12)), tuple(range(n - 12, n))]
        for idx in picks:
            try:
                nvdec.SKIP_NONREF = True
                x = on.frames(f, idx)
                nvdec.SKIP_NONREF = False
                y = off.frames(f, idx)
            except Exception as err:
                errors.append(f"{os.path.basename(f)} {idx[0]}: {type(err).__name__}: {str(err)[:160]}")
                continue
            total += 1
            if x.shape != y.shape or not torch.equal(x, y):
                fb += 1
        bad += fb
        skipped = any(k[0] == f and v is not None for k, v in nvdec.nvdec_skip.TABLE_CACHE.items.items())
        print(
            json.dumps(
                {
                    "file": os.path.basename(f),
                    "frames": n,
                    "clips": len(picks),
                    "differing": fb,
                    "skip_path_taken": skipped,
                }
            ),
            flush=True,
        )
    failed = on.skip.failed if on.skip is not None else {}
    print(
        json.dumps(
            {
                "clips_compared": total,
                "differing": bad,
                "errors": errors[:5],
                "skip_path_failed": {os.path.basename(k): v for k, v in failed.items()},
            }
        ),
        flush=True,
    )
    # throughput, as the trainer's decode threads cut clips (crop to 3:2, resize to 480x720)
    dirs = [p for p in a.paths if os.path.isdir(p)]
    for d in dirs:
        pool = [f for f in lengths if os.path.dirname(f) == d.rstrip("/")]
        if not pool:
            continue
        for skip in (False, True, False, True):
            nvdec.SKIP_NONREF = skip
            stop, counts = time.perf_counter() + a.seconds, [0] * a.threads

            def work(t, stop=stop, counts=counts, pool=pool):
                dec, r = nvdec.NvdecDecoder(dev), random.Random(1000 + t)
                torch.cuda.set_device(dev)
                while time.perf_counter() < stop:
                    f = r.choice(pool)
                    with torch.cuda.stream(dec.stream):
                        x = dec.frames(f, clip(r, lengths[f]))
                        h, w = x.shape[-2:]
                        cw = min(w, h * 3 // 2)
                        nvdec.finish(x, Crop(0, (w - cw) // 2, h, cw, False), None, 480, 720)
                    dec.stream.synchronize()
                    counts[t] += 1

            t0 = time.perf_counter()
            ths = [threading.Thread(target=work, args=(t,)) for t in range(a.threads)]
            for th in ths:
                th.start()
            for th in ths:
                th.join()
            dt = time.perf_counter() - t0
            print(
                json.dumps(
                    {
                        "set": os.path.basename(d.rstrip("/")),
                        "skip_nonref": skip,
                        "threads": a.threads,
                        "clips_per_s": round(sum(counts) / dt, 1),
                    }
                ),
                flush=True,
            )
    return 1 if bad or not total else 0


if __name__ == "__main__":
    sys.exit(main())
