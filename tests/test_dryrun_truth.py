"""`--dry-run` prints what the launch then does: the same run directory, checkpoint, command,
rendered files and demo/data paths (for `--resume auto`, the demo and real data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import clean_env, free_port, overrides, run_cli
from conftest import testdata_videos as videos_dir
from trainrun import FAST

pytestmark = pytest.mark.slow


def dry_then_launch(tmp: Path, *args: str) -> tuple[dict, Path]:
    env = clean_env(TAEHV_CACHE=str(tmp / "taehv-cache"), OMP_NUM_THREADS="1")
    argv = ["1", "cpu", "--master-port", str(free_port()), "--set", f"output_dir='{tmp / 'output'}'", *FAST, *args]
    dry = run_cli(*argv, "--dry-run", "--json", env=env, cwd=tmp)
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    real = run_cli(*argv, env=env, cwd=tmp)
    assert real.returncode == 0, real.stdout[-2000:] + real.stderr[-2000:]
    return plan, Path(plan["run_dir"])


def assert_launch_did(plan: dict, run_dir: Path) -> None:
    assert run_dir.is_dir(), f"the launch did not use the dry-run's run dir {run_dir}"
    for name, text in plan["files"].items():
        assert (run_dir / name).read_text() == text, f"{name} differs from the dry-run's"
    env = json.loads((run_dir / "env.json").read_text())
    assert env["command"] == plan["command"] and env["exported"] == plan["env"]


def test_dry_run_equals_the_launch_for_demo_resume_and_real_data(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    # the real-data launch goes beside the demo ones (start-up is mostly single-threaded imports), in a folder
    # of its own: `--resume auto` below must find the demo run's checkpoint, not this run's
    videos, elsewhere = str(videos_dir()), tmp_path / "real-data"
    elsewhere.mkdir()
    sets = overrides(f"data_root='{videos}'", "max_train_steps=1")
    with ThreadPoolExecutor(1) as pool:
        real_data = pool.submit(dry_then_launch, elsewhere, "--run-name", "real", *sets)
        # a timestamped run's name is the second it starts, which a dry-run cannot know: name this one
        first, first_dir = dry_then_launch(tmp_path, "--run-name", "first", "--set", "max_train_steps=2")  # demo data
        assert_launch_did(first, first_dir)
        demo = tmp_path / "taehv-cache" / "demo"
        assert first["config"]["data_root"].startswith(str(demo))
        assert first["config"]["ref_vae_path"].startswith(str(demo))
        assert (Path(first["config"]["data_root"]) / ".complete").is_file()  # the trainer built them where planned

        resumed, resumed_dir = dry_then_launch(tmp_path, "--resume", "auto", "--set", "max_train_steps=3")
        assert resumed_dir == first_dir  # no --run-name: continues the run the checkpoint belongs to
        assert resumed["resume"] == str(first_dir / "checkpoint-2")
        assert "--resume" in resumed["command"] and str(first_dir / "checkpoint-2") in resumed["command"]
        assert_launch_did(resumed, resumed_dir)

        real, real_dir = real_data.result()
    assert real["config"]["data_root"] == videos and real_dir.name == "real"
    assert_launch_did(real, real_dir)
