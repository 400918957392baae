"""Slow: the latent cache against online training, a killed and a signalled cache job, 2 ranks."""

from __future__ import annotations

import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import pytest

from conftest import Proc, assert_one_line_error, clean_env, overrides, start_cli
from test_cache import cache_job
from trainrun import launch, ok, scalars
from conftest import testdata_videos as shared_videos
from taehv_launch.dataindex import latentcache as lc

pytestmark = pytest.mark.slow


def train(tmp: Path, name: str, cache: Path, *args: str):
    proc, run_dir = launch(
        tmp,
        1,
        *overrides(
            f"latent_cache={str(cache)!r}",
            f"data_root={str(shared_videos())!r}",
            "max_train_steps=4 micro_batch_size=2 validation_fraction=0.2 ref_vae_dtype='float32'",
            "dataloader_num_workers=2",
        ),
        *args,
        run_name=name,
    )
    ok(proc)
    return [v for _, v in sorted(scalars(run_dir)["train/loss"])]


def test_training_from_the_cache_equals_online_training_on_the_same_views(tmp_path):
    """The float32 cache job first; then, side by side (each run's start-up is mostly single-threaded
    imports), the bfloat16 cache job and the runs from the float32 cache and online, and the run from
    the bfloat16 cache once its job is done."""
    f32, bf16 = tmp_path / "f32", tmp_path / "bf16"

    def job(out: Path, dtype: str) -> None:
        proc = cache_job(
            tmp_path, out, "--views", "1", *overrides(f"latent_cache_dtype={dtype!r}", "ref_vae_dtype='float32'")
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    job(f32, "float32")
    with ThreadPoolExecutor(3) as pool:
        rounded = pool.submit(lambda: (job(bf16, "bfloat16"), train(tmp_path, "bf16", bf16))[1])
        cached = pool.submit(train, tmp_path, "cached", f32)
        online = pool.submit(train, tmp_path, "online", f32, "--set", "latent_cache_encode='always'")
        cached, online, rounded = cached.result(), online.result(), rounded.result()
    assert len(cached) == len(online) == 4
    for a, b, c in zip(cached, online, rounded):
        assert abs(a - b) <= 1e-4 * abs(b), (cached, online)  # the same views, the same latents
        assert abs(c - b) <= 3e-2 * abs(b), (rounded, online)  # bf16 rounding of the stored latents


def _start(tmp: Path, out: Path, *args: str) -> Proc:
    env = clean_env(TAEHV_CACHE=str(tmp / "taehv-cache"), OMP_NUM_THREADS="1")
    argv = [
        "cache",
        "1",
        "cpu",
        "--run-name",
        f"job-{out.name}",
        *overrides(
            f"latent_cache={str(out)!r}",
            f"output_dir={str(tmp / 'output')!r}",
            f"data_root={str(shared_videos())!r}",
            "dataloader_num_workers=2 cache_shard_size=2 micro_batch_size=2 validation_fraction=0.2",
        ),
        "--views",
        "3",
        *args,
    ]
    return start_cli(*argv, env=env, cwd=tmp, start_new_session=True)


def _act_at_shards(jobs: dict[Path, Proc], acts: dict[Path, tuple[int, Callable[[], None]]]) -> None:
    """Watch every job at once and act on each as soon as its own n-th shard is written: one watched after
    another let a faster job finish its whole cache while the test still waited on a slower one's first shard
    (CI at 5c252c2: the job to be killed had written its manifest before the kill)."""
    pending, deadline = dict(acts), time.time() + 300
    while pending:
        for out, (n, act) in list(pending.items()):
            if len(list((out / lc.SHARDS).glob("*.json"))) >= n:
                assert not (out / lc.MANIFEST).exists(), f"{out.name}: the whole job ended before the test acted"
                act()
                del pending[out]
            else:
                assert jobs[out].poll() is None, jobs[out].communicate()
        assert time.time() < deadline
        time.sleep(0.02)


def test_a_killed_or_signalled_cache_job_resumes_to_the_same_manifest(tmp_path):
    """Side by side (each job's start-up is mostly single-threaded imports): the whole job, one killed
    (SIGKILL to every process, no chance to clean up) and one stopped (SIGTERM to the launcher: it stops
    between shards, exit 75); then the two resumed side by side, each ending with the whole job's manifest."""
    whole, killed, stopped = tmp_path / "whole", tmp_path / "killed", tmp_path / "stopped"
    jobs = {out: _start(tmp_path, out) for out in (whole, killed, stopped)}
    try:
        _act_at_shards(
            jobs,
            {
                stopped: (1, lambda: jobs[stopped].send_signal(signal.SIGTERM)),
                # the launcher and every process under it (accelerate, the rank, its workers)
                killed: (2, lambda: jobs[killed].kill_tree(wait=30)),
            },
        )
        jobs[killed].wait()
        done = len(list((killed / lc.SHARDS).glob("*.json")))
        out, err = jobs[stopped].communicate(timeout=300)
        assert jobs[stopped].returncode == 75, (out, err)
        assert "Traceback" not in out + err and "run the same command to continue" in out
        out, err = jobs[whole].communicate(timeout=600)
        assert jobs[whole].returncode == 0, (out, err)
        expected = (whole / lc.MANIFEST).read_text()
        n_shards = len(json.loads(expected)["shards"])
        assert not (killed / lc.MANIFEST).exists() and done < n_shards

        jobs = {out: _start(tmp_path, out) for out in (killed, stopped)}
        out, err = jobs[killed].communicate(timeout=600)
        assert jobs[killed].returncode == 0, (out, err)
        assert f"{done} of {n_shards} shards already complete" in out
        assert (killed / lc.MANIFEST).read_text() == expected
        out, err = jobs[stopped].communicate(timeout=600)
        assert jobs[stopped].returncode == 0, (out, err)
        assert (stopped / lc.MANIFEST).read_text() == expected
    finally:
        for job in jobs.values():
            if job.poll() is None:
                job.kill_tree()


def test_two_ranks_share_the_shards_without_overlap_and_write_the_same_cache(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    with ThreadPoolExecutor(1) as pool:  # the two jobs side by side: their start-up is mostly single-threaded imports
        first = pool.submit(cache_job, tmp_path, one, "--views", "2", "--debug", gpus=1)
        procs = {2: cache_job(tmp_path, two, "--views", "2", "--debug", gpus=2), 1: first.result()}
    for gpus, proc in sorted(procs.items()):
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        if gpus == 2:
            written = {
                r: {
                    ln.split("shard ")[1].split()[0]
                    for ln in proc.stdout.splitlines()
                    if ln.startswith(f"[rank {r}] cache: shard ")
                }
                for r in (0, 1)
            }
            assert written[0] and written[1] and not written[0] & written[1], written
    assert (one / lc.MANIFEST).read_text() == (two / lc.MANIFEST).read_text()


def test_a_resumed_job_must_do_the_same_work(tmp_path):
    out = tmp_path / "lc"
    assert cache_job(tmp_path, out, "--views", "2").returncode == 0
    proc = cache_job(tmp_path, out, "--views", "3")
    assert_one_line_error(proc, "was started with --views 2, this job asks for 3")
    before = (out / lc.MANIFEST).read_text()
    proc = cache_job(tmp_path, out, "--views", "2")  # complete: nothing to do, same manifest
    assert proc.returncode == 0 and "shards already complete" in proc.stdout
    assert (out / lc.MANIFEST).read_text() == before
