"""Where decode threads' work lands at 1080p (GPU machine, PyNvVideoCodec installed):

    python3 scripts/gpu_decode_probe.py FOLDER [THREADS]

1. The GIL: a pure-Python loop in the main thread counts its rounds for 4 s alone, then while THREADS threads
   (default 11, the trainer's choice at long-GOP 1080p) cut 12-frame clips at random starts from FOLDER's .mp4
   files: NVDEC only (SimpleDecoder.get_batch_frames_by_index), then as the trainer does (NvdecDecoder.frames:
   decode and colour conversion, then finish(): crop to 3:2 and resize to 480x720). A main thread that keeps
   most of its rounds is not held back by the decode threads' Python or by a decoder holding the GIL.
2. The GPU time of finish() on one 12-frame clip of the first file, between CUDA events (40 rounds, median).
"""

from __future__ import annotations

import random
import sys
import threading
import time
from pathlib import Path


def spin(seconds: float) -> float:
    """Rounds per second of a pure-Python loop in this thread."""
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(1000):
            n += 1
    return n / seconds


def open_sources(folder: str, who: str):
    """(PyNvVideoCodec, torch, files, lengths) for FOLDER's .mp4 files, lengths[f] = (frames, height, width) as
    NVDEC reads them; None after one line on stderr when PyNvVideoCodec, a CUDA device or the files are missing.
    scripts/gpu_side_load.py opens its sources here too."""
    files = sorted(str(p) for p in Path(folder).glob("*.mp4"))
    try:
        import PyNvVideoCodec as nvc
        import torch

        if not torch.cuda.is_available() or not files:
            raise RuntimeError("no CUDA device" if files else f"no .mp4 files in {folder}")
    except Exception as err:
        print(f"{who}: needs PyNvVideoCodec, a CUDA device and .mp4 files ({err})", file=sys.stderr)
        return None
    lengths = {}
    for f in files:
        d = nvc.SimpleDecoder(f, gpu_id=0, use_device_memory=True, output_color_type=nvc.OutputColorType.NATIVE)
        meta = d.get_stream_metadata()
        lengths[f] = (len(d), int(meta.height), int(meta.width))
    return nvc, torch, files, lengths


def pick_clip(rng: random.Random, files: list[str], lengths: dict):
    """A 12-frame clip at a random start of a random file: (file, frame indices, crop to 3:2, (height, width))."""
    from taehv_launch.train.data.clips import Crop

    f = rng.choice(files)
    n, h, w = lengths[f]
    s = rng.randrange(0, max(1, n - 12))
    ch, cw = h, min(w, h * 3 // 2)
    return f, tuple(range(s, min(n, s + 12))), Crop(0, (w - cw) // 2, ch, cw, False), (h, w)


def main(argv: list[str]) -> int:
    threads = argv[1] if len(argv) > 1 else "11"
    if not argv or not Path(argv[0]).is_dir() or not threads.isdigit() or not 1 <= int(threads) <= 64:
        print(
            "usage: python3 scripts/gpu_decode_probe.py FOLDER [THREADS] (a folder of .mp4 files; THREADS 1-64)",
            file=sys.stderr,
        )
        return 2
    threads = int(threads)
    opened = open_sources(argv[0], "gpu_decode_probe")
    if opened is None:
        return 2
    nvc, torch, files, lengths = opened
    from taehv_launch.train.data.nvdec import NvdecDecoder, finish

    dev = torch.device("cuda", 0)
    print(f"{len(files)} files, {threads} threads, torch {torch.__version__}, PyNvVideoCodec {nvc.__version__}")

    def pick(rng):
        return pick_clip(rng, files, lengths)

    def work(mode: str, stop: threading.Event, count: list[int], seed: int):
        rng = random.Random(seed)
        torch.cuda.set_device(dev)
        if mode == "nvdec":
            stream = torch.cuda.Stream(dev)
            dec = None
            while not stop.is_set():
                f, idx, _, _ = pick(rng)
                if dec is None:
                    dec = nvc.SimpleDecoder(
                        f,
                        gpu_id=0,
                        cuda_stream=stream.cuda_stream,
                        use_device_memory=True,
                        decoder_cache_size=2,
                        output_color_type=nvc.OutputColorType.NATIVE,
                    )
                else:
                    dec.reconfigure_decoder(f)
                dec.get_batch_frames_by_index(list(idx))
                stream.synchronize()
                count[0] += 1
        else:
            dec = NvdecDecoder(dev)
            while not stop.is_set():
                f, idx, crop, src = pick(rng)
                with torch.cuda.stream(dec.stream):
                    finish(dec.frames(f, idx), crop, src, 480, 720)
                dec.stream.synchronize()
                count[0] += 1

    alone = spin(4.0)
    print(f"main thread alone: {alone / 1e6:.2f} M rounds/s")
    for mode in ("nvdec", "trainer"):
        stop, counts = threading.Event(), [[0] for _ in range(threads)]
        pool = [threading.Thread(target=work, args=(mode, stop, counts[k], k), daemon=True) for k in range(threads)]
        for t in pool:
            t.start()
        time.sleep(3.0)  # sessions opened, kernels built
        before = sum(c[0] for c in counts)
        t0 = time.perf_counter()
        rate = spin(6.0)
        clips = (sum(c[0] for c in counts) - before) / (time.perf_counter() - t0)
        stop.set()
        for t in pool:
            t.join()
        print(
            f"with {threads} threads cutting clips ({mode}): main thread {rate / 1e6:.2f} M rounds/s "
            f"({rate / alone:.2f} of alone), {clips:.1f} clips/s"
        )

    f, idx, crop, src = pick(random.Random(0))
    frames = NvdecDecoder(dev).frames(f, idx)
    torch.cuda.synchronize()
    ms = []
    for _ in range(40):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        finish(frames, crop, src, 480, 720)
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b))
    print(f"finish() of one {len(idx)}-frame {src[1]}x{src[0]} clip to 480x720: {sorted(ms)[20]:.3f} ms (median of 40)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
