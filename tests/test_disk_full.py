"""A full disk while the trainer writes: one line, exit 1, no temporary folder left, nothing written before lost.

Two real ways to fill a disk without touching the machine's: a small tmpfs (ENOSPC; needs root to
mount, skipped otherwise) and a file size limit, RLIMIT_FSIZE as `ulimit -f` sets it (EFBIG; any user).
Python ignores SIGXFSZ, which the kernel also sends on EFBIG, so the write just fails."""

from __future__ import annotations

import contextlib
import json
import re
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from conftest import assert_one_line_error, clean_env, free_port, overrides, run_cli, start_cli
from taehv_launch.files import DiskWriteError, publish_dir
from trainrun import FAST, ok

# the cpu profile trains cogvideox: exports carry upstream's name for it (#36)
EXPORT = ["taecvx.safetensors", "taecvx.pth", "export.json"]


@contextlib.contextmanager
def file_size_limit(nbytes: int):
    """This process may write files of at most nbytes (the soft limit; restored after)."""
    assert signal.getsignal(signal.SIGXFSZ) == signal.SIG_IGN  # else EFBIG would kill the process
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size) -> a fresh tmpfs of that many bytes (remounted on a second call); unmounted after."""
    where = tmp_path / "tmpfs"
    where.mkdir()
    mounted = []

    def mount(size: int) -> Path:
        opts = f"size={size}" + (",remount" if mounted else "")
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (root needed): {proc.stderr.strip()}")
        mounted.append(size)
        return where

    yield mount
    if mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith((".tmp-", ".old-")))


def contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# ---------------------------------------------------------------- the helper
def test_publish_dir_replaces_a_folder_whole_or_not_at_all(tmp_path):
    final = tmp_path / "best_model"
    with publish_dir(final) as tmp:
        assert tmp == tmp_path / ".tmp-best_model"
        (tmp / "a").write_text("one")
    with publish_dir(final) as tmp:
        (tmp / "a").write_text("two")
    assert contents(final) == {"a": b"two"} and leftovers(tmp_path) == []
    with file_size_limit(1000), pytest.raises(DiskWriteError) as err:
        with publish_dir(final, then="then try again") as tmp:
            (tmp / "a").write_text("three")
            (tmp / "big").write_bytes(b"x" * 5000)
    assert err.value.exit_code == 1
    assert str(err.value).startswith(
        f"could not write best_model in {tmp_path} (File too large; this process may "
        f"write files of at most 1000 bytes (ulimit -f); "
    )
    assert str(err.value).endswith(
        "free): free disk space, or raise the quota / file size limit (`ulimit -f`), then try again"
    )
    assert contents(final) == {"a": b"two"} and leftovers(tmp_path) == []
    with pytest.raises(KeyError), publish_dir(final) as tmp:  # not a write error: goes on, still cleans up
        raise KeyError("a bug")
    assert contents(final) == {"a": b"two"} and leftovers(tmp_path) == []


def test_publish_dir_with_a_marker_keeps_a_folder_made_meanwhile(tmp_path):
    final = tmp_path / "asset"
    with publish_dir(final, marker=".complete") as tmp:
        (tmp / "v").write_text("first")
        final.mkdir()  # another process (without the lock) finished first
        (final / "v").write_text("theirs")
        (final / ".complete").touch()
    assert (final / "v").read_text() == "theirs" and leftovers(tmp_path) == []
    (final / ".complete").unlink()  # an incomplete folder is replaced
    with publish_dir(final, marker=".complete") as tmp:
        (tmp / "v").write_text("ours")
    assert contents(final) == {".complete": b"", "v": b"ours"}


# ---------------------------------------------------------------- the exports, in-process, with a real model
def real_ema_state() -> dict[str, torch.Tensor]:
    from taehv_launch.plan.profiles import get_profile
    from taehv_launch.train.model.taehv import build_taehv

    torch.manual_seed(0)
    return build_taehv(get_profile("cpu").config).state_dict()


@pytest.mark.parametrize("disk", ["tmpfs", "ulimit"])
def test_an_export_on_a_full_disk_keeps_the_previous_one(tmp_path, tmpfs, disk):
    from taehv_launch.train.durability.checkpoint import export_model

    state = real_ema_state()
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    # room for one export (two copies of the weights) and half of a second one
    run = tmpfs(int(3 * nbytes)) if disk == "tmpfs" else tmp_path / "run"
    run.mkdir(exist_ok=True)
    export_model(state, run / "best_model", {"step": 2, "upstream_name": "taecvx", "latent_channels": 4})
    before = contents(run / "best_model")
    state = {k: v + 1 for k, v in state.items()}
    with file_size_limit(nbytes // 2) if disk == "ulimit" else contextlib.nullcontext():
        with pytest.raises(DiskWriteError) as err:
            export_model(state, run / "best_model", {"step": 4, "upstream_name": "taecvx", "latent_channels": 4})
    why = "No space left on device" if disk == "tmpfs" else r"File too large; this process may write files of at most"
    assert str(err.value).startswith(f"could not write best_model in {run} ({why}")
    assert str(err.value).endswith("then continue with --resume auto (the previous best_model is kept)")
    assert "\n" not in str(err.value) and err.value.exit_code == 1
    assert contents(run / "best_model") == before  # untouched, byte for byte
    assert leftovers(run) == [] and sorted(p.name for p in run.iterdir()) == ["best_model"]
    if disk == "tmpfs":  # the failed export's first file (one copy of the weights) is gone
        assert shutil.disk_usage(run).free > 0.9 * nbytes


# ---------------------------------------------------------------- the latent cache and the demo assets
def test_a_latent_cache_shard_on_a_full_disk_is_one_line_and_leaves_no_file(tmp_path):
    from taehv_launch.dataindex import latentcache as lc

    latents = torch.randn(4, 3, 4, 8, 8)
    views = [{"row": i} for i in range(4)]
    with (
        file_size_limit(2000),
        pytest.raises(
            DiskWriteError,
            match=r"^could not write latent cache shard "
            r"train-000000 in .*shards \(File too large.*then run the same "
            r"command again: the complete shards are kept$",
        ),
    ):
        lc.write_shard(tmp_path, "train-000000", latents, views)
    assert list((tmp_path / lc.SHARDS).iterdir()) == []
    lc.write_shard(tmp_path, "train-000000", latents, views)  # with room: the same call works
    assert lc.is_complete(tmp_path, "train-000000")


def test_demo_assets_on_a_full_disk_are_one_line_and_leave_no_folder(tmp_path):
    """OpenCV's video writer says nothing when a write fails: the videos are checked after writing."""
    from taehv_launch.train.data.synthetic import ensure_demo_assets

    with (
        file_size_limit(20_000),
        pytest.raises(
            DiskWriteError,
            match=r"^could not write the CPU demo's assets in "
            r".*\(OpenCV could not finish writing demo_00\d\.mp4.*set TAEHV_CACHE",
        ),
    ):
        ensure_demo_assets(str(tmp_path), n_videos=2, size=(64, 64), n_frames=120)
    assert leftovers(tmp_path) == [] and not any(p.is_file() for p in tmp_path.rglob("*.mp4"))
    assert not any(tmp_path.rglob(".complete"))


# ---------------------------------------------------------------- the real trainer
SETTINGS = ["--set", "seraena_checkpoint_buffer_mb=0"]  # checkpoints of the same size at every step


def run_trainer(tmp_path: Path, output: Path, *args: str, preexec=None, wait: bool = True):
    """`taehv-launch 1 cpu` (the run "full" under output): its CompletedProcess, or its Proc with wait=False."""
    env = clean_env(TAEHV_CACHE=str(tmp_path.parent / "taehv-cache"), OMP_NUM_THREADS="1")
    argv = [
        "1",
        "cpu",
        "--run-name",
        "full",
        "--master-port",
        str(free_port()),
        *overrides(f"output_dir='{output}'"),
        *FAST,
        *SETTINGS,
        *args,
    ]
    if not wait:
        return start_cli(*argv, env=env, cwd=tmp_path)
    return run_cli(*argv, env=env, cwd=tmp_path, timeout=600, preexec_fn=preexec)


def page_rounded(folder: Path) -> int:
    return sum(-(-p.stat().st_size // 4096) * 4096 for p in folder.rglob("*") if p.is_file())


@pytest.mark.slow
def test_final_export_on_a_full_disk_after_training(tmp_path, tmpfs):
    """The output folder is a tmpfs. The launcher wants 2 GiB free to start, so the tmpfs shrinks once
    the resumed trainer has started: to room for one more checkpoint and half of final_model. The run
    trains, saves checkpoint-4, then fails to export final_model."""
    out = tmpfs(3 << 30)
    proc = run_trainer(tmp_path, out, "--set", "max_train_steps=2")
    ok(proc)
    run = out / "full"
    final_before, ckpt_before = contents(run / "final_model"), contents(run / "checkpoint-2")
    room = page_rounded(run / "checkpoint-2") + (run / "final_model" / "taecvx.safetensors").stat().st_size // 2
    proc = run_trainer(tmp_path, out, "--set", "max_train_steps=4", "--resume", "auto", wait=False)
    deadline = time.time() + 300
    while "resumed from" not in (run / "launch.log").read_text() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert not any(run.glob("*checkpoint-4")), "the trainer was faster than this test: checkpoint-4 is started"
    tmpfs(shutil.disk_usage(out).used + room)
    stdout, stderr = proc.communicate(timeout=600)
    proc = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert_one_line_error(
        proc,
        rf"^error: could not write final_model in {re.escape(str(run))} \(No space left on "
        r"device; 0\.0 GiB free\): free disk space, or raise the quota / file size limit "
        r"\(`ulimit -f`\), then take checkpoint-4/ema\.safetensors, which holds the same EMA "
        r"weights \(the previous final_model is kept\)$",
        code=1,
    )
    assert "Traceback" not in proc.stdout and "checkpoint: checkpoint-4" in proc.stdout
    assert leftovers(run) == []
    assert contents(run / "final_model") == final_before  # the previous export, byte for byte
    assert contents(run / "checkpoint-2") == ckpt_before
    from taehv_launch.rundir.checkpoint import checksum_problem, incomplete_reason

    for ckpt in ("checkpoint-2", "checkpoint-4"):  # both complete and intact
        assert incomplete_reason(run / ckpt) is None and checksum_problem(run / ckpt) == (None, None)
    assert json.loads((run / "exit_status.json").read_text())["code"] == 1
    assert sorted(p.name for p in (run / "best_model").iterdir()) == sorted(EXPORT)


@pytest.mark.slow
def test_best_model_export_over_the_file_size_limit_mid_run(tmp_path):
    """`ulimit -f` below one copy of the weights (any user can set it): the resumed run validates at
    step 3, finds a better model, and cannot export it."""
    proc = run_trainer(tmp_path, tmp_path / "output", "--set", "max_train_steps=2")
    ok(proc)
    run = tmp_path / "output" / "full"
    before = {name: contents(run / name) for name in ("best_model", "final_model", "checkpoint-2")}
    limit = (run / "best_model" / "taecvx.safetensors").stat().st_size // 2

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = run_trainer(
        tmp_path,
        tmp_path / "output",
        *overrides("max_train_steps=4 validation_steps=3"),
        "--resume",
        "auto",
        preexec=small_files,
    )
    assert "validation at step 3" in proc.stdout, proc.stdout
    assert_one_line_error(
        proc,
        r"^error: could not write best_model in .*full \(File too large; this process may write "
        r"files of at most \d+ MiB \(ulimit -f\); [\d.]+ GiB free\): free disk space, or raise "
        r"the quota / file size limit \(`ulimit -f`\), then continue with --resume auto "
        r"\(the previous best_model is kept\)$",
        code=1,
    )
    assert "Traceback" not in proc.stdout
    assert leftovers(run) == []
    assert {name: contents(run / name) for name in before} == before
    assert sorted(p.name for p in run.iterdir() if "checkpoint" in p.name) == ["checkpoint-2"]
