"""Promises a new user relies on (#29): a named run resumes only its own checkpoints, exit 2 writes
nothing, one launch per run directory, the reference VAE family does not change silently on resume,
and what the trainer would refuse first is refused before anything is written or started.

One real 2-step run (`base`, a module fixture) gives the checkpoint the cases resume; the cases use
the real CLI (dry runs where the answer is decided before anything starts, real launches otherwise).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import assert_one_line_error, clean_env, free_port, overrides, run_cli, start, start_cli
from trainrun import FAST, launch, ok

pytestmark = pytest.mark.slow


CACHE = Path()


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """output/base/checkpoint-2 of a real 2-step run; every case works in its own copy of output/."""
    global CACHE
    tmp = tmp_path_factory.mktemp("trust")
    CACHE = tmp.parent / "taehv-cache"
    proc, run = launch(tmp, 1, "--set", "max_train_steps=2", run_name="base")
    ok(proc)
    assert (run / "checkpoint-2" / "COMPLETE").is_file()
    return tmp


@pytest.fixture
def work(base, tmp_path):
    """A copy of the base run's output/ for one case (the demo assets stay shared)."""
    shutil.copytree(base / "output", tmp_path / "output", symlinks=True)
    return tmp_path


def env_for(tmp: Path) -> dict[str, str]:
    return clean_env(TAEHV_CACHE=os.environ.get("TAEHV_TEST_CACHE", str(CACHE)), OMP_NUM_THREADS="1")


def run_in(tmp: Path, *args: str, run_name: str):
    return launch(tmp, 1, *args, run_name=run_name, env=env_for(tmp))


def cli(tmp: Path, *args: str, env=None) -> subprocess.CompletedProcess:
    env = env or env_for(tmp)
    return run_cli(
        "1",
        "cpu",
        "--master-port",
        str(free_port()),
        *overrides(f"output_dir='{tmp / 'output'}'"),
        *FAST,
        *args,
        env=env,
        cwd=tmp,
    )


def plan(tmp: Path, *args: str) -> dict:
    proc = cli(tmp, *args, "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_named_run_never_resumes_another_runs_checkpoint(work):
    out = work / "output"
    killed = out / "named" / ".tmp-checkpoint-2"  # all a killed launch of `named` left
    killed.mkdir(parents=True)
    (killed / "model.safetensors").write_bytes(b"\0" * 1000)
    for name in ("named", "never-launched"):
        p = plan(work, "--run-name", name, "--resume", "auto", "--set", "max_train_steps=4")
        assert p["resume"] is None, p
        assert p["run_dir"] == str(out / name)
        assert any("no complete checkpoint in" in n and "starting from scratch" in n for n in p["notes"]), p["notes"]
    # the real launch of `named` starts fresh in its own folder and removes the killed checkpoint
    proc, run = run_in(work, "--resume", "auto", "--set", "max_train_steps=1", run_name="named")
    ok(proc)
    assert "resumed from" not in proc.stdout
    assert not killed.exists()
    assert json.loads((run / "exit_status.json").read_text())["code"] == 0
    assert (out / "base" / "checkpoint-2" / "COMPLETE").is_file()


def test_an_unnamed_auto_resume_says_which_run_and_continues_in_it(base):  # reads only
    proc = cli(base, "--resume", "auto", "--set", "max_train_steps=4", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert f"run dir   {base / 'output' / 'base'}" in proc.stdout
    assert f"--resume auto: continuing run base from checkpoint-2 (in {base / 'output' / 'base'})" in proc.stdout


@pytest.mark.parametrize(
    "args,match",
    [
        (["--set", "max_train_steps=2"], r"checkpoint-2 is at step 2, and max_train_steps is 2: nothing left to train"),
        (["--set", "max_train_steps=1"], r"is at step 2, and max_train_steps is 1"),
        (
            overrides("max_train_steps=4 latent_channels=8"),
            r"does not fit this model \(latent_channels=4 -> 8\): resume with its settings",
        ),
        (overrides("max_train_steps=4 use_seraena=False"), r"use_seraena=True -> False"),
        (
            overrides("max_train_steps=4 ref_vae_type='wan'"),
            r"trained against the cogvideox reference VAE, this run asks for wan: .*allow_family_change=True",
        ),
    ],
)
def test_a_refused_resume_writes_nothing(base, args, match):
    run = base / "output" / "base"
    before = snapshot(run)
    latest = os.readlink(base / "output" / "latest")
    for extra in ([], ["--dry-run"]):
        assert_one_line_error(cli(base, "--run-name", "base", "--resume", "auto", *args, *extra), match)
        assert snapshot(run) == before  # config.py, launch.log, checkpoints: untouched
        assert os.readlink(base / "output" / "latest") == latest


def test_a_family_change_is_an_explicit_opt_in(base):
    p = plan(
        base,
        "--run-name",
        "base",
        "--resume",
        "auto",
        *overrides("max_train_steps=4 ref_vae_type='wan' allow_family_change=True"),
    )
    assert p["resume"].endswith("checkpoint-2")
    assert (
        "reference VAE family changes on resume: cogvideox (checkpoint-2) -> wan (allow_family_change=True)"
        in p["notes"]
    )
    assert p["config"]["allow_family_change"] is True  # recorded in the run's config.py


def test_resume_at_a_file_says_it_is_not_a_checkpoint(base):
    target = base / "output" / "base" / "config.py"
    assert_one_line_error(cli(base, "--resume", str(target), "--dry-run"), r"is a file, not a checkpoint")


def test_what_the_trainer_would_refuse_first_is_refused_before_writing(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no videos here")
    vae = tmp_path / "vae"
    vae.mkdir()
    (vae / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKLCogVideoX", "latent_channels": 16}))
    cases = [
        (["--set", f"data_root='{tmp_path / 'empty'}'"], r"no video files .* under .*empty: point data_root"),
        (["--set", f"data_root='{tmp_path / 'missing'}'"], r"data_root .*missing does not exist"),
        (
            ["--set", f"ref_vae_path='{vae}'"],
            r"the reference VAE at .* has 16 latent channels but latent_channels=4: set --set latent_channels=16",
        ),
        (
            overrides(f"ref_vae_path='{vae}'", "ref_vae_type='wan'"),
            r"is an AutoencoderKLCogVideoX, not the AutoencoderKLWan .*: set ref_vae_type=cogvideox",
        ),
    ]
    for i, (args, match) in enumerate(cases):
        assert_one_line_error(cli(tmp_path, "--run-name", f"r{i}", *args), match)
    assert not (tmp_path / "output").exists()  # no run dir, no launch.log, no `latest`


LOCK_HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from taehv_launch.run.lock import RunLock
    RunLock(Path(sys.argv[1]), 0).acquire()
    print("locked", flush=True)
    time.sleep(120)
""")


def test_a_held_run_dir_is_refused_and_a_dead_holders_lock_is_not(work):
    run = work / "output" / "base"
    holder = start([sys.executable, "-c", LOCK_HOLDER, str(run)], stderr=None)  # stdout: a pipe
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = snapshot(run)
        proc = cli(work, "--run-name", "base", "--resume", "auto", "--set", "max_train_steps=3")
        assert_one_line_error(
            proc,
            rf"{run} is in use by another launch \(taehv-launch pid {holder.pid} on .*\): "
            r"wait for it to end, or pass another --run-name",
        )
        assert snapshot(run) == before
    finally:
        holder.send_signal(signal.SIGKILL)  # a holder that dies leaves the file, not the lock
        holder.wait()
    proc, _ = run_in(work, "--resume", "auto", "--set", "max_train_steps=3", run_name="base")
    ok(proc)
    assert "resumed from" in proc.stdout and (run / "checkpoint-3" / "COMPLETE").is_file()


def test_two_real_launches_of_one_run(base, tmp_path):
    """The second launch of a live run is one line, exit 2, and the first one's log stays its own."""
    env = env_for(tmp_path)
    argv = ["1", "cpu", "--run-name", "live", *overrides(f"output_dir='{tmp_path / 'output'}'"), *FAST]
    argv += overrides("max_train_steps=100000")
    out = tmp_path / "first.out"  # stdout and stderr; stdin: ours
    first = start_cli(
        *argv, "--master-port", str(free_port()), env=env, cwd=tmp_path, out=out, stdin=None, start_new_session=True
    )
    try:
        first.wait_for("step 1/", timeout=240)
        log = (tmp_path / "output" / "live" / "launch.log").read_text()
        second = run_cli(*argv, "--master-port", str(free_port()), env=env, cwd=tmp_path, timeout=120)
        assert_one_line_error(second, r"is in use by another launch")
        assert (tmp_path / "output" / "live" / "launch.log").read_text().startswith(log)
        assert "=== taehv-launch" not in (tmp_path / "output" / "live" / "launch.log").read_text()[len(log) :]
        assert len(list((tmp_path / "output" / "live" / "logs").glob("events*"))) <= 1
    finally:
        os.kill(first.pid, signal.SIGTERM)
        assert first.wait(timeout=120) == 75, out.read_text()


def test_a_finished_checkpoint_whose_final_model_was_never_written_is_exported(work):
    """A run that reached max_train_steps but failed to write final_model (disk full): the resume
    only exports it, instead of refusing with 'nothing left to train'."""
    run = work / "output" / "base"
    shutil.rmtree(run / "final_model")
    proc, _ = run_in(work, "--resume", "auto", "--set", "max_train_steps=2", run_name="base")
    ok(proc)
    assert "final_model was not written from it: this launch only exports it" in proc.stdout
    assert json.loads((run / "final_model" / "export.json").read_text())["step"] == 2
    assert not (run / "checkpoint-3").exists()
