"""NVDEC's native 8-bit 4:2:0 surfaces (NV12) -> uint8 RGB frames, with OpenCV's matrix.

`yuv420_to_rgb` is the reference in plain torch ops: about 15 full-frame float passes over GPU memory
per frame (some 420 MB at 1080p), each its own kernel. `nv12_to_rgb` gives the same values in one Triton
kernel where Triton runs (reads the 3 MB surface, writes the 6 MB frame), else falls back to the
reference. Both compute in float32 in the same order with no fused multiply-add, so they agree bit for
bit: tests/test_nv12.py checks it under Triton's interpreter on the CPU, scripts/gpu_nv12_check.py on real
NVDEC surfaces on the H100 (312 frames of 4 sizes, 0 bytes differ, docs/benchmarks.md).
TAEHV_NV12=torch makes every frame take the reference (the A/B switch of scripts/gpu_nv12_ab.sh).
"""

from __future__ import annotations

import functools
import os
import threading

import torch
import torch.nn.functional as F

Y_SCALE, C_SCALE = 255.0 / 219.0, 255.0 / 224.0  # BT.601 limited range, as OpenCV's FFmpeg backend
RV, GU, GV, BU = 1.402, 0.344136, 0.714136, 1.772
BLOCK = 1024  # pixels of one row per Triton program
_MAGIC = 12582912.0  # 1.5 * 2**23: (x + M) - M rounds a float32 |x| < 2**22 half to even, as torch.round
_lock = threading.Lock()  # the first launch of a shape compiles; decode threads launch one at a time
_state: dict[str, object] = {}


def yuv420_to_rgb(frame: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """An NV12 frame ((h * 3 / 2) x w uint8: Y rows, then interleaved U/V rows) -> uint8 (3, h, w) RGB with
    the BT.601 limited-range matrix, as OpenCV's FFmpeg backend converts (so both paths give one colour)."""
    y = (frame[:h].float() - 16.0) * Y_SCALE
    uv = frame[h : h + h // 2].reshape(h // 2, w // 2, 2).permute(2, 0, 1).float()
    uv = F.interpolate(uv[None], size=(h, w), mode="bilinear", align_corners=False)[0].sub_(128.0).mul_(C_SCALE)
    u, v = uv[0], uv[1]
    rgb = torch.stack([y + RV * v, y - GU * u - GV * v, y + BU * u])
    return rgb.round_().clamp_(0, 255).to(torch.uint8)


def nv12_to_rgb(frame: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """yuv420_to_rgb's result, from the fused kernel where it runs (a CUDA frame of even size, Triton installed)."""
    kernel = _fused() if frame.is_cuda or _interpreted() else None
    if kernel is None or frame.stride(1) != 1 or h < 2 or w < 2 or h % 2 or w % 2:
        # odd sizes: the chroma scale is not 0.5 there, and the kernel is checked against the reference on the
        # GPU for even sizes only (what H.264 4:2:0 streams decode to)
        return yuv420_to_rgb(frame, h, w)
    out = torch.empty((3, h, w), dtype=torch.uint8, device=frame.device)
    grid = (h, (w + BLOCK - 1) // BLOCK)
    try:
        with _lock:
            kernel[grid](
                frame, out, h, w, frame.stride(0), h // 2, w // 2, _scale(h // 2, h), _scale(w // 2, w),
                BLOCK=BLOCK, enable_fp_fusion=False,
            )  # fmt: skip
    except Exception as err:  # Triton cannot build or launch it here: the reference from now on, said once
        with _lock:
            _state["kernel"] = _failed(err)
        return yuv420_to_rgb(frame, h, w)
    return out


def how() -> str:
    """One phrase for the run's log: how NVDEC's surfaces become RGB here."""
    if os.environ.get("TAEHV_NV12", "") == "torch":
        return "colour in torch ops (TAEHV_NV12=torch)"
    if _state.get("failed"):
        return "colour in torch ops (the Triton kernel failed here)"
    return "colour in one Triton kernel" if _fused() is not None else "colour in torch ops (Triton is not installed)"


def take_note() -> str:
    """Once, after the kernel failed: the line saying so; else ''."""
    with _lock:
        note = _state.pop("note", "")
    return (
        f"data: the NV12 colour kernel failed ({note}); colour in torch ops from now on, the same bytes" if note else ""
    )


@functools.lru_cache(maxsize=64)
def _scale(src: int, dst: int) -> float:
    """float32(src) / dst rounded to float32, as F.interpolate computes its scale."""
    return (torch.tensor(src, dtype=torch.float32) / dst).item()


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _fused():
    """The Triton kernel, or None where Triton is missing or TAEHV_NV12=torch asks for the reference."""
    if os.environ.get("TAEHV_NV12", "") == "torch":
        return None
    if "kernel" not in _state:
        with _lock:
            if "kernel" not in _state:
                _state["kernel"] = _build()
    return _state["kernel"]


def _build():
    """The kernel, or None: Triton missing (CPU wheels of torch), or failing to define it (its note said once).
    Called with _lock held."""
    try:
        import triton
        import triton.language as tl
    except Exception:  # not installed, or a broken install
        return None
    try:
        return _define(triton, tl)
    except Exception as err:  # an API this code does not know, sources missing (a .pyc-only install), ...
        return _failed(err)


def _failed(err: BaseException) -> None:
    """Mark the kernel failed and keep the first failure's note for take_note(). Called with _lock held."""
    text = str(err).strip().splitlines()
    _state["failed"] = True
    _state.setdefault("note", f"{type(err).__name__}: {text[0][:160] if text else ''}")


def _define(triton, tl):
    @triton.jit(do_not_specialize=["h", "w", "pitch", "hc", "wc", "sh", "sw"])
    def nv12_rgb(src, dst, h, w, pitch, hc, wc, sh, sw, BLOCK: tl.constexpr):
        # literals, not module names: a Triton kernel reads no Python globals. 1.1643835616438356 = 255 / 219,
        # 1.1383928571428572 = 255 / 224, 12582912.0 = _MAGIC; RV, GU, GV, BU as above
        r = tl.program_id(0)
        c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = c < w
        y = (tl.load(src + r * pitch + c, mask=m, other=0).to(tl.float32) - 16.0) * 1.1643835616438356
        # the chroma plane upsampled as F.interpolate(bilinear, align_corners=False): source index
        # max(scale * (i + 0.5) - 0.5, 0), its neighbour clamped to the last row/column
        sr = tl.maximum(sh * (r + 0.5) - 0.5, 0.0)
        r0 = sr.to(tl.int32)
        r1 = r0 + (r0 < hc - 1).to(tl.int32)
        lr = sr - r0
        sc = tl.maximum(sw * (c + 0.5) - 0.5, 0.0)
        c0 = sc.to(tl.int32)
        c1 = c0 + (c0 < wc - 1).to(tl.int32)
        lc = sc - c0
        row0 = src + (h + r0) * pitch
        row1 = src + (h + r1) * pitch
        u00 = tl.load(row0 + 2 * c0, mask=m, other=0).to(tl.float32)
        u01 = tl.load(row0 + 2 * c1, mask=m, other=0).to(tl.float32)
        u10 = tl.load(row1 + 2 * c0, mask=m, other=0).to(tl.float32)
        u11 = tl.load(row1 + 2 * c1, mask=m, other=0).to(tl.float32)
        v00 = tl.load(row0 + 2 * c0 + 1, mask=m, other=0).to(tl.float32)
        v01 = tl.load(row0 + 2 * c1 + 1, mask=m, other=0).to(tl.float32)
        v10 = tl.load(row1 + 2 * c0 + 1, mask=m, other=0).to(tl.float32)
        v11 = tl.load(row1 + 2 * c1 + 1, mask=m, other=0).to(tl.float32)
        u = (1.0 - lr) * ((1.0 - lc) * u00 + lc * u01) + lr * ((1.0 - lc) * u10 + lc * u11)
        v = (1.0 - lr) * ((1.0 - lc) * v00 + lc * v01) + lr * ((1.0 - lc) * v10 + lc * v11)
        u = (u - 128.0) * 1.1383928571428572
        v = (v - 128.0) * 1.1383928571428572
        red = (y + 1.402 * v + 12582912.0) - 12582912.0
        green = (y - 0.344136 * u - 0.714136 * v + 12582912.0) - 12582912.0
        blue = (y + 1.772 * u + 12582912.0) - 12582912.0
        at = dst + r * w + c
        tl.store(at, tl.minimum(tl.maximum(red, 0.0), 255.0).to(tl.uint8), mask=m)
        tl.store(at + h * w, tl.minimum(tl.maximum(green, 0.0), 255.0).to(tl.uint8), mask=m)
        tl.store(at + 2 * h * w, tl.minimum(tl.maximum(blue, 0.0), 255.0).to(tl.uint8), mask=m)

    return nv12_rgb
