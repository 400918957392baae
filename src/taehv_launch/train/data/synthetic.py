"""The CPU demo's assets, made on first use: synthetic videos and a tiny reference VAE.

`taehv-launch 1 cpu` must train with no downloads. The videos are real encoded .mp4
files (moving coloured shapes over scrolling textured gradients, different per video)
so the demo exercises the same OpenCV path as real data; the reference VAE is a
randomly initialised diffusers VAE with the real temporal 4x / spatial 8x compression
(PLATFORM.md's tiny configs), saved with save_pretrained so the normal loader reads it.

Each asset folder is built in a temporary folder and renamed into place with a
`.complete` marker inside (files.publish_dir), under a file lock (index.exclusive_lock): concurrent
ranks or runs either build it once or find it done, and a crash never leaves a half-written folder
that looks done. A full disk is one line (DiskWriteError) and leaves no temporary folder.
Folder names carry their parameters, so asking for another family or size never
returns a stale asset.
"""

from __future__ import annotations

import errno
import os
import tempfile

import numpy as np

from ...errors import DataError
from ...files import disk_errors, publish_dir
from ...plan.demo import DEMO_FRAMES, DEMO_SIZE, DEMO_VIDEOS, demo_paths

MARKER = ".complete"
DEMO_FPS = 12


def make_tiny_ref_vae(kind: str, path: str, latent_channels: int = 4, seed: int = 0) -> str:
    """Save a seeded, randomly initialised tiny `kind` VAE with save_pretrained into `path`.

    `path` is the model folder itself (config.json lands in it); load it with
    load_reference_vae(kind, path) or, saved as <dir>/vae, with load_reference_vae(kind, <dir>).
    """
    import diffusers
    import torch

    from ...plan.families import get_family

    family = get_family(kind)
    cls = getattr(diffusers, family.class_name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(**family.demo_config(latent_channels))
    model.save_pretrained(path)
    return str(path)


def ensure_demo_assets(
    cache_dir: str,
    n_videos: int = DEMO_VIDEOS,
    size: tuple[int, int] = DEMO_SIZE,
    n_frames: int = DEMO_FRAMES,
    latent_channels: int = 4,
    ref_vae_type: str = "cogvideox",
) -> tuple[str, str]:
    """Make (once) and return (data_root, ref_vae_path) for the CPU demo (paths: plan/demo.py). size is (H, W)."""
    height, width = size
    with disk_errors("the CPU demo's assets", cache_dir, then=_THEN):
        os.makedirs(cache_dir, exist_ok=True)
    data_root, ref_path = demo_paths(cache_dir, ref_vae_type, latent_channels, n_videos, size, n_frames)
    from ...dataindex.index import exclusive_lock

    with exclusive_lock(os.path.join(cache_dir, ".demo.lock")):
        _build_once(data_root, lambda tmp: write_demo_videos(tmp, n_videos, height, width, n_frames))
        _build_once(ref_path, lambda tmp: make_tiny_ref_vae(ref_vae_type, os.path.join(tmp, "vae"), latent_channels))
    return data_root, ref_path


def write_demo_videos(folder: str, n_videos: int, height: int, width: int, n_frames: int) -> list[str]:
    """Write n_videos mp4v files of n_frames (H x W) into folder; video i is seeded by i."""
    import cv2

    paths = []
    for i in range(n_videos):
        path = os.path.join(folder, f"demo_{i:03d}.mp4")
        writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"mp4v"), DEMO_FPS, (width, height))
        if not writer.isOpened():
            raise DataError(
                f"OpenCV cannot write the demo video {path}: reinstall opencv-python-headless "
                f"(its FFmpeg lacks the mp4v encoder) or pass --set data_root=/path/to/videos"
            )
        for frame in synthetic_frames(i, height, width, n_frames):
            writer.write(frame)
        writer.release()
        if not _whole_mp4(path):  # OpenCV's writer says nothing when the disk is full
            raise OSError(errno.EIO, f"OpenCV could not finish writing {os.path.basename(path)}")
        paths.append(path)
    return paths


def _whole_mp4(path: str) -> bool:
    """The file's top-level MP4 boxes end exactly at its end and include the index (moov, written last)."""
    import struct

    size, pos, seen = os.path.getsize(path), 0, set()
    with open(path, "rb") as f:
        while pos + 8 <= size:
            f.seek(pos)
            n, kind = struct.unpack(">I4s", f.read(8))
            if n == 1:  # a 64-bit size follows
                n = struct.unpack(">Q", f.read(8))[0]
            if n < 8:
                return False
            seen.add(kind)
            pos += n
    return pos == size and b"moov" in seen


def synthetic_frames(index: int, height: int, width: int, n_frames: int):
    """Yield n_frames uint8 HWC BGR frames: shapes moving over a scrolling textured gradient."""
    rng = np.random.default_rng(1000 + index)
    background = _Background(rng, height, width)
    shapes = [_Shape(rng, height, width) for _ in range(int(rng.integers(2, 5)))]
    for t in range(n_frames):
        frame = background.at(t)
        for shape in shapes:
            shape.draw(frame, t)
        yield frame


class _Background:
    """A two-colour gradient times a sinusoidal texture that scrolls with time."""

    def __init__(self, rng: np.random.Generator, height: int, width: int):
        yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
        angle = rng.uniform(0, np.pi)
        ramp = (np.cos(angle) * xx / width + np.sin(angle) * yy / height + 1) / 2
        c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
        self.gradient = ramp[..., None] * c1 + (1 - ramp[..., None]) * c0
        self.freq = rng.uniform(0.05, 0.3, 2)
        self.speed = rng.uniform(-2, 2, 2)
        self.contrast = rng.uniform(0.1, 0.35)
        self.yy, self.xx = yy, xx

    def at(self, t: int) -> np.ndarray:
        phase = self.freq[0] * (self.xx + self.speed[0] * t) + self.freq[1] * (self.yy + self.speed[1] * t)
        texture = 1 + self.contrast * np.sin(phase)
        return np.clip(self.gradient * texture[..., None], 0, 255).astype(np.uint8)


class _Shape:
    """A filled circle, rectangle or triangle that moves and bounces off the edges."""

    def __init__(self, rng: np.random.Generator, height: int, width: int):
        self.kind = int(rng.integers(0, 3))
        self.size = float(rng.uniform(0.08, 0.22) * min(height, width))
        self.pos = rng.uniform([0, 0], [width, height])
        self.vel = rng.uniform(-3, 3, 2)
        self.color = tuple(int(c) for c in rng.integers(0, 256, 3))
        self.bounds = np.array([width, height], dtype=np.float64)

    def center(self, t: int) -> tuple[int, int]:
        """Position at frame t, reflected at the borders (a bounce)."""
        p = np.mod(self.pos + self.vel * t, 2 * self.bounds)
        p = np.where(p > self.bounds, 2 * self.bounds - p, p)
        return int(p[0]), int(p[1])

    def draw(self, frame: np.ndarray, t: int) -> None:
        import cv2

        x, y = self.center(t)
        s = int(self.size)
        if self.kind == 0:
            cv2.circle(frame, (x, y), s, self.color, -1, cv2.LINE_AA)
        elif self.kind == 1:
            cv2.rectangle(frame, (x - s, y - s // 2), (x + s, y + s // 2), self.color, -1)
        else:
            pts = np.array([[x, y - s], [x - s, y + s], [x + s, y + s]], dtype=np.int32)
            cv2.fillPoly(frame, [pts], self.color, cv2.LINE_AA)


def _build_once(final: str, build) -> None:
    """Run build(tmp_dir) and rename tmp_dir to final, unless final is already complete. A write that
    fails (disk full ...) removes tmp_dir and is one line (DiskWriteError)."""
    if os.path.isfile(os.path.join(final, MARKER)):
        return
    parent = os.path.dirname(final)
    with disk_errors("the CPU demo's assets", parent, then=_THEN):
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".tmp-", dir=parent)  # unique: a process without the lock may build too
    with publish_dir(final, what="the CPU demo's assets", then=_THEN, tmp=tmp, marker=MARKER) as folder:
        build(str(folder))


_THEN = "then run the same command again (or set TAEHV_CACHE to a folder on a disk with room)"
