"""The Triton kernels of nv12.py, imported only where Triton is (nv12._build): see there for what they match.

Literals, not module constants, in the kernels: a Triton kernel reads no plain Python globals. 12582912.0 =
1.5 * 2**23: (x + M) - M rounds a float32 |x| < 2**22 half to even, as torch.round. Both kernels are
launched with enable_fp_fusion=False: every multiply and add rounds on its own, as the torch ops do."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rgb(src, r, c, m, h, pitch, hc, wc, sh, sw, yo, ys, cs, rv, gu, gv, bu):
    """Row r (a scalar), columns c of an NV12 surface -> red, green, blue as float32 integers in 0..255:
    yuv420_to_rgb's values with the stream's conversion (Y offset and scale, chroma scale, matrix), chroma upsampled as F.interpolate(bilinear, align_corners=False) does (source
    index max(scale * (i + 0.5) - 0.5, 0), its neighbour clamped to the last row/column)."""
    y = (tl.load(src + r * pitch + c, mask=m, other=0).to(tl.float32) - yo) * ys
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
    u = (u - 128.0) * cs
    v = (v - 128.0) * cs
    red = tl.minimum(tl.maximum((y + rv * v + 12582912.0) - 12582912.0, 0.0), 255.0)
    green = tl.minimum(tl.maximum((y - gu * u - gv * v + 12582912.0) - 12582912.0, 0.0), 255.0)
    blue = tl.minimum(tl.maximum((y + bu * u + 12582912.0) - 12582912.0, 0.0), 255.0)
    return red, green, blue


@triton.jit(do_not_specialize=["h", "w", "pitch", "hc", "wc", "sh", "sw", "yo", "ys", "cs", "rv", "gu", "gv", "bu"])
def nv12_rgb(src, dst, h, w, pitch, hc, wc, sh, sw, yo, ys, cs, rv, gu, gv, bu, BLOCK: tl.constexpr):
    """One frame: program (row, block of columns) -> uint8 (3, h, w)."""
    r = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < w
    red, green, blue = _rgb(src, r, c, m, h, pitch, hc, wc, sh, sw, yo, ys, cs, rv, gu, gv, bu)
    at = dst + r * w + c
    tl.store(at, red.to(tl.uint8), mask=m)
    tl.store(at + h * w, green.to(tl.uint8), mask=m)
    tl.store(at + 2 * h * w, blue.to(tl.uint8), mask=m)


@triton.jit(
    do_not_specialize=[
        "h", "pitch", "hc", "wc", "sh", "sw", "yo", "ys", "cs", "rv", "gu", "gv", "bu", "y0", "x0", "ch", "cw", "H", "W",
        "scy", "scx", "supy", "supx", "invy", "invx", "flip",
    ]
)  # fmt: skip
def nv12_clip(
    src, dst, h, pitch, hc, wc, sh, sw, yo, ys, cs, rv, gu, gv, bu, y0, x0, ch, cw, H, W,
    scy, scx, supy, supx, invy, invx, flip, TAPS_Y: tl.constexpr, TAPS_X: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One frame of a clip: the window (y0, x0, ch, cw) of the surface's RGB resized to (H, W) as
    F.interpolate(bilinear, antialias=True, align_corners=False) on CUDA computes it (a triangle filter of
    support `sup` = scale where the window shrinks, else 1, weights normalised over the taps inside the window;
    the row pass first, then the column pass), rounded half to even, clamped, mirrored when `flip`: the
    output row of program 0, a block of its columns per program 1 -> uint8 (3, H, W). The RGB of every tap
    is computed from the surface where it is read: no full-size frame is ever written. TAPS_Y, TAPS_X: the
    most taps an output pixel reads (a constant: Triton's interpreter takes no loop bound given at launch; one
    build per value, 3 to 11 for the crops plan_crop draws from sources up to 4K)."""
    oy = tl.program_id(0)
    ox = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = ox < W
    cy = scy * (oy + 0.5)
    ymin = tl.maximum((cy - supy + 0.5).to(tl.int32), 0)
    ysize = tl.minimum((cy + supy + 0.5).to(tl.int32), ch) - ymin
    cx = scx * (ox + 0.5)
    xmin = tl.maximum((cx - supx + 0.5).to(tl.int32), 0)
    xsize = tl.minimum((cx + supx + 0.5).to(tl.int32), cw) - xmin
    total_y = cy * 0.0  # a float32 scalar: the loop carries it
    for j in range(0, TAPS_Y):
        if j < ysize:
            total_y += tl.maximum(1.0 - tl.abs((j + (ymin - cy) + 0.5) * invy), 0.0)
    total_x = tl.zeros([BLOCK], tl.float32)
    for i in range(0, TAPS_X):
        wx = tl.maximum(1.0 - tl.abs((i + (xmin - cx) + 0.5) * invx), 0.0)
        total_x += tl.where(i < xsize, wx, 0.0)
    total_x = tl.maximum(total_x, 1e-30)  # the same where it counts (at least 0.5); no 0 / 0 in lanes past W
    acc_r = tl.zeros([BLOCK], tl.float32)
    acc_g = tl.zeros([BLOCK], tl.float32)
    acc_b = tl.zeros([BLOCK], tl.float32)
    for j in range(0, TAPS_Y):
        if j < ysize:  # a row past the window adds nothing: not read
            wy = tl.maximum(1.0 - tl.abs((j + (ymin - cy) + 0.5) * invy), 0.0) / total_y
            sy = y0 + ymin + j
            row_r = tl.zeros([BLOCK], tl.float32)
            row_g = tl.zeros([BLOCK], tl.float32)
            row_b = tl.zeros([BLOCK], tl.float32)
            for i in range(0, TAPS_X):
                wx = tl.maximum(1.0 - tl.abs((i + (xmin - cx) + 0.5) * invx), 0.0) / total_x
                wx = tl.where(i < xsize, wx, 0.0)
                sx = x0 + tl.minimum(xmin + i, cw - 1)  # a tap past the window weighs 0: read a pixel inside
                red, green, blue = _rgb(src, sy, sx, m, h, pitch, hc, wc, sh, sw, yo, ys, cs, rv, gu, gv, bu)
                row_r += red * wx
                row_g += green * wx
                row_b += blue * wx
            acc_r += row_r * wy
            acc_g += row_g * wy
            acc_b += row_b * wy
    at = dst + oy * W + tl.where(flip != 0, W - 1 - ox, ox)
    plane = H * W
    red = tl.minimum(tl.maximum((acc_r + 12582912.0) - 12582912.0, 0.0), 255.0)
    green = tl.minimum(tl.maximum((acc_g + 12582912.0) - 12582912.0, 0.0), 255.0)
    blue = tl.minimum(tl.maximum((acc_b + 12582912.0) - 12582912.0, 0.0), 255.0)
    tl.store(at, red.to(tl.uint8), mask=m)
    tl.store(at + plane, green.to(tl.uint8), mask=m)
    tl.store(at + 2 * plane, blue.to(tl.uint8), mask=m)
