"""NVDEC's native 8-bit 4:2:0 surfaces (NV12) -> uint8 RGB frames, with OpenCV's matrix, and clips.

`yuv420_to_rgb` is the reference in plain torch ops: about 15 full-frame float passes over GPU memory
per frame (some 420 MB at 1080p), each its own kernel. `nv12_to_rgb` gives the same values in one Triton
kernel where Triton runs (reads the 3 MB surface, writes the 6 MB frame), else falls back to the
reference. Both compute in float32 in the same order with no fused multiply-add, so they agree bit for
bit: tests/test_nv12.py checks it under Triton's interpreter on the CPU, scripts/gpu_nv12_check.py on real
NVDEC surfaces on the H100 (312 frames of 4 sizes, 0 bytes differ, docs/benchmarks.md).

`nv12_clip` goes further: one kernel a frame computes the clip's pixels straight from the surface (colour,
crop, antialiased bilinear resize, flip), where nvdec.finish() would convert the whole frame, then crop and
resize it in float32 torch ops (a 1080p frame: 25 MB of floats written and read again, ten more kernels).
The colour of every tap is yuv420_to_rgb's; the resize follows F.interpolate's CUDA kernel (the same taps,
weights and order of sums) without its fused multiply-adds, so a byte may differ by 1 where a sum lies
within a rounding of .5 (tests/test_nv12.py bounds it on the CPU, scripts/gpu_nv12_check.py on the H100).
TAEHV_NV12=frame keeps the per-frame colour kernel with finish()'s torch ops, TAEHV_NV12=torch the reference
for every frame (the A/B switches of scripts/gpu_clip_ab.sh and scripts/gpu_nv12_ab.sh).
"""

from __future__ import annotations

import functools
import math
import os
import threading

import torch
import torch.nn.functional as F

Y_SCALE, C_SCALE = 255.0 / 219.0, 255.0 / 224.0  # limited range: Y 16-235, chroma 16-240 (most video)
RV, GU, GV, BU = 1.402, 0.344136, 0.714136, 1.772  # BT.601: untagged streams, as FFmpeg's swscale takes them


def _matrix(kr: float, kb: float) -> tuple[float, float, float, float]:
    """(RV, GU, GV, BU) of the YCbCr matrix with luma weights kr, kb."""
    kg = 1.0 - kr - kb
    return 2 * (1 - kr), 2 * kb * (1 - kb) / kg, 2 * kr * (1 - kr) / kg, 2 * (1 - kb)


# the conversions OpenCV's FFmpeg backend applies, by the header's tags (decode.colour_of names them): the
# matrix (FFmpeg's sws_getCoefficients) and the range; (Y offset, Y scale, chroma scale, RV, GU, GV, BU)
_MATRICES = {
    "bt601": (RV, GU, GV, BU),
    "bt709": _matrix(0.2126, 0.0722),
    "fcc": _matrix(0.30, 0.11),
    "smpte240m": _matrix(0.212, 0.087),
    "bt2020": _matrix(0.2627, 0.0593),
}
COLOURS = {name: (16.0, Y_SCALE, C_SCALE, *m) for name, m in _MATRICES.items()}
COLOURS.update({f"{name}-full": (0.0, 1.0, 1.0, *m) for name, m in _MATRICES.items()})
BLOCK = 1024  # pixels of one row per Triton program
CLIP_BLOCK = 128  # output pixels of one row per program of the clip kernel
_MAGIC = 12582912.0  # 1.5 * 2**23: (x + M) - M rounds a float32 |x| < 2**22 half to even, as torch.round
_lock = threading.Lock()  # the first launch of a shape compiles; decode threads launch one at a time
_state: dict[str, object] = {}


def yuv420_to_rgb(frame: torch.Tensor, h: int, w: int, colour: str = "bt601") -> torch.Tensor:
    """An NV12 frame ((h * 3 / 2) x w uint8: Y rows, then interleaved U/V rows) -> uint8 (3, h, w) RGB with
    the stream's matrix and range (COLOURS[colour]), as OpenCV's FFmpeg backend converts (so both paths give
    one colour)."""
    yo, ys, cs, rv, gu, gv, bu = _coefficients(colour)
    y = (frame[:h].float() - yo) * ys
    uv = frame[h : h + h // 2].reshape(h // 2, w // 2, 2).permute(2, 0, 1).float()
    uv = F.interpolate(uv[None], size=(h, w), mode="bilinear", align_corners=False)[0].sub_(128.0).mul_(cs)
    u, v = uv[0], uv[1]
    rgb = torch.stack([y + rv * v, y - gu * u - gv * v, y + bu * u])
    return rgb.round_().clamp_(0, 255).to(torch.uint8)


def nv12_to_rgb(frame: torch.Tensor, h: int, w: int, colour: str = "bt601") -> torch.Tensor:
    """yuv420_to_rgb's result, from the fused kernel where it runs (a CUDA frame of even size, Triton installed)."""
    kernels = _fused() if frame.is_cuda or _interpreted() else None
    if kernels is None or frame.stride(1) != 1 or h < 2 or w < 2 or h % 2 or w % 2:
        # odd sizes: the chroma scale is not 0.5 there, and the kernel is checked against the reference on the
        # GPU for even sizes only (what H.264 4:2:0 streams decode to)
        return yuv420_to_rgb(frame, h, w, colour)
    out = torch.empty((3, h, w), dtype=torch.uint8, device=frame.device)
    grid = (h, (w + BLOCK - 1) // BLOCK)
    try:
        with _lock:
            kernels.nv12_rgb[grid](
                frame, out, h, w, frame.stride(0), h // 2, w // 2, _scale(h // 2, h), _scale(w // 2, w),
                *_coefficients(colour), BLOCK=BLOCK, enable_fp_fusion=False,
            )  # fmt: skip
    except Exception as err:  # Triton cannot build or launch it here: the reference from now on, said once
        with _lock:
            _state["kernel"] = _failed(err)
        return yuv420_to_rgb(frame, h, w, colour)
    return out


def nv12_clip(
    frames: list[torch.Tensor], h: int, w: int, window, height: int, width: int, colour: str = "bt601"
) -> torch.Tensor | None:
    """uint8 (T, 3, height, width): the `window` (a clips.Crop: y, x, h, w, flip) of each NV12 frame's RGB
    (h x w, `colour` as yuv420_to_rgb) resized as nvdec.finish() resizes, then mirrored where it says, one kernel a frame; None where that
    kernel does not run here (no Triton or it failed, TAEHV_NV12 asking for another path, CPU frames, odd sizes,
    a window outside the frame): the caller converts the frames and finishes them in torch ops."""
    y0, x0, ch, cw, flip = window.y, window.x, window.h, window.w, window.flip
    kernels = _fused() if os.environ.get("TAEHV_NV12", "") != "frame" else None
    if (
        kernels is None
        or not frames
        or not (frames[0].is_cuda or _interpreted())
        or h < 2 or w < 2 or h % 2 or w % 2
        or not (0 <= y0 and 0 <= x0 and 0 < ch and 0 < cw and y0 + ch <= h and x0 + cw <= w)
        or height < 1 or width < 1
        or any(f.stride(1) != 1 or f.shape[0] < h * 3 // 2 or f.shape[1] < w for f in frames)
    ):  # fmt: skip
        return None
    out = torch.empty((len(frames), 3, height, width), dtype=torch.uint8, device=frames[0].device)
    sy, sx = _aa(ch, height), _aa(cw, width)
    # one bound for both sides: the kernel is built once per bound (3 to 11 for the crops plan_crop draws from
    # sources up to 4K), the first launch of each under _lock while the other decode threads wait
    taps = max(sy[3], sx[3])
    grid = (height, (width + CLIP_BLOCK - 1) // CLIP_BLOCK)
    try:
        with _lock:
            for k, frame in enumerate(frames):
                kernels.nv12_clip[grid](
                    frame, out[k], h, frame.stride(0), h // 2, w // 2, _scale(h // 2, h), _scale(w // 2, w),
                    *_coefficients(colour), y0, x0, ch, cw, height, width, sy[0], sx[0], sy[1], sx[1], sy[2], sx[2],
                    int(flip),
                    TAPS_Y=taps, TAPS_X=taps, BLOCK=CLIP_BLOCK, enable_fp_fusion=False,
                )  # fmt: skip
    except Exception as err:  # as nv12_to_rgb: the torch ops from now on, said once
        with _lock:
            _state["kernel"] = _failed(err)
        return None
    return out


def _coefficients(colour: str) -> tuple[float, ...]:
    """COLOURS[colour]; BT.601 limited range for a name it does not know."""
    return COLOURS.get(colour, COLOURS["bt601"])


@functools.lru_cache(maxsize=256)
def _aa(src: int, dst: int) -> tuple[float, float, float, int]:
    """(scale, support, 1 / scale or 1, taps) of F.interpolate's antialiased bilinear resize from src to dst
    pixels on CUDA: scale float32(src) / dst; support scale where it shrinks, else 1 (the triangle's half
    width); taps ceil(support) * 2 + 1 (the most any output pixel reads)."""
    scale = _scale(src, dst)
    support = scale if scale >= 1.0 else 1.0  # scale is float32 already
    inv = _f32(1.0 / scale) if scale >= 1.0 else 1.0
    return scale, support, inv, int(math.ceil(support)) * 2 + 1


def _f32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32).item())


def how() -> str:
    """One phrase for the run's log: how NVDEC's surfaces become RGB clips here."""
    mode = os.environ.get("TAEHV_NV12", "")
    if mode == "torch":
        return "colour in torch ops (TAEHV_NV12=torch)"
    if _state.get("failed"):
        return "colour in torch ops (the Triton kernel failed here)"
    if _fused() is None:
        return "colour in torch ops (Triton is not installed)"
    if mode == "frame":
        return "colour in one Triton kernel, crop and resize in torch ops (TAEHV_NV12=frame)"
    return "colour, crop and resize in one Triton kernel"


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
    """The kernels' module (train/data/nv12_kernels.py: nv12_rgb, nv12_clip); `triton` imported already."""
    from . import nv12_kernels

    return nv12_kernels
