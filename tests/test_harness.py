"""The tests' one process harness (tests/conftest.py, tests/trainrun.py) and the rule that keeps it one.

overrides() turns "key=value" text into `--set` argv; start()/start_cli() give a Proc (a Popen that knows its
output files and run directory) to wait for, signal, read and kill; trainrun builds trainer runs on both.
The rule: no test file starts a process with subprocess.Popen itself (processes that run to their end may
use subprocess.run; the CLI has run_cli for that).
"""

from __future__ import annotations

import ast
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import CLI, Proc, clean_env, overrides, start, start_cli, wait_for_text

TESTS = Path(__file__).resolve().parent
HARNESS = {"conftest.py"}  # where subprocess.Popen lives
# A test file that really needs its own process handling goes here, with the reason; none does now.
ALLOWED: dict[str, str] = {}


def test_overrides_are_the_set_argv_in_order():
    assert overrides() == []
    assert overrides("log_every=1") == ["--set", "log_every=1"]
    assert overrides("a=1 b='x'", "c=[1, 2]") == ["--set", "a=1", "--set", "b='x'", "--set", "c=[1, 2]"]
    # cut only before a key=: a value may hold white space
    assert overrides("output_dir='/a b/c' d.e=2") == ["--set", "output_dir='/a b/c'", "--set", "d.e=2"]
    assert overrides("  n_frames  ") == ["--set", "n_frames"]  # not KEY=VALUE: passed on for the CLI to refuse
    expected = ["--set", "max_train_steps=4", "--set", "lr_scheduler='constant'", "--set", "x=1"]
    assert overrides({"max_train_steps": 4, "lr_scheduler": "'constant'"}, "x=1") == expected


def test_trainruns_fast_settings_are_the_set_argv():
    from trainrun import FAST, launch_args

    assert FAST == overrides(
        "log_every=1 validation_steps=2 checkpointing_steps=2 dataloader_num_workers=0 max_validation_batches=1",
        "max_restarts=0",
    )
    argv = launch_args(Path("/t"), 2, "--resume", "auto", run_name="r")
    assert argv[:5] == ["2", "cpu", "--run-name", "r", "--master-port"] and int(argv[5]) > 0
    assert argv[6:] == ["--set", "output_dir='/t/output'", *FAST, "--resume", "auto"]
    assert launch_args(Path("/t"), 1, fast=False)[6:] == ["--set", "output_dir='/t/output'"]


CHILD = """
import os, signal, sys, time
if len(sys.argv) > 1 and os.fork() == 0:   # a grandchild
    time.sleep(60); os._exit(0)
print("ready", flush=True)
print("on stderr", file=sys.stderr, flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
time.sleep(60)
"""


def test_a_background_process_is_read_while_it_runs_and_signalled(tmp_path):
    proc = start([sys.executable, "-c", CHILD], out=tmp_path / "c.out", err=tmp_path / "c.err", cwd=tmp_path)
    assert isinstance(proc, Proc) and proc.out == tmp_path / "c.out"
    try:
        assert proc.wait_for("ready", timeout=60, poll=0.05) <= time.monotonic()
        wait_for_text(tmp_path / "c.err", "on stderr", [proc], timeout=60, poll=0.05)
        assert proc.text() == "ready\n\nSTDERR\non stderr\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.finish(timeout=60) == 7
    finally:
        proc.kill_tree()


def test_kill_tree_ends_every_process_under_it(tmp_path):
    import psutil

    proc = start([sys.executable, "-c", CHILD, "fork"], out=tmp_path / "c.out")
    try:
        proc.wait_for("ready", timeout=60, poll=0.05)
        tree = proc.tree()
        assert tree[0] == proc.pid and len(tree) == 2, tree
        proc.kill_tree(wait=30)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        proc.kill_tree()
    assert not psutil.pid_exists(tree[1]) or psutil.Process(tree[1]).status() == psutil.STATUS_ZOMBIE
    assert proc.tree() == []


def test_one_output_file_pipes_or_ours(tmp_path):
    merged = start([sys.executable, "-c", "import sys; print('a'); print('b', file=sys.stderr)"], out=tmp_path / "m")
    assert merged.finish(60) == 0 and sorted(merged.text().split()) == ["a", "b"] and merged.err is None
    piped = start([sys.executable, "-c", "import sys; print('a'); print('b', file=sys.stderr); sys.exit(3)"])
    assert piped.communicate(timeout=60) == ("a\n", "b\n") and piped.returncode == 3
    quiet = start([sys.executable, "-c", "pass"], capture=False)
    assert quiet.stdout is None and quiet.finish(60) == 0


def test_waiting_fails_when_the_process_ends_first_or_time_runs_out(tmp_path):
    gone = start([sys.executable, "-c", "print('bye')"], out=tmp_path / "g")
    with pytest.raises(AssertionError, match=r"exited 0 before 'never'.*bye"):
        gone.wait_for("never", timeout=60, poll=0.05)
    slow = start([sys.executable, "-c", "import time; time.sleep(60)"], out=tmp_path / "s")
    with pytest.raises(AssertionError, match=r"'never' not in .* in 0.3 s"):
        slow.wait_for("never", timeout=0.3, poll=0.05)
    assert slow.wait(timeout=30) == -signal.SIGKILL  # the timeout killed it
    stuck = start([sys.executable, "-c", "import time; time.sleep(60)"], out=tmp_path / "t")
    with pytest.raises(AssertionError, match=r"did not exit in 0.2 s"):
        stuck.finish(timeout=0.2)
    assert stuck.wait(timeout=30) == -signal.SIGKILL


def test_start_cli_is_run_clis_background_twin(tmp_path):
    proc = start_cli("--help", cwd=tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "taehv-launch" in out, err
    assert proc.args[: len(CLI)] == CLI
    foreground = subprocess.run([*CLI, "--help"], capture_output=True, text=True, env=clean_env(), timeout=120)
    assert foreground.stdout == out


def popen_calls(path: Path) -> list[int]:
    """Lines where the file uses subprocess.Popen (the attribute, or the name imported from subprocess), type
    annotations aside."""
    tree = ast.parse(path.read_text())
    annotations = set()
    for node in ast.walk(tree):
        for ann in (getattr(node, "returns", None), getattr(node, "annotation", None)):
            if ann is not None:
                annotations |= {id(n) for n in ast.walk(ann)}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "Popen" and id(node) not in annotations:
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "subprocess":
            lines += [node.lineno for a in node.names if a.name == "Popen"]
    return lines


def test_no_test_file_starts_processes_outside_the_harness():
    found = {
        p.name: popen_calls(p)
        for p in sorted(TESTS.glob("*.py"))
        if p.name not in HARNESS and p.name not in ALLOWED and popen_calls(p)
    }
    assert not found, (
        f"subprocess.Popen outside the harness: {found}. Start background processes with conftest.start / "
        "start_cli / trainrun.start_launch (a Proc: wait_for, finish, text, tree, kill_tree); if a test "
        "really needs its own, add it to ALLOWED in tests/test_harness.py with the reason"
    )
    assert all(reason.strip() for reason in ALLOWED.values())
    assert not [n for n in ALLOWED if not (TESTS / n).exists()], "an allowed file is gone: drop it from ALLOWED"


def test_the_rule_sees_popen_however_it_is_named(tmp_path):
    for text in (
        "import subprocess\nsubprocess.Popen(['true'])\n",
        "from subprocess import Popen\nPopen(['true'])\n",
        "import subprocess as sp\np = sp.Popen\n",
    ):
        (tmp_path / "t.py").write_text(text)
        assert popen_calls(tmp_path / "t.py"), text
    (tmp_path / "t.py").write_text(
        "import subprocess\nCODE = 'subprocess.Popen([])'\nsubprocess.run(['true'])\n"
        "def f(p: subprocess.Popen) -> subprocess.Popen:\n    return p\n"
    )
    assert popen_calls(tmp_path / "t.py") == []  # a child program's text, run(), annotations: not starts
