"""Shared test helpers: the real test videos, free ports, and the one process harness of the tests:
run_cli (the CLI in the foreground), start / start_cli (any command or the CLI in the background, a Proc
handle to wait for, signal, read and kill), overrides (`--set` argv from "key=value" text).
Trainer runs build on these in tests/trainrun.py. tests/test_harness.py keeps subprocess.Popen here."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
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
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 600, **popen
) -> subprocess.CompletedProcess:
    """`taehv-launch ARGS` to its end, in clean_env() unless env is given: exit code, stdout, stderr (text).
    Further subprocess.run arguments (preexec_fn...) in popen."""
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env or clean_env(), cwd=cwd, timeout=timeout, **popen
    )


def overrides(*items: str | Mapping[str, object]) -> list[str]:
    """The `--set` argv of config overrides, in order: overrides("log_every=1 max_train_steps=4", f"output_dir='{out}'")
    is ["--set", "log_every=1", "--set", "max_train_steps=4", "--set", "output_dir='...'"]. A string holds one or
    more `key=value`s and is cut only at white space before a `key=`, so a value may hold spaces; a mapping gives
    `key=value` with str(value) for each item."""
    argv: list[str] = []
    for item in items:
        if isinstance(item, Mapping):
            pairs = [f"{k}={v}" for k, v in item.items()]
        else:
            pairs = re.split(r"\s+(?=[A-Za-z_][\w.]*=)", item.strip())
        argv += [a for pair in pairs for a in ("--set", pair)]
    return argv


class Proc(subprocess.Popen):
    """A process started by start(): a Popen (poll, wait, communicate, send_signal, pid, returncode as usual)
    that also knows where its output goes (`out`, `err`: files, or None for pipes) and, for a launch, its
    run directory (`run`); text(), wait_for(), finish(), tree() and kill_tree() on top."""

    out: Path | None = None
    err: Path | None = None
    run: Path | None = None

    def text(self) -> str:
        """What it wrote so far into its files: stdout, then stderr after a STDERR line when they are two."""
        text = self.out.read_text(errors="replace") if self.out and self.out.exists() else ""
        if self.err is not None and self.err.exists():
            text += "\nSTDERR\n" + self.err.read_text(errors="replace")
        return text

    def wait_for(self, what: str, timeout: float = 300, where: Path | None = None, poll: float = 0.2) -> float:
        """Until `what` is in its stdout file (or in the file `where`, a run's launch.log say) while it runs;
        returns when (time.monotonic()). It exiting first or the timeout fails the test (the timeout after
        killing every process under it)."""
        return wait_for_text(where or self.out, what, [self], timeout=timeout, poll=poll)

    def finish(self, timeout: float = 300) -> int:
        """Its exit code; not exited within timeout: every process under it killed, and the test fails."""
        try:
            return self.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_tree()
            raise AssertionError(f"did not exit in {timeout} s: {self.text()[-6000:]}") from None

    def tree(self) -> list[int]:
        """Its pid and every process under it (launcher, agent, ranks, DataLoader workers); [] once gone."""
        import psutil

        try:
            return [self.pid, *(p.pid for p in psutil.Process(self.pid).children(recursive=True))]
        except psutil.NoSuchProcess:
            return []

    def kill_tree(self, wait: float = 0) -> None:
        """SIGKILL to it and every process under it (no chance to clean up); with `wait`, until they are gone."""
        import psutil

        procs = []
        for pid in self.tree():
            try:
                procs.append(psutil.Process(pid))
                procs[-1].kill()
            except psutil.Error:
                pass
        if wait:  # our child reaped by Popen (its returncode kept), the others by psutil
            psutil.wait_procs([p for p in procs if p.pid != self.pid], timeout=wait)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.wait(timeout=wait)


def start(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    out: Path | None = None,
    err: Path | None = None,
    capture: bool = True,
    run: Path | None = None,
    **popen,
) -> Proc:
    """argv in the background, as a Proc. Its output: with `out`, stdout into that file and stderr into `err`
    (into the same file without one), stdin /dev/null: no pipe to fill, readable while it runs (text,
    wait_for); else pipes (text) read with communicate(), or with capture=False ours. env None: ours.
    Further Popen arguments (stdin, stdout, start_new_session, preexec_fn...) override these defaults."""
    if out is not None:
        with open(out, "w") as o, contextlib.ExitStack() as files:
            e = files.enter_context(open(err, "w")) if err is not None else subprocess.STDOUT
            proc = Proc(argv, env=env, cwd=cwd, **({"stdout": o, "stderr": e, "stdin": subprocess.DEVNULL} | popen))
    elif capture:
        proc = Proc(
            argv, env=env, cwd=cwd, **({"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True} | popen)
        )
    else:
        proc = Proc(argv, env=env, cwd=cwd, **popen)
    proc.out, proc.err, proc.run = out, err, run
    return proc


def start_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None, **kw) -> Proc:
    """`taehv-launch ARGS` in the background (start's options), in clean_env() unless env is given: run_cli's
    counterpart for tests that signal, kill or watch it while it runs."""
    return start([*CLI, *args], env=env or clean_env(), cwd=cwd, **kw)


def wait_for_text(
    path: Path, what: str, procs: list[subprocess.Popen], timeout: float = 300, poll: float = 0.2
) -> float:
    """Until the file `path` holds `what` while every process of `procs` runs; returns when (time.monotonic()).
    One exiting first, or the timeout, fails the test after SIGKILL to every process under each."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and what in path.read_text(errors="replace"):
            return time.monotonic()
        ended = [(k, p) for k, p in enumerate(procs) if p.poll() is not None]
        if ended:
            k, p = ended[0]
            text = p.text()[-6000:] if isinstance(p, Proc) else ""
            _kill_all(procs)
            raise AssertionError(f"process {k} exited {p.returncode} before {what!r} was in {path}: {text}")
        time.sleep(poll)
    _kill_all(procs)
    raise AssertionError(f"{what!r} not in {path} in {timeout} s")


@contextlib.contextmanager
def reaped(*procs: subprocess.Popen):
    """Runs the block; then every one of `procs` still running is killed with everything under it, so a test
    that fails while runs go side by side leaves none of them behind."""
    try:
        yield
    finally:
        _kill_all([p for p in procs if p.poll() is None])


def _kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if isinstance(p, Proc):
            p.kill_tree()
        elif p.poll() is None:
            p.kill()


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
