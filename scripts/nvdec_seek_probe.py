"""How much NVDEC work a clip's seek costs, and what skipping non-reference frames saves (issue 38, GPU machine).

    python scripts/nvdec_seek_probe.py DIR [--threads 12] [--seconds 8] [--check 24]

For the H.264 files in DIR it times three ways of cutting the same random clips (12 frames at stride 1-2,
as the trainer draws them), each with THREADS threads (one NVDEC session and CUDA stream each):

  simple  PyNvVideoCodec's SimpleDecoder.get_batch_frames_by_index (what train/data/nvdec.py uses)
  full    the low-level demuxer and decoder, every packet from the keyframe before the clip
  skip    the same, but packets whose slices are non-reference (nal_ref_idc 0) and whose frame is not
          wanted are never sent to NVDEC: no later frame refers to them
  discard `full` with the unwanted pictures' packets flagged discardable (decoded, never surfaced);
          `skip+discard` both (--modes picks the rows; the default leaves these two out)

and checks that `skip` gives the same NV12 bytes as `simple` on CHECK clips. Prints one JSON line per row.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
from taehv_launch.train.data.nvdec_seek import nal_ref_idc as nal_ref  # noqa: E402  (the trainer's own reading)


def timed_threads(n: int, work) -> float:
    """Seconds that n threads running work(t), t = 0..n-1, take together."""
    t0 = time.perf_counter()
    ths = [threading.Thread(target=work, args=(t,)) for t in range(n)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    return time.perf_counter() - t0


def table(nvc, path):
    """Decode-order packets: (pts, key, ref) and the display-order pts list."""
    dmx = nvc.CreateDemuxer(path)
    rows = []
    for pkt in dmx:
        if pkt.bsl == 0:
            continue
        data = ctypes.string_at(pkt.bsl_data, min(int(pkt.bsl), 4096))
        rows.append((int(pkt.pts), int(pkt.key), nal_ref(data)))
    return rows, sorted(r[0] for r in rows)


def draw(rng, length):
    stride = rng.randint(1, 2)
    span = 11 * stride + 1
    start = rng.randint(0, length - span)
    return [start + k * stride for k in range(12)]


class LowLevel:
    """discard (scripts/nvdec_gpu_work.py): every packet whose picture the clip does not use is flagged
    discardable, which PyNvVideoCodec documents as decoded for reference with its output frame suppressed."""

    def __init__(self, nvc, torch, skip, discard=False):
        self.nvc, self.torch, self.skip, self.discard = nvc, torch, skip, discard
        self.stream = torch.cuda.Stream()
        self.dec = None
        self.sent = 0

    def frames(self, path, tab, indices):
        nvc, torch = self.nvc, self.torch
        rows, order = tab
        want = {order[k]: k for k in indices}
        first = min(want)
        start = max(i for i, r in enumerate(rows) if r[1] and r[0] <= first)
        dmx = nvc.CreateDemuxer(path)
        if self.dec is None:
            self.dec = nvc.CreateDecoder(
                gpuid=0,
                codec=dmx.GetNvCodecId(),
                cudacontext=0,
                cudastream=self.stream.cuda_stream,
                usedevicememory=True,
            )
        got = {}
        with torch.cuda.stream(self.stream):
            for n, pkt in enumerate(dmx):
                if pkt.bsl == 0 or n < start:
                    continue
                pts = int(pkt.pts)
                if self.skip and rows[n][2] == 0 and pts not in want:
                    continue
                if self.discard:
                    pkt.discardable = pts not in want
                self.sent += 1
                for f in self.dec.Decode(pkt):
                    p = int(f.getPTS())
                    if p in want and p not in got:
                        got[p] = torch.from_dlpack(f).clone()
                if len(got) == len(want):
                    break
            try:  # end of stream: the reorder queue's frames, and a reset
                for f in self.dec.Decode(nvc.PacketData()):
                    p = int(f.getPTS())
                    if p in want and p not in got:
                        got[p] = torch.from_dlpack(f).clone()
            except Exception as err:
                if not getattr(self, "said", False):
                    print(json.dumps({"flush_error": str(err)[:200]}), flush=True)
                    self.said = True
                self.dec = None  # a new session for the next clip
        self.stream.synchronize()
        if len(got) != len(want):
            raise RuntimeError(f"{len(got)} of {len(want)} frames")
        return [got[order[k]] for k in indices]


class Simple:
    def __init__(self, nvc, torch):
        self.nvc, self.torch = nvc, torch
        self.stream = torch.cuda.Stream()
        self.dec = None
        self.sent = 0

    def frames(self, path, tab, indices):
        nvc, torch = self.nvc, self.torch
        if self.dec is None:
            self.dec = nvc.SimpleDecoder(
                path,
                gpu_id=0,
                cuda_stream=self.stream.cuda_stream,
                use_device_memory=True,
                decoder_cache_size=2,
                output_color_type=nvc.OutputColorType.NATIVE,
            )
        else:
            self.dec.reconfigure_decoder(path)
        with torch.cuda.stream(self.stream):
            out = [torch.from_dlpack(f).clone() for f in self.dec.get_batch_frames_by_index(sorted(set(indices)))]
        self.stream.synchronize()
        at = {k: n for n, k in enumerate(sorted(set(indices)))}
        return [out[at[k]] for k in indices]


def _fail(line: str) -> int:
    print(f"error: {line}", file=sys.stderr)
    return 2


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--threads", type=int, default=12)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--check", type=int, default=24)
    ap.add_argument("--modes", default="simple,full,skip")
    a = ap.parse_args()
    files = sorted(glob.glob(os.path.join(glob.escape(a.dir), "*.mp4")))
    if not os.path.isdir(a.dir) or not files:
        return _fail(f"{a.dir!r} is not a folder of .mp4 files: give the folder of H.264 videos to cut clips from")
    try:
        import PyNvVideoCodec as nvc
        import torch
    except ImportError as err:
        return _fail(
            f"{err}: run this on the GPU machine with PyNvVideoCodec installed (scripts/gpu_gop_limit.sh does)"
        )
    if not torch.cuda.is_available():
        return _fail("no CUDA device: run this on the GPU machine")

    tabs = {p: table(nvc, p) for p in files}
    for p, (rows, _order) in tabs.items():
        refs = [r[2] for r in rows]
        print(
            json.dumps(
                {
                    "file": os.path.basename(p),
                    "packets": len(rows),
                    "keys": sum(r[1] for r in rows),
                    "nonref": refs.count(0),
                    "unknown": refs.count(None),
                }
            ),
            flush=True,
        )
    # frame-exactness: skip (and full) against simple on the same clips
    rng = random.Random(7)
    clips = [(p, draw(rng, len(tabs[p][1]))) for p in (rng.choice(files) for _ in range(a.check))]
    ref, full, skip = Simple(nvc, torch), LowLevel(nvc, torch, False), LowLevel(nvc, torch, True)
    bad = {"full": 0, "skip": 0}
    for p, idx in clips:
        want = ref.frames(p, tabs[p], idx)
        for name, dec in (("full", full), ("skip", skip)):
            try:
                got = dec.frames(p, tabs[p], idx)
                diff = [n for n, (x, y) in enumerate(zip(want, got)) if x.shape != y.shape or not torch.equal(x, y)]
                if diff and bad[name] == 0:
                    x, y = want[diff[0]], got[diff[0]]
                    print(
                        json.dumps(
                            {
                                "first_diff": name,
                                "shapes": [list(x.shape), list(y.shape)],
                                "max_abs": float((x.float() - y.float()).abs().max()) if x.shape == y.shape else None,
                            }
                        )
                    )
                bad[name] += len(diff)
            except Exception as err:
                print(json.dumps({"check_error": name, "err": str(err)[:200]}), flush=True)
                bad[name] += len(idx)
    print(
        json.dumps(
            {
                "check_clips": len(clips),
                "frames_differing": bad,
                "sent_per_clip": {"full": full.sent / max(1, len(clips)), "skip": skip.sent / max(1, len(clips))},
            }
        ),
        flush=True,
    )
    # throughput
    for mode in a.modes.split(","):
        stop = time.perf_counter() + a.seconds
        counts, sent, errors = [0] * a.threads, [0] * a.threads, []

        def work(t, mode=mode, stop=stop, counts=counts, sent=sent, errors=errors):
            dec = (
                Simple(nvc, torch)
                if mode == "simple"
                else LowLevel(nvc, torch, "skip" in mode, discard="discard" in mode)
            )
            r = random.Random(100 + t)
            try:
                while time.perf_counter() < stop:
                    p = r.choice(files)
                    dec.frames(p, tabs[p], draw(r, len(tabs[p][1])))
                    counts[t] += 1
            except Exception as err:
                errors.append(str(err)[:200])
            sent[t] = dec.sent

        dt = timed_threads(a.threads, work)
        cpu = time.process_time()
        print(
            json.dumps(
                {
                    "mode": mode,
                    "threads": a.threads,
                    "clips": sum(counts),
                    "seconds": round(dt, 2),
                    "clips_per_s": round(sum(counts) / dt, 1),
                    "packets_per_clip": round(sum(sent) / max(1, sum(counts)), 1) if mode != "simple" else None,
                    "errors": errors[:2],
                    "process_cpu_s": round(cpu, 1),
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
