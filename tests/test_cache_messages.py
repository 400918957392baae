"""What a cache job (`taehv-launch cache`) says: it encodes, it does not train (#29 item 9)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import clean_env, overrides, run_cli, run_cli_here
from conftest import testdata_videos as shared_videos


def test_the_cache_plan_speaks_of_encoding_not_training(tmp_path):
    """Its dry run used to print the optimizer, the LR schedule and checkpoint/validation intervals."""
    proc = run_cli_here(
        "cache", "2", "cpu", "--set", f"latent_cache={str(tmp_path / 'lc')!r}", "--dry-run", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "  encode    micro-batch 1 (clips per reference encode call) per process, 2 in all; nothing is trained"
        in proc.stdout
    )
    assert "optimizer" not in proc.stdout and "checkpoint every" not in proc.stdout, proc.stdout
    train = run_cli_here("2", "cpu", "--dry-run", cwd=tmp_path).stdout  # training keeps them
    assert "  optimizer AdamW" in train and "checkpoint every 20" in train


@pytest.mark.slow
def test_the_cache_job_names_a_skipped_short_video_and_why(tmp_path):
    """A real cache job over real videos and one shorter than n_frames: the short one is skipped (not frozen)
    and the job's last line counts the skipped views with an example and the reason."""
    import shutil

    import cv2
    import numpy as np

    data = tmp_path / "data"
    data.mkdir()
    for name in ("chaplin.mp4", "fire2.mp4", "example2.mp4"):
        shutil.copy(shared_videos() / name, data / name)
    writer = cv2.VideoWriter(str(data / "short.avi"), cv2.VideoWriter_fourcc(*"FFV1"), 10, (64, 64))
    for k in range(5):
        writer.write(np.full((64, 64, 3), 40 * k, np.uint8))
    writer.release()
    proc = run_cli(
        "cache",
        "1",
        "cpu",
        "--views",
        "1",
        "--run-name",
        "job",
        *overrides(
            f"data_root={str(data)!r}",
            f"latent_cache={str(tmp_path / 'lc')!r}",
            f"output_dir={str(tmp_path / 'out')!r}",
            "dataloader_num_workers=0 validation_fraction=0.25",
        ),
        env=clean_env(TAEHV_CACHE=str(tmp_path / "taehv-cache"), OMP_NUM_THREADS="1"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    done = next(line for line in proc.stdout.splitlines() if line.startswith("cache: done:"))
    assert done.startswith(
        "cache: done: 3 clips (1 view of unusable videos skipped, e.g. short.avi: 5 frames, fewer than n_frames=12)"
    ), done
    assert Path(tmp_path / "lc").is_dir()
