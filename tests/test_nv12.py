"""The fused NV12 -> RGB kernel (train/data/nv12.py) gives the torch reference's bytes.

The kernel runs under Triton's interpreter on the CPU, in a subprocess (TRITON_INTERPRET must be set before
Triton is imported). Triton is not in the CPU environment: CI installs it into a folder of its own and names
it in TAEHV_TRITON_SITE (.ci/run); without it the kernel tests are skipped. On the GPU machine
scripts/gpu_nv12_check.py compares the compiled kernel on real NVDEC surfaces."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from taehv_launch.train.data import nv12

ROOT = Path(__file__).resolve().parents[1]


def _triton_site() -> str | None:
    site = os.environ.get("TAEHV_TRITON_SITE", "")
    if site and (Path(site) / "triton").is_dir():
        return site
    try:
        import triton  # noqa: F401
    except ImportError:
        return None
    return ""


CHECK = r"""
import torch
from taehv_launch.train.data import nv12
assert nv12._fused() is not None, "the kernel did not build"
gen = torch.Generator().manual_seed(0)
shapes = [(8, 6), (480, 720), (36, 1030), (2, 2), (6, 2050)]
for h, w in shapes:
    frame = torch.randint(0, 256, (h * 3 // 2, w), dtype=torch.uint8, generator=gen)
    want, got = nv12.yuv420_to_rgb(frame, h, w), nv12.nv12_to_rgb(frame, h, w)
    assert got.dtype == torch.uint8 and got.shape == (3, h, w), (got.dtype, got.shape)
    assert torch.equal(want, got), (h, w, int((want != got).sum()))
# a surface with a row pitch wider than the frame (as NVDEC hands them), and the extreme values
pitched = torch.randint(0, 256, (12, 16), dtype=torch.uint8, generator=gen)[:, :10]
assert torch.equal(nv12.yuv420_to_rgb(pitched, 8, 10), nv12.nv12_to_rgb(pitched, 8, 10))
for value in (0, 16, 128, 235, 255):
    flat = torch.full((12, 8), value, dtype=torch.uint8)
    assert torch.equal(nv12.yuv420_to_rgb(flat, 8, 8), nv12.nv12_to_rgb(flat, 8, 8)), value
# odd sizes take the reference (the kernel is checked on the GPU for even sizes only)
odd = torch.randint(0, 256, (10, 8), dtype=torch.uint8, generator=gen)
assert torch.equal(nv12.yuv420_to_rgb(odd, 7, 8), nv12.nv12_to_rgb(odd, 7, 8))
# a Triton whose API this code does not know: no kernel, the reference, one note
nv12._state.clear()
def boom(triton, tl):
    raise AttributeError("module 'triton' has no attribute 'jit'")
nv12._define = boom
assert nv12._fused() is None and nv12._fused() is None
assert nv12.how() == "colour in torch ops (the Triton kernel failed here)", nv12.how()
note = nv12.take_note()
assert "AttributeError: module 'triton' has no attribute 'jit'" in note and nv12.take_note() == "", note
frame = torch.randint(0, 256, (12, 8), dtype=torch.uint8, generator=gen)
assert torch.equal(nv12.nv12_to_rgb(frame, 8, 8), nv12.yuv420_to_rgb(frame, 8, 8))
print("ok", len(shapes))
"""


CLIP_CHECK = r"""
import torch
from taehv_launch.train.data import nv12, nvdec
from taehv_launch.train.data.clips import Crop
assert nv12._fused() is not None, "the kernels did not build"
gen = torch.Generator().manual_seed(1)
# each colour: the frame kernel gives the reference's bytes
for colour in nv12.COLOURS:
    frame = torch.randint(0, 256, (12, 10), dtype=torch.uint8, generator=gen)
    assert torch.equal(nv12.yuv420_to_rgb(frame, 8, 10, colour), nv12.nv12_to_rgb(frame, 8, 10, colour)), colour
# the clip kernel against the colour reference + finish()'s torch ops: shrink (as 1080p to 480x720), the whole
# frame mirrored, enlarge, one side kept with an odd output, a 4K-like shrink; pitched surfaces
cases = [
    (24, 36, Crop(2, 4, 18, 27, False), 8, 12, "bt601"),
    (24, 36, Crop(0, 0, 24, 36, True), 24, 36, "bt709"),
    (20, 30, Crop(3, 5, 7, 9, False), 14, 20, "bt709-full"),
    (24, 36, Crop(4, 0, 20, 36, True), 20, 13, "bt601-full"),
    (24, 40, Crop(1, 3, 22, 36, False), 5, 8, "bt2020"),
]
worst = differ = total = 0
for h, w, crop, oh, ow, colour in cases:
    wide = torch.randint(0, 256, (2, h * 3 // 2, w + 6), dtype=torch.uint8, generator=gen)
    frames = [wide[0, :, :w], wide[1, :, :w].contiguous()]
    want = nvdec.finish(torch.stack([nv12.yuv420_to_rgb(f, h, w, colour) for f in frames]), crop, None, oh, ow)
    got = nv12.nv12_clip(frames, h, w, crop, oh, ow, colour)
    assert got is not None and got.dtype == torch.uint8 and got.shape == want.shape, (h, w, crop)
    d = (got.int() - want.int()).abs()
    worst, differ, total = max(worst, int(d.max())), differ + int((d > 0).sum()), total + d.numel()
assert worst <= 1 and differ <= total // 500, (worst, differ, total)
# where it does not apply: the caller's torch ops
assert nv12.nv12_clip(frames, h, w, Crop(0, 0, h + 2, w, False), 4, 4) is None  # a window outside the frame
odd = torch.randint(0, 256, (10, 8), dtype=torch.uint8, generator=gen)
assert nv12.nv12_clip([odd], 7, 8, Crop(0, 0, 7, 8, False), 4, 4) is None
print("ok", total, differ)
"""


def test_clip_kernel_gives_the_torch_clip_within_one():
    """The clip kernel (colour, crop, resize, flip in one kernel a frame) against the frame reference and
    nvdec.finish(): at most 1 of 255 apart, in at most 0.2% of the bytes (sums that land within a rounding of .5:
    the reference's CPU resize sums in another order); every colour's frame kernel byte-identical."""
    done = _interpreted(CLIP_CHECK)
    assert done.returncode == 0 and "ok " in done.stdout, done.stderr[-3000:]


def _interpreted(code: str) -> subprocess.CompletedProcess:
    site = _triton_site()
    if site is None:
        pytest.skip("Triton is not installed here (CI installs it for this test: TAEHV_TRITON_SITE)")
    path = os.pathsep.join(p for p in (site, str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    env.pop("TAEHV_NV12", None)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_fused_kernel_gives_the_reference_bytes():
    done = _interpreted(CHECK)
    assert done.returncode == 0 and "ok 5" in done.stdout, done.stderr[-3000:]


def test_cpu_frames_take_the_reference(monkeypatch):
    """Off the GPU (and without the interpreter) the conversion is the torch reference, whatever is installed."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    frame = torch.randint(0, 256, (12, 8), dtype=torch.uint8)
    assert torch.equal(nv12.nv12_to_rgb(frame, 8, 8), nv12.yuv420_to_rgb(frame, 8, 8))


def test_switch_names_the_reference(monkeypatch):
    """TAEHV_NV12=torch (the A/B switch of scripts/gpu_nv12_ab.sh) turns the kernel off."""
    monkeypatch.setenv("TAEHV_NV12", "torch")
    assert nv12._fused() is None


def test_a_kernel_that_fails_falls_back_once_with_one_line(monkeypatch):
    """A Triton that cannot build or launch the kernel (an unusual GPU, a broken install) costs no clip: the
    frame gets the reference's bytes, the kernel is off from then on, and one line says so."""

    class Launch:
        calls = 0

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                Launch.calls += 1
                raise RuntimeError("PTX assembly failed\nmore detail")

            return launch

    class Broken:  # the kernels' module, both kernels failing at launch
        nv12_rgb = nv12_clip = Launch()

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the kernel path for a CPU frame
    monkeypatch.delenv("TAEHV_NV12", raising=False)
    monkeypatch.setattr(nv12, "_state", {"kernel": Broken()})
    frame = torch.randint(0, 256, (12, 8), dtype=torch.uint8)
    want = nv12.yuv420_to_rgb(frame, 8, 8)
    assert torch.equal(nv12.nv12_to_rgb(frame, 8, 8), want)
    assert torch.equal(nv12.nv12_to_rgb(frame, 8, 8), want)
    assert Launch.calls == 1 and nv12._fused() is None
    note = nv12.take_note()
    assert note.startswith("data: the NV12 colour kernel failed (RuntimeError: PTX assembly failed)"), note
    assert nv12.take_note() == ""
    assert nv12.how() == "colour in torch ops (the Triton kernel failed here)"
    monkeypatch.setattr(nv12, "_state", {"kernel": None})
    assert nv12.how() == "colour in torch ops (Triton is not installed)"
    monkeypatch.setenv("TAEHV_NV12", "torch")
    assert nv12.how() == "colour in torch ops (TAEHV_NV12=torch)"
