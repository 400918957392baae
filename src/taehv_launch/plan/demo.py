"""Where the cpu profile's built-in demo assets live: decided here, at plan time, so that
`--dry-run` prints the paths the trainer will use (it builds them there on first use).
Pure: reads only the environment mapping it is given.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

DEMO_VIDEOS = 16
DEMO_SIZE = (96, 128)  # (H, W) of the synthetic videos; the cpu profile crops 64x64 from them
DEMO_FRAMES = 48


def demo_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """$TAEHV_CACHE/demo, else $XDG_CACHE_HOME/taehv-launch/demo, else ~/.cache/taehv-launch/demo."""
    env = os.environ if env is None else env
    root = env.get("TAEHV_CACHE") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "taehv-launch"
    )
    return Path(root) / "demo"


def demo_paths(
    cache_dir: str | Path,
    ref_vae_type: str,
    latent_channels: int,
    n_videos: int = DEMO_VIDEOS,
    size: tuple[int, int] = DEMO_SIZE,
    n_frames: int = DEMO_FRAMES,
) -> tuple[str, str]:
    """(data_root, ref_vae_path) of the demo assets for this reference family and channel count."""
    height, width = size
    data_root = os.path.join(cache_dir, "videos", f"n{n_videos}_{height}x{width}_t{n_frames}")
    return data_root, os.path.join(cache_dir, "ref_vae", f"{ref_vae_type}_c{latent_channels}")
