"""#35 item 10, on real files and the real CLI: a checkpoint folder without a COMPLETE marker says what it
is (another tool's, or ours copied in part: ours are renamed into place only when complete, so a save
that stops never leaves one); the cache size line's terms add up to its total; each unusable video is one
line per rank in a training run (the DataLoader workers printed one each too), with why and escaped."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import assert_one_line_error, clean_env, overrides, run_cli
from taehv_launch.rundir.checkpoint import EMA_FILE, STATE_FILE, incomplete_reason


def test_a_checkpoint_folder_without_a_marker_says_what_it_is(tmp_path: Path):
    run = tmp_path / "output" / "r"
    foreign = run / "checkpoint-500"  # what a Hugging Face Trainer leaves
    foreign.mkdir(parents=True)
    for name in ("trainer_state.json", "optimizer.pt", "scheduler.pt", "model.safetensors"):
        (foreign / name).write_text("{}")
    ours = run / "checkpoint-4"
    ours.mkdir()
    for name in (STATE_FILE, EMA_FILE, "model.safetensors"):
        (ours / name).write_text("{}")
    (run / "checkpoint-2").mkdir()
    assert incomplete_reason(foreign) == (
        "no COMPLETE marker, not a taehv-launch checkpoint: no trainer_state.json and ema.safetensors in it, "
        "another tool's folder?"
    )
    assert "interrupted" not in incomplete_reason(ours) and "copied in part?" in incomplete_reason(ours)
    assert incomplete_reason(run / "checkpoint-2") == "no COMPLETE marker, an empty folder"
    done = run_cli(
        "1", "cpu", "--dry-run", "--resume", str(foreign), "--set", f"output_dir={tmp_path / 'output'}", cwd=tmp_path
    )
    assert_one_line_error(done, r"checkpoint-500 is incomplete \(no COMPLETE marker, not a taehv-launch checkpoint")


def _size(text: str) -> float:
    number, unit = text.split()
    return float(number.replace(",", "")) * {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}[unit]


def test_the_cache_size_line_adds_up(tmp_path: Path, videos: Path):
    data = tmp_path / "data"
    data.mkdir()
    for name in ("chaplin.mp4", "fire2.mp4", "example2.mp4"):
        shutil.copy(videos / name, data / name)
    argv = ["cache", "1", "cpu", "--dry-run", *overrides(f"data_root={data}", f"latent_cache={tmp_path / 'lc'}")]
    argv += ["--set", f"output_dir={tmp_path / 'output'}"]
    text = run_cli(*argv, env=clean_env(), cwd=tmp_path, timeout=120)
    plan = run_cli(*argv, "--json", env=clean_env(), cwd=tmp_path, timeout=120)
    assert text.returncode == 0 and plan.returncode == 0, text.stderr + plan.stderr
    size = json.loads(plan.stdout)["cache_size"]
    line = next(t for t in text.stdout.splitlines() if t.startswith("  size"))
    m = re.search(
        r"= ([\d,]+) views x ([\d,]+) B \(.* latents = ([\d,]+) B \+ ~(\d+) B of index\) \+ ([\d.]+ [kMGT]?B) of shard "
        r"headers and job files = about ([\d.]+ [kMGT]?B)",
        line,
    )
    assert m, line
    clips, per_view, latents, record = (int(g.replace(",", "")) for g in m.groups()[:4])
    assert (
        (clips, per_view)
        == (size["clips"], size["view_bytes"] + size["record_bytes"])
        == (
            size["clips"],
            latents + record,
        )
    )
    assert clips * per_view + size["overhead"] == size["total"]  # exact
    shown = clips * per_view + _size(m.group(5))  # as printed: within the rounding of the two sizes
    assert abs(shown - _size(m.group(6))) <= 0.01 * _size(m.group(6)), line


@pytest.mark.slow
def test_each_unusable_video_is_one_line_with_why_and_hostile_names_train(tmp_path: Path, videos: Path):
    """A real run (2 DataLoader workers) on an annotation file `taehv-launch index` wrote for videos with
    hostile names: it trains, and each unusable video is one line, with why, its name escaped."""
    from trainrun import launch, ok

    data = tmp_path / "data"
    data.mkdir()
    for name in ("cr\rx.mp4", "ls\u2028x.mp4", 'tab\tq"x,y.mp4'):
        shutil.copy(videos / "chaplin.mp4", data / name)
    shutil.copy(videos / "test_video.mp4", data / "tiny\x1b.mp4")  # 5 frames of 1x1 pixels: unusable
    (data / "empty\n.webm").write_bytes(b"")  # cannot be opened
    ann = tmp_path / "videos.csv"
    done = run_cli("index", str(data), "-o", str(ann), env=clean_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    proc, run_dir = launch(
        tmp_path,
        1,
        *overrides(
            f"data_root={data}",
            f"annotation_file={ann}",
            "dataloader_num_workers=2 validation_fraction=0 max_train_steps=6",
        ),
    )
    ok(proc)
    out = proc.stdout + proc.stderr
    assert "\x1b" not in out and "skipping video" not in out  # the workers' own lines are gone
    lines = [line for line in out.splitlines() if "skipping unreadable or unusable video" in line]
    assert 1 <= len(lines) == len(set(lines)) <= 2, lines  # 4 videos, about 10 items drawn: one is met
    for line in lines:
        assert re.search(
            r"video .*/(tiny\\x1b\.mp4 \(5 frames, fewer than n_frames=12|empty\\n\.webm \(cannot be opened)", line
        ), line
        assert line.endswith("; logged once)"), line
    assert (run_dir / "final_model").is_dir()
