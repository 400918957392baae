"""A second process cutting long-GOP clips with NVDEC at a fixed rate, beside a training run (GPU machine):

    python3 scripts/gpu_side_load.py FOLDER MODE RATE [THREADS]

MODE "nvdec": SimpleDecoder.get_batch_frames_by_index only (NVDEC and its copies, nothing on the SMs);
MODE "trainer": as the trainer cuts a clip (NvdecDecoder.frames: decode and the NV12 kernel, then finish():
crop to 3:2, resize to 480x720). RATE clips/s in all (a shared pacer), THREADS threads (default 11). Runs until
SIGTERM/SIGINT, then prints the clips/s it kept. Issue 38 item 1's question: does decode work kept out of the
trainer's process (its own interpreter lock, its own CUDA context) still slow the step?
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

from gpu_decode_probe import open_sources, pick_clip  # this folder: sys.path[0] when run as a script


def main(argv: list[str]) -> int:
    ok = len(argv) in (3, 4) and Path(argv[0]).is_dir() and argv[1] in ("nvdec", "trainer")
    try:
        rate, threads = float(argv[2]), int(argv[3]) if len(argv) == 4 else 11
        ok = ok and 0 < rate <= 1000 and 1 <= threads <= 64
    except (ValueError, IndexError):
        ok = False
    if not ok:
        print("usage: python3 scripts/gpu_side_load.py FOLDER nvdec|trainer RATE [THREADS]", file=sys.stderr)
        return 2
    mode = argv[1]
    opened = open_sources(argv[0], "gpu_side_load")
    if opened is None:
        return 2
    nvc, torch, files, lengths = opened
    from taehv_launch.train.data.nvdec import NvdecDecoder, finish

    dev = torch.device("cuda", 0)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    pace, lock, done = [time.perf_counter()], threading.Lock(), [0]

    def wait_turn() -> None:
        with lock:
            at = pace[0] = max(pace[0] + 1 / rate, time.perf_counter())
        time.sleep(max(0.0, at - time.perf_counter()))

    def work(seed: int) -> None:
        rng = random.Random(seed)
        torch.cuda.set_device(dev)
        dec = NvdecDecoder(dev)
        raw = None
        while not stop.is_set():
            wait_turn()
            f, idx, crop, src = pick_clip(rng, files, lengths)
            if mode == "nvdec":
                if raw is None:
                    raw = nvc.SimpleDecoder(
                        f,
                        gpu_id=0,
                        cuda_stream=dec.stream.cuda_stream,
                        use_device_memory=True,
                        decoder_cache_size=2,
                        output_color_type=nvc.OutputColorType.NATIVE,
                    )
                else:
                    raw.reconfigure_decoder(f)
                raw.get_batch_frames_by_index(list(idx))
            else:
                with torch.cuda.stream(dec.stream):
                    finish(dec.frames(f, idx), crop, src, 480, 720)
            dec.stream.synchronize()
            with lock:
                done[0] += 1

    pool = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(threads)]
    t0 = time.perf_counter()
    for t in pool:
        t.start()
    print(f"side load: {mode}, {rate} clips/s asked, {threads} threads, {len(files)} files", flush=True)
    while not stop.is_set():
        stop.wait(1.0)
    secs = time.perf_counter() - t0
    print(f"side load: {mode}: {done[0]} clips in {secs:.1f} s = {done[0] / secs:.2f} clips/s", flush=True)
    os._exit(0)  # the decode threads are mid-clip: no interpreter teardown under them


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
