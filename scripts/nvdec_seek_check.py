"""The trainer's NVDEC decoder with and without train/data/nvdec_seek.py's path: the same clips, and clips/s
(issue 38 item 1, GPU machine).

    python scripts/nvdec_seek_check.py FILE_OR_DIR ... [--clips 30] [--threads 11] [--seconds 6] [--rounds 2]

For every H.264 file given (folders: their *.mp4, *.mov, *.mkv), CLIPS random clips (12 frames at stride 1-2, as
the trainer draws them) plus the first and last 12 frames are cut by NvdecDecoder twice, TAEHV_NVDEC_SEEK=1 and
=0, and compared byte for byte: the full RGB frames (frames()) and the trainer's 480x720 clip (nvdec.cut(): the
NV12 clip kernel where it runs). Per file: clips compared and differing, packets the path sent to NVDEC (0: the
path does not take the file, e.g. frames under nvdec_seek.MIN_PIXELS) and why it gave a file up. Then per folder
THREADS threads cut random clips as the trainer's decode threads do, SECONDS a row, the path off and on
alternating ROUNDS times. --sessions sets nvdec_seek.DECODERS (NVDEC sessions a thread keeps). One JSON line a
result; exit 1 when a clip differs or none was compared.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import sys
import time

EXT = (".mp4", ".mov", ".mkv", ".m4v")


def draw(rng, length):
    stride = rng.randint(1, 2)
    span = 11 * stride + 1
    start = rng.randint(0, max(0, length - span))
    return tuple(min(length - 1, start + k * stride) for k in range(12))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--clips", type=int, default=30)
    ap.add_argument("--threads", type=int, default=11)
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sessions", type=int, default=0, help="nvdec_seek.DECODERS for this run (0: its default)")
    a = ap.parse_args()
    files = []
    for p in a.paths:
        if os.path.isdir(p):
            files += sorted(f for f in glob.glob(os.path.join(glob.escape(p), "*")) if f.lower().endswith(EXT))
        elif os.path.isfile(p):
            files.append(p)
        else:
            print(f"error: {p!r} is neither a video file nor a folder: give files or folders of them", file=sys.stderr)
            return 2
    bad = [
        f"--{k} {v}"
        for k, v, ok in (
            ("clips", a.clips, a.clips >= 0),
            ("threads", a.threads, a.threads >= 1),
            ("seconds", a.seconds, 0 < a.seconds <= 600),
            ("rounds", a.rounds, a.rounds >= 0),
            ("sessions", a.sessions, a.sessions >= 0),
        )
        if not ok
    ]
    if not files or bad:
        why = f"{', '.join(bad)} out of range (clips, rounds, sessions >= 0; threads >= 1; 0 < seconds <= 600)"
        print(f"error: {why if bad else 'no video files in ' + repr(a.paths)}", file=sys.stderr)
        return 2
    try:
        import cv2
        import torch

        from taehv_launch.train.data import nvdec, nvdec_seek
        from nvdec_seek_probe import timed_threads
        from taehv_launch.train.data.clips import Crop, Ticket, View
    except ImportError as err:
        print(f"error: {err}: run this on the GPU machine with the project on PYTHONPATH", file=sys.stderr)
        return 2
    if not torch.cuda.is_available() or nvdec.nvdec_available():
        print("error: NVDEC is not usable here: run this on the GPU machine with PyNvVideoCodec", file=sys.stderr)
        return 2
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    info = {}
    for f in files:
        cap = cv2.VideoCapture(f)
        n, h, w = (
            int(cap.get(p)) for p in (cv2.CAP_PROP_FRAME_COUNT, cv2.CAP_PROP_FRAME_HEIGHT, cv2.CAP_PROP_FRAME_WIDTH)
        )
        codec = int(cap.get(cv2.CAP_PROP_FOURCC)).to_bytes(4, "little").decode("latin-1")
        cap.release()
        if n >= 12 and codec.lower() in ("avc1", "h264"):
            info[f] = (n, h, w)

    def ticket(f, idx):
        n, h, w = info[f]
        cw = min(w, h * 3 // 2)
        return Ticket(f, View(idx, Crop(0, (w - cw) // 2, h, cw, False)), (h, w), codec="h264")

    def cut_with(dec, on, f, idx):
        os.environ["TAEHV_NVDEC_SEEK"] = "1" if on else "0"
        with torch.cuda.stream(dec.stream):
            full = dec.frames(f, idx)
            clip = nvdec.cut(dec, ticket(f, idx), 480, 720)
        dec.stream.synchronize()
        return full, clip

    if a.sessions:
        nvdec_seek.DECODERS = a.sessions
    on, off = nvdec.NvdecDecoder(dev), nvdec.NvdecDecoder(dev)
    rng, bad, total, errors = random.Random(11), 0, 0, []
    for f, (n, _h, _w) in info.items():
        differ, sent = 0, on.seek.sent if on.seek else 0
        picks = [draw(rng, n) for _ in range(a.clips)] + [tuple(range(12)), tuple(range(n - 12, n))]
        for idx in picks:
            try:
                x = cut_with(on, True, f, idx)
                y = cut_with(off, False, f, idx)
            except Exception as err:
                errors.append(f"{os.path.basename(f)} {idx[0]}: {type(err).__name__}: {str(err)[:160]}")
                continue
            total += 1
            if any(p.shape != q.shape or not torch.equal(p, q) for p, q in zip(x, y)):
                differ += 1
        bad += differ
        print(
            json.dumps(
                {
                    "file": os.path.basename(f),
                    "frames": n,
                    "clips": len(picks),
                    "differing": differ,
                    "packets_sent_by_path": (on.seek.sent - sent) if on.seek else 0,
                    "given_up": nvdec_seek.GIVEN_UP.get(f, "")[:120],
                    "sessions_made": on.seek.created if on.seek else 0,
                }
            ),
            flush=True,
        )
    print(
        json.dumps(
            {
                "clips_compared": total,
                "differing": bad,
                "errors": errors[:5],
            }
        ),
        flush=True,
    )
    # throughput, as the trainer's decode threads cut clips (the 480x720 clip of a 3:2 crop)
    for d in (p for p in a.paths if os.path.isdir(p)):
        pool = [f for f in info if os.path.dirname(f) == os.path.normpath(d)]
        if not pool:
            continue
        for r in range(a.rounds * 2):
            seek = r % 2 == 1
            os.environ["TAEHV_NVDEC_SEEK"] = "1" if seek else "0"
            stop, counts = time.perf_counter() + a.seconds, [0] * a.threads
            failed: list[str] = []

            def work(t, stop=stop, counts=counts, pool=pool, failed=failed):
                torch.cuda.set_device(dev)
                dec, rr = nvdec.NvdecDecoder(dev), random.Random(1000 + t)
                try:
                    while time.perf_counter() < stop:
                        f = rr.choice(pool)
                        with torch.cuda.stream(dec.stream):
                            nvdec.cut(dec, ticket(f, draw(rr, info[f][0])), 480, 720)
                        dec.stream.synchronize()
                        counts[t] += 1
                except Exception as err:
                    failed.append(f"{type(err).__name__}: {str(err)[:120]}")

            dt = timed_threads(a.threads, work)
            print(
                json.dumps(
                    {
                        "set": os.path.basename(os.path.normpath(d)),
                        "seek_path": seek,
                        "threads": a.threads,
                        "clips_per_s": round(sum(counts) / dt, 1),
                        "failed": failed[:2],
                    }
                ),
                flush=True,
            )
    return 1 if bad or not total else 0


if __name__ == "__main__":
    sys.exit(main())
