"""Shared test helpers: the real test videos, the CLI as a subprocess, free ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "taehv_launch.cli"]


def testdata_videos() -> Path:
    """../shared/testdata/videos beside the checkout (CI clones main with shared/ beside it)."""
    override = os.environ.get("TAEHV_TESTDATA")
    return Path(override) if override else REPO.parent / "shared" / "testdata" / "videos"


@pytest.fixture
def videos() -> Path:
    path = testdata_videos()
    if not path.is_dir():
        pytest.fail(f"test videos not found at {path}: set TAEHV_TESTDATA")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without any scheduler variables, so tests see a plain single node."""
    drop = (
        "WORLD_SIZE",
        "RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "TORCHELASTIC_RUN_ID",
        "JOB_COMPLETION_INDEX",
        "CUDA_VISIBLE_DEVICES",
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in drop and not k.startswith(("SLURM_", "PET_", "SKYPILOT_", "ACCELERATE_"))
    }
    env.update(extra)
    return env


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env or clean_env(), cwd=cwd, timeout=timeout
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, match: str, code: int = 2) -> None:
    """A user error: the exit code, one `error:` line on stderr, no traceback, nothing on stdout."""
    import re

    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert re.search(match, lines[0]), (match, lines[0])


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread: on small CI machines shared with other jobs, OpenMP spin-waiting
    makes multi-threaded CPU kernels several times slower, not faster, at these sizes."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def run_cli_here(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`taehv-launch ARGS` in this process (for commands that fail before starting anything): the same
    main() with the same environment, exit code, stdout and stderr as run_cli, without a new
    interpreter's start-up. Real subprocesses stay for everything that launches."""
    import contextlib
    import io
    from unittest import mock

    from taehv_launch import cli

    out, err = io.StringIO(), io.StringIO()
    old_cwd = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with (
            mock.patch.dict(os.environ, env or clean_env(), clear=True),
            mock.patch.object(sys, "argv", ["taehv-launch", *args]),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            try:
                cli.main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.chdir(old_cwd)
    return subprocess.CompletedProcess(["taehv-launch", *args], code, out.getvalue(), err.getvalue())
