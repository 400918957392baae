"""validate-env's video decoder check: which decoder trains on this node, and one real decode with it."""

from __future__ import annotations

from ..plan.resolve import Plan
from .base import FAIL, PASS, WARN, Check, _gpu_plan


def check_decoder(plan: Plan, path: str | None) -> Check:
    """Which decoder the run will use for training clips on this node, and one real decode with it."""
    import time

    import torch

    from ..train.data import nvdec

    c = plan.config
    gpu = _gpu_plan(plan) and torch.cuda.is_available()
    name, why = nvdec.choose(plan_cfg(c), torch.device("cuda" if gpu else "cpu"))
    if c["video_decoder"] == "nvdec" and name != "nvdec":
        return Check(
            "video decoder",
            FAIL,
            f"video_decoder=nvdec, but {why}",
            "pip install 'taehv-launch[nvdec]' on the GPU nodes, or --set video_decoder=auto",
        )
    if name == "opencv":
        status = WARN if gpu else PASS
        return Check(
            "video decoder",
            status,
            "opencv: training clips are decoded on the CPU in the DataLoader "
            "workers" + (f" (not on the GPU: {why})" if gpu and why else ""),
            "for NVDEC: pip install 'taehv-launch[nvdec]'" if status == WARN else "",
        )
    if path is None:
        return Check(
            "video decoder",
            WARN,
            f"nvdec (PyNvVideoCodec {nvdec.nvdec_version()}): no sampled video decodes, nothing to try it on",
            "fix the data first",
        )
    t0 = time.perf_counter()
    try:
        frames = nvdec.NvdecDecoder(torch.device("cuda", 0)).frames(path, tuple(range(c["n_frames"])))
        torch.cuda.synchronize()
    except nvdec.DecodeRefused as err:
        return Check(
            "video decoder",
            WARN,
            f"nvdec (PyNvVideoCodec {nvdec.nvdec_version()}) cannot decode {path}: "
            f"{err}; such files are decoded on the CPU in training",
            "check the GPU driver's NVDEC support for this codec, or --set video_decoder=opencv",
        )
    ms = (time.perf_counter() - t0) * 1000
    from ..train.data import nv12, nvdec_seek

    failed = nv12.take_note()  # the colour kernel could not build or launch here: training still runs, slower
    return Check(
        "video decoder",
        WARN if failed else PASS,
        f"nvdec (PyNvVideoCodec {nvdec.nvdec_version()}, {nvdec_seek.how()}, {nv12.how()}, "
        f"{threads_text(c['video_decode_threads'])}): {tuple(frames.shape)} frames of {path} decoded on the GPU "
        f"in {ms:.0f} ms (the first decode: opening the decoder and building the colour kernel included)"
        + (f"; {failed.removeprefix('data: ')}" if failed else ""),
        "reinstall the Triton that matches this torch (pip install torch brings it) for the faster colour kernel"
        if failed
        else "",
    )


def threads_text(n: int) -> str:
    """video_decode_threads as the check says it (0: chosen by the trainer from the sources, plan/decodeplan.py)."""
    return f"{n} threads per rank" if n else "threads per rank chosen at start from the sources"


def plan_cfg(c: dict):
    from ..plan.schema import make_config

    return make_config(c)
