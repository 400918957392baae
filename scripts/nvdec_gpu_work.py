"""The GPU work a clip's decode puts on the SMs, by PyNvVideoCodec API (issue 38 item 1, GPU machine, ~30 s; its
first run, session 23 on an H200, is in docs/benchmarks.md and docs/evidence/gop/h200_s23/gpu_work.txt).

    python scripts/nvdec_gpu_work.py DIR [--clips 6]

For each H.264 .mp4 in DIR it cuts CLIPS random clips (12 frames at stride 1-2, as the trainer draws them)
five ways (scripts/nvdec_seek_probe.py's Simple and LowLevel: SimpleDecoder.get_batch_frames_by_index, what
train/data/nvdec.py uses; the low-level demuxer and decoder from the keyframe; the same without the
non-reference pictures outside the clip; each low-level way also with the unused pictures' packets flagged
discardable, which PyNvVideoCodec's own notes say it decodes for reference without surfacing the frame) under
torch.profiler, checks each way's frames against simple's byte for byte, and prints per file and way: pictures sent to
NVDEC a clip, and a clip's kernels and device-to-device copies by name (calls and GPU ms), from which one can
tell whether a way converts and copies the pictures the clip does not use. Each way also makes one device copy
per clip frame of its own (nvdec_seek_probe.py clones the frames it keeps): 12 copies a clip to subtract.
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--clips", type=int, default=6)
    a = ap.parse_args()
    files = sorted(glob.glob(os.path.join(glob.escape(a.dir), "*.mp4")))
    if not os.path.isdir(a.dir) or not files or a.clips < 1:
        print(f"error: {a.dir!r} is not a folder of .mp4 files (or --clips < 1)", file=sys.stderr)
        return 2
    try:
        import PyNvVideoCodec as nvc
        import torch
        from torch.profiler import ProfilerActivity, profile

        from nvdec_seek_probe import LowLevel, Simple, draw, table
    except ImportError as err:
        print(f"error: {err}: run this on the GPU machine with PyNvVideoCodec installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: no CUDA device: run this on the GPU machine", file=sys.stderr)
        return 2
    print("| file | way | pictures sent a clip | per clip: kernel or copy | calls | GPU ms |")
    print("|---|---|---|---|---|---|")
    for path in files:
        try:
            tab = table(nvc, path)
        except Exception as err:  # a file the demuxer refuses: named, skipped
            print(f"| {os.path.basename(path)} | - | demuxer refused: {str(err)[:80]} | | | |")
            continue
        rng = random.Random(3)
        if len(tab[1]) < 24:
            print(f"| {os.path.basename(path)} | - | {len(tab[1])} frames: too short for a clip at stride 2 | | | |")
            continue
        clips = [draw(rng, len(tab[1])) for _ in range(a.clips)]
        truth = None
        for name, dec in (
            ("simple", Simple(nvc, torch)),
            ("low-level", LowLevel(nvc, torch, False)),
            ("low-level, skip", LowLevel(nvc, torch, True)),
            ("low-level, discard", LowLevel(nvc, torch, False, discard=True)),
            ("low-level, skip + discard", LowLevel(nvc, torch, True, discard=True)),
        ):
            try:
                dec.frames(path, tab, clips[0])  # warm: the session, the first allocations
                sent0 = dec.sent
                got = []
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for idx in clips:
                        got.append(dec.frames(path, tab, idx))
                    torch.cuda.synchronize()
            except Exception as err:
                print(f"| {os.path.basename(path)} | {name} | failed: {str(err)[:80]} | | | |")
                continue
            if name == "simple":
                truth = got  # what the other ways must equal, byte for byte
            elif truth is None:
                name += " (not compared: simple failed)"
            elif not all(torch.equal(a, b) for x, y in zip(truth, got) for a, b in zip(x, y)):
                name += " (FRAMES DIFFER from simple)"
            work: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    work[e.name[:60]][0] += 1
                    work[e.name[:60]][1] += e.time_range.elapsed_us() / 1e3
            sent = (dec.sent - sent0) / len(clips) if name != "simple" else float("nan")
            for kname, (calls, ms) in sorted(work.items(), key=lambda kv: -kv[1][1])[:4]:
                print(
                    f"| {os.path.basename(path)} | {name} | {sent:.0f} | `{kname}` | {calls / len(clips):.0f} | "
                    f"{ms / len(clips):.2f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
