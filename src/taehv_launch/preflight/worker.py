"""A real all-reduce in fresh processes (NCCL on GPUs, gloo on CPU), for validate-env."""

from __future__ import annotations

import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

GPU_BYTES = 256 << 20
CPU_BYTES = 16 << 20
ITERS = 5


def _worker(rank: int, world: int, port: int, gpu: bool, results) -> None:
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    backend = "nccl" if gpu else "gloo"
    if gpu:
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    device = torch.device("cuda", rank) if gpu else torch.device("cpu")
    x = torch.ones((GPU_BYTES if gpu else CPU_BYTES) // 4, device=device)
    dist.all_reduce(x)  # warm-up, also builds the communicator
    if gpu:
        torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(ITERS):
        dist.all_reduce(x)
    if gpu:
        torch.cuda.synchronize()
    secs = (time.perf_counter() - t0) / ITERS
    expected = float(world ** (ITERS + 1))
    assert x[0].item() == expected, f"all-reduce gave {x[0].item()}, expected {expected}"
    if rank == 0:
        results.put(secs)
    dist.destroy_process_group()


def spawn_allreduce(world: int, gpu: bool) -> tuple[float, float]:
    """(bus bandwidth in GB/s, seconds per all-reduce) over `world` local processes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(world, port, gpu, results), nprocs=world, join=True, start_method="spawn")
    secs = results.get()
    size = GPU_BYTES if gpu else CPU_BYTES
    busbw = size * 2 * (world - 1) / world / secs / 1e9
    return busbw, secs
