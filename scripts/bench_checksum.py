#!/usr/bin/env python3
"""What checksumming a checkpoint costs: a synthetic file set of the sizes a 480x720 checkpoint
has (docs/troubleshooting.md quotes the output).

    python scripts/bench_checksum.py [--dir /path/on/the/checkpoint/disk] [--ranks 1 8]

Sizes (TAEHV 11.28M parameters, measured in docs/troubleshooting.md): model.safetensors 45 MB,
optimizer.safetensors 90 MB, ema.safetensors 45 MB; per rank a Seraena file with the replay
buffer at its checkpoint bound (seraena_checkpoint_buffer_mb, 256 MiB) and the discriminator
with its AdamW state; under ZeRO also DeepSpeed's own files (~180 MB). Files are random bytes.
Timings are with the files in the page cache (right after writing, as at save time); a resume
from a cold disk adds the read itself.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import tempfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from taehv_launch.rundir.checkpoint import write_complete

MB = 1 << 20


def file_set(ranks: int) -> dict[str, int]:
    files = {
        "model.safetensors": 45 * MB,
        "optimizer.safetensors": 90 * MB,
        "ema.safetensors": 45 * MB,
        "trainer_state.json": 4096,
    }
    for r in range(ranks):
        files[f"seraena_rank{r}.pt"] = 256 * MB + 3 * MB
        files[f"rng_rank{r}.pt"] = 20 * 1024
    if ranks > 1:
        files["deepspeed/state/mp_rank_00_model_states.pt"] = 45 * MB
        for r in range(ranks):
            files[f"deepspeed/state/zero_pp_rank_{r}_mp_rank_00_optim_states.pt"] = 135 * MB // ranks
    return files


def hash_all(folder: Path, names: list[str], make, threads: int) -> float:
    def one(name: str) -> str:
        h = make()
        with open(folder / name, "rb", buffering=0) as f:
            while chunk := f.read(8 * MB):
                h.update(chunk)
        return h.hexdigest()

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(one, names))
    return time.perf_counter() - t0


class Crc32:
    def __init__(self):
        self.crc = 0

    def update(self, b):
        self.crc = zlib.crc32(b, self.crc)

    def hexdigest(self):
        return f"{self.crc:08x}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="where to write the files (default: a temp dir)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 8])
    args = ap.parse_args()
    threads = max(1, min(8, os.cpu_count() or 1))
    print(f"{os.cpu_count()} CPUs; hashing threads: {threads}")
    for ranks in args.ranks:
        root = Path(tempfile.mkdtemp(prefix="ckbench-", dir=args.dir))
        try:
            files = file_set(ranks)
            t0 = time.perf_counter()
            for name, size in files.items():
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                with open(root / name, "wb") as f:
                    left = size
                    while left:
                        n = min(left, 64 * MB)
                        f.write(os.urandom(n))
                        left -= n
            write_s = time.perf_counter() - t0
            total = sum(files.values())
            names = list(files)
            print(
                f"\n{ranks} rank(s): {len(files)} files, {total / 2**30:.2f} GiB (writing them: {write_s:.2f} s, "
                f"incl. generating random bytes)"
            )
            t0 = time.perf_counter()
            write_complete(root, 0)
            t = time.perf_counter() - t0
            print(f"  write_complete (sizes + crc32, {threads} threads): {t:.2f} s  ({total / MB / t:.0f} MB/s)")
            for label, make, th in [
                ("crc32 (zlib)", Crc32, 1),
                ("crc32 (zlib)", Crc32, threads),
                ("sha256", hashlib.sha256, 1),
                ("sha256", hashlib.sha256, threads),
                ("blake2b", hashlib.blake2b, 1),
                ("blake2b", hashlib.blake2b, threads),
            ]:
                t = hash_all(root, names, make, th)
                print(f"  {label:<13} {th} thread(s): {t:6.2f} s  ({total / MB / t:5.0f} MB/s)")
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
