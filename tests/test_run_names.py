"""Run names and `<output_dir>/latest` (#audit-c 1), and the dry run refusing what the launch
refuses before it writes (#audit-c 3): real files, real CLI processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import assert_one_line_error, clean_env, overrides, run_cli_here
from taehv_launch.errors import ConfigError, LaunchError
from taehv_launch.run.runs import latest_run, point_latest, resolve_resume, run_id_for


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) + ("@" if p.is_symlink() else "") for p in path.rglob("*"))


@pytest.mark.parametrize("name", ["latest", "mlruns", "LATEST"])
def test_a_reserved_run_name_is_refused_in_one_line(name):
    with pytest.raises(ConfigError, match="is reserved"):
        run_id_for(name, None)
    assert run_id_for("latest-1", None) == ("latest-1", "--run-name")  # only the exact names


@pytest.mark.parametrize("dry", [True, False])
def test_run_name_latest_writes_nothing_and_leaves_latest_alone(tmp_path, dry):
    out = tmp_path / "out"
    (out / "prev").mkdir(parents=True)
    (out / "latest").symlink_to("prev")
    before = _tree(out)
    args = ["1", "cpu", "--set", f"output_dir='{out}'", "--run-name", "latest"] + (["--dry-run"] if dry else [])
    proc = run_cli_here(*args, cwd=tmp_path)
    assert_one_line_error(proc, r"--run-name 'latest' is reserved: .*pick another name")
    assert _tree(out) == before and os.readlink(out / "latest") == "prev"


def test_render_refuses_a_reserved_run_name(tmp_path):
    proc = run_cli_here(
        "render", "slurm", "16", "h100", "--output-dir", str(tmp_path), "--run-name", "latest",
        *overrides("data_root=/d ref_vae_path=/v"),
    )  # fmt: skip
    assert_one_line_error(proc, r"--run-name 'latest' is reserved")


@pytest.mark.parametrize("target", ["latest", "nowhere", "afile"])
def test_resume_auto_passes_over_a_broken_latest_with_a_note(tmp_path, target):
    out = tmp_path / "out"
    out.mkdir()
    (out / "afile").write_text("x")
    (out / "latest").symlink_to(target)
    assert latest_run(out) is None
    found, notes = resolve_resume("auto", out, None)
    assert found is None and "looking at the runs in" in notes[0], notes
    proc = run_cli_here("1", "cpu", "--set", f"output_dir='{out}'", "--resume", "auto", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "latest is " in proc.stdout or "latest points at" in proc.stdout


def test_a_latest_that_is_a_folder_is_refused_before_writing(tmp_path):
    out = tmp_path / "out"
    (out / "latest").mkdir(parents=True)
    for extra in (["--dry-run"], ["--dry-run", "--resume", "auto"], []):
        proc = run_cli_here("1", "cpu", "--set", f"output_dir='{out}'", *extra, cwd=tmp_path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().endswith("rename or move it (or choose another --set output_dir)"), proc.stderr
    assert _tree(out) == ["latest"]


def test_point_latest_repairs_a_loop_and_refuses_a_folder_without_a_stray_link(tmp_path):
    (tmp_path / "run1").mkdir()
    (tmp_path / "latest").symlink_to("latest")
    point_latest(tmp_path, tmp_path / "run1")
    assert os.readlink(tmp_path / "latest") == "run1"
    (tmp_path / "latest").unlink()
    (tmp_path / "latest").mkdir()
    with pytest.raises(LaunchError, match="rename or remove"):
        point_latest(tmp_path, tmp_path / "run1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "run1"]  # no .latest.<pid>


# --- the dry run refuses what the launch refuses, with the same line ---------------------------


def _both(tmp: Path, *args: str):
    dry = run_cli_here(*args, "--dry-run", cwd=tmp)
    real = run_cli_here(*args, cwd=tmp)
    return dry, real


@pytest.mark.parametrize(
    "args,match",
    [
        (("--set", "data_root='/nonexistent'"), r"data_root /nonexistent does not exist"),
        (("--set", "output_dir='{tmp}/afile/out'"), r"cannot write to .*afile is a file, not a folder"),
        (("--set", "output_dir='/proc/taehv'"), r"holds no files \(like /proc or /sys\)"),
    ],
)
def test_dry_run_refuses_what_the_launch_refuses(tmp_path, args, match):
    (tmp_path / "afile").write_text("x")
    args = tuple(a.replace("{tmp}", str(tmp_path)) for a in args)
    # a fixed run name: a timestamped one differs when the two calls straddle a second (seen in CI)
    dry, real = _both(tmp_path, "1", "cpu", "--run-name", "refused", *args)
    assert_one_line_error(real, match)
    assert dry.returncode == 2 and dry.stderr == real.stderr, (dry.stderr, real.stderr)
    assert "Traceback" not in dry.stdout + dry.stderr


def test_multi_node_dry_run_needs_a_run_name_like_the_launch(tmp_path):
    args = ["16", "h100", "--num-nodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--dry-run"]
    proc = run_cli_here(*args, env=clean_env(), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("error: a multi-node run needs one run name"), proc.stderr
    assert run_cli_here(*args, "--run-name", "r", env=clean_env(), cwd=tmp_path).returncode == 0
    assert run_cli_here("16", "h100", "--dry-run", env=clean_env(), cwd=tmp_path).returncode == 0  # the preview
