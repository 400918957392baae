"""The latent cache: `taehv-launch cache` (a real accelerate launch on real, partly broken videos) and
training from it. Slow cases (equal losses, kill + resume, 2 ranks) are in test_cache_runs.py."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import assert_one_line_error, clean_env, overrides, run_cli, run_cli_here
from conftest import testdata_videos as shared_videos
from taehv_launch.errors import ConfigError, DataError
from taehv_launch.plan.schema import DEFAULTS, make_config
from taehv_launch.dataindex import latentcache as lc

CACHE_SETS = overrides("dataloader_num_workers=2 cache_shard_size=4 micro_batch_size=2 validation_fraction=0.2")


def cache_job(tmp: Path, out: Path, *args: str, gpus: int = 1, env=None, timeout: float = 600):
    env = env or clean_env(TAEHV_CACHE=str(tmp / "taehv-cache"), OMP_NUM_THREADS="1")
    argv = [
        "cache",
        str(gpus),
        "cpu",
        "--run-name",
        f"job-{out.name}",
        *overrides(
            f"latent_cache={str(out)!r}", f"output_dir={str(tmp / 'output')!r}", f"data_root={str(shared_videos())!r}"
        ),
        *CACHE_SETS,
        *args,
    ]
    return run_cli(*argv, env=env, cwd=tmp, timeout=timeout)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """A 2-view cache of ../shared/testdata/videos (broken files included), written by the real job."""
    tmp = tmp_path_factory.mktemp("cache")
    out = tmp / "lc"
    proc = cache_job(tmp, out, "--views", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def cfg_for(cache: Path, **over):
    values = {
        **DEFAULTS,
        "height": 64,
        "width": 64,
        "ref_vae_dtype": "float32",
        "latent_channels": 4,
        "micro_batch_size": 2,
        "latent_cache": str(cache),
        "data_root": str(shared_videos()),
        **over,
    }
    return make_config(values)


# --- the format -------------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_shards_cover_the_work_once_whatever_the_world_size(world):
    shards = lc.shard_plan(23, 4, "train")
    assert [len(p) for _, p in shards] == [4, 4, 4, 4, 4, 3]
    mine = [lc.rank_share(shards, r, world) for r in range(world)]
    names = [n for share in mine for n, _ in share]
    assert sorted(names) == sorted(n for n, _ in shards) and len(names) == len(set(names))
    items = sorted(i for share in mine for _, part in share for i in part)
    assert items == list(range(23))


def test_a_shard_is_complete_only_with_its_index_and_the_right_size(tmp_path):
    latents = torch.randn(2, 3, 4, 2, 2).to(torch.bfloat16)
    views = [
        {"video": "a.mp4", "view": 0, "row": 0},
        {"video": "b.mp4", "view": 0, "skipped": "broken"},
        {"video": "c.mp4", "view": 1, "row": 1},
    ]
    rec = lc.write_shard(tmp_path, "train-000000", latents, views)
    assert (rec.clips, rec.skipped) == (2, 1) and lc.is_complete(tmp_path, "train-000000")
    index = lc.read_index(tmp_path, "train-000000")
    assert [v.get("crc32") is not None for v in index["views"]] == [True, False, True]
    assert not list(tmp_path.rglob("*.tmp"))  # the atomic writes left nothing behind
    with open(tmp_path / "shards" / "train-000000.safetensors", "ab") as f:
        f.write(b"x")  # size no longer what the index says
    assert not lc.is_complete(tmp_path, "train-000000")
    (tmp_path / "shards" / "train-000000.json").unlink()
    assert not lc.is_complete(tmp_path, "train-000000")


def test_a_fingerprint_mismatch_names_the_field():
    cfg = make_config({**DEFAULTS, "latent_channels": 4})
    fp = lc.fingerprint(cfg, "w1")
    lc.check_fingerprint(fp, cfg, "w1", "C")
    for key, value in [("height", 256), ("n_frames", 24), ("ref_vae_type", "wan"), ("max_frame_delta", 3)]:
        with pytest.raises(ConfigError, match=f"{key}="):
            lc.check_fingerprint(fp, make_config({**DEFAULTS, "latent_channels": 4, key: value}), "w1", "C")
    with pytest.raises(ConfigError, match="weights differ"):
        lc.check_fingerprint(fp, cfg, "w2", "C")


def test_an_unfinished_or_missing_cache_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="no such folder"):
        lc.read_manifest(str(tmp_path / "nope"))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / lc.JOB).write_text("{}")
    with pytest.raises(ConfigError, match="did not finish: run the same `taehv-launch cache` command again"):
        lc.read_manifest(str(tmp_path / "c"))


def test_cache_command_bad_inputs(tmp_path):
    assert_one_line_error(run_cli_here("cache", "1", "cpu", cwd=tmp_path), "needs --set latent_cache=DIR")
    assert_one_line_error(
        run_cli_here("cache", "1", "cpu", "--views", "0", "--set", "latent_cache='x'", cwd=tmp_path),
        "--views must be at least 1",
    )
    proc = run_cli_here(
        "cache", "2", "cpu", "--views", "3", "--set", "latent_cache='x'", "--dry-run", "--json", cwd=tmp_path
    )
    plan = json.loads(proc.stdout)
    assert plan["command"][-2:] == ["--task", "cache"] and plan["config"]["cache_views"] == 3
    assert Path(plan["run_dir"]).name.startswith("cache-")


# --- a real cache of real files ---------------------------------------------------------


@pytest.mark.slow
def test_the_job_writes_every_view_once_and_skips_broken_videos(cache):
    manifest = json.loads((cache / lc.MANIFEST).read_text())
    job = json.loads((cache / lc.JOB).read_text())
    views = [(s["name"], v) for s in manifest["shards"] for v in lc.read_index(cache, s["name"])["views"]]
    train = [(v["video"], v["view"]) for n, v in views if n.startswith("train")]
    assert len(train) == len(set(train)) == 2 * (manifest["videos"] - len(job["val"]))
    skipped = {v["video"] for _, v in views if "skipped" in v}
    assert {"empty.webm", "test_video.mp4"} & skipped  # 0 bytes, 1x1 pixels: unusable
    assert manifest["skipped_views"] == len([v for _, v in views if "skipped" in v]) > 0
    assert manifest["clips"] == sum(s["clips"] for s in manifest["shards"])
    assert manifest["fingerprint"]["latent_dtype"] == "bfloat16"


@pytest.mark.slow
def test_training_reads_the_stored_views_exactly(cache):
    """The dataset decodes each view's recorded frames and crop again: the clip the job encoded."""
    from taehv_launch.train.data.cached import CachedViewDataset
    from taehv_launch.train.cachejob import ViewDataset

    manifest = json.loads((cache / lc.MANIFEST).read_text())
    shard = manifest["shards"][0]["name"]
    records = [(shard, v) for v in lc.read_index(cache, shard)["views"] if "row" in v]
    cfg = cfg_for(cache)
    ds = CachedViewDataset(cache, records, str(shared_videos()), 64, 64, 0, read_latents=True, online_fallback=False)
    job = ViewDataset([("train", rec["video"], rec["view"]) for _, rec in records], str(shared_videos()), cfg)
    from safetensors.torch import load_file

    latents = load_file(str(cache / "shards" / f"{shard}.safetensors"))["latents"]
    for k, (_, rec) in enumerate(records):
        item = ds[k]
        assert torch.equal(item["frames"], job[k]["frames"]), rec
        assert torch.equal(item["latents"], latents[rec["row"]].float()) and not item["online"]


@pytest.mark.slow
def test_a_damaged_shard_is_skipped_and_counted_or_encoded_online(cache, tmp_path):
    from taehv_launch.train.data.cached import build_cached_datasets

    copy = tmp_path / "lc"
    shutil.copytree(cache, copy)
    manifest = json.loads((copy / lc.MANIFEST).read_text())
    first = manifest["shards"][0]["name"]
    data = bytearray((copy / "shards" / f"{first}.safetensors").read_bytes())
    data[-64:] = bytes(64)  # the last view's latents: zeros on disk
    (copy / "shards" / f"{first}.safetensors").write_bytes(bytes(data))
    (copy / "shards" / f"{manifest['shards'][1]['name']}.json").unlink()  # a shard without its index
    acc = SimpleNamespace(is_main_process=True, wait_for_everyone=lambda: None)
    lines: list[str] = []
    train, _ = build_cached_datasets(cfg_for(copy), acc, lines.append)
    assert any("cache shards are missing or damaged" in ln for ln in lines), lines
    last = max(k for k, (n, _) in enumerate(train.views) if n == first)
    item = train[last]
    assert f"latent cache shard {first} row {train.views[last][1]['row']}" in item["skipped"]  # like a broken video
    same_shard = [k for k, (n, _) in enumerate(train.views) if n == first and k != last]
    assert train[same_shard[0]]["skipped"] == []  # the shard's other rows are still read
    train_missing, _ = build_cached_datasets(cfg_for(copy, latent_cache_encode="missing"), acc, lines.append)
    item = train_missing[last]
    assert item["online"] and item["latents"] is None  # encoded online instead


@pytest.mark.slow
def test_a_run_that_does_not_match_the_cache_is_refused_before_it_starts(cache, tmp_path):
    base = [
        "1",
        "cpu",
        *overrides(f"latent_cache={str(cache)!r}", f"data_root={str(shared_videos())!r}"),
        "--dry-run",
    ]
    proc = run_cli_here(*base, "--set", "height=96", cwd=tmp_path)
    assert_one_line_error(proc, "does not match this run: it has height=64, this run height=96")
    proc = run_cli_here(*base, "--set", "max_frame_delta=4", cwd=tmp_path)
    assert_one_line_error(proc, "max_frame_delta=2, this run max_frame_delta=4")
    assert run_cli_here(*base, cwd=tmp_path).returncode == 0


@pytest.mark.slow  # a real trainer run (9-36 s): the fast suite reads the cache in-process (tests above)
def test_training_from_the_cache_runs_without_the_reference_vae(cache, tmp_path):
    from trainrun import launch, ok

    proc, run_dir = launch(
        tmp_path,
        1,
        *overrides(
            f"latent_cache={str(cache)!r}",
            f"data_root={str(shared_videos())!r}",
            "max_train_steps=4 micro_batch_size=2 validation_fraction=0.2 dataloader_num_workers=2",
            "ref_vae_path='/nonexistent'",
        ),
    )
    ok(proc)
    out = proc.stdout
    assert "reference encode: never" in out and "validation at step 4" in out
    assert "reference VAE is a tiny" not in out  # not loaded: its path does not even exist


def test_a_moved_data_root_fails_at_start_in_one_line(cache, tmp_path):
    from taehv_launch.train.data.cached import build_cached_datasets

    acc = SimpleNamespace(is_main_process=True, wait_for_everyone=lambda: None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        DataError, match=r"none of the first \d+ cached views can be read .*: is gone\): point data_root"
    ):
        build_cached_datasets(cfg_for(cache, data_root=str(tmp_path / "empty")), acc, lambda _: None)


def test_training_from_a_cache_on_a_gpu_needs_no_reference_vae_path(cache):
    from taehv_launch.train.loop.build import resolve_demo_paths

    cfg = cfg_for(cache, ref_vae_path="")
    assert resolve_demo_paths(cfg, torch.device("cuda"), print) is cfg  # no "ref_vae_path is empty"
    with pytest.raises(Exception, match="ref_vae_path is empty"):
        resolve_demo_paths(cfg_for(cache, ref_vae_path="", latent_cache_encode="missing"), torch.device("cuda"), print)


def test_a_cache_path_that_is_a_file_or_another_dtype_is_refused(cache, tmp_path):
    (tmp_path / "f").write_text("x")
    assert_one_line_error(
        run_cli_here("cache", "1", "cpu", "--set", f"latent_cache={str(tmp_path / 'f')!r}", "--dry-run", cwd=tmp_path),
        "is a file: give a folder",
    )
    job = lc.read_job(cache)
    other = {**job, "fingerprint": {**job["fingerprint"], "latent_dtype": "float32"}}
    with pytest.raises(ConfigError, match="stores latents as bfloat16, this job asks for latent_cache_dtype=float32"):
        lc.same_job(job, other, cache)
    for bad in ("null", "[]", '{"x": 1}'):
        (tmp_path / "c").mkdir(exist_ok=True)
        (tmp_path / "c" / lc.JOB).write_text(bad)
        with pytest.raises(DataError, match="missing or damaged"):
            lc.read_job(tmp_path / "c")
        (tmp_path / "c" / lc.MANIFEST).write_text(bad)
        with pytest.raises(ConfigError, match="is damaged"):
            lc.read_manifest(str(tmp_path / "c"))


# --- the cache's size before it is written (#27 item 4) -----------------------------------


def _dry_run_size(tmp: Path, out: Path, *args: str) -> tuple[dict, str]:
    proc = cache_job(tmp, out, "--dry-run", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    text = cache_job(tmp, out, "--dry-run", *args)
    return json.loads(proc.stdout)["cache_size"], text.stdout


def test_the_dry_run_states_the_size_a_real_cache_has(cache, tmp_path):
    """The dry run of the fixture's own job: videos x views, bytes per view at this shape, the total;
    the latents per view are exact, and the whole cache is at most the estimate (unusable videos'
    views are skipped) and not far below it."""
    size, text = _dry_run_size(tmp_path, tmp_path / "new", "--views", "2")
    manifest = json.loads((cache / lc.MANIFEST).read_text())
    job = json.loads((cache / lc.JOB).read_text())
    assert size["train_videos"] == manifest["videos"] - len(job["val"]) and size["val_videos"] == len(job["val"])
    assert size["clips"] == manifest["clips"] + manifest["skipped_views"] and size["views"] == 2
    for shard in manifest["shards"]:
        data = (cache / lc.SHARDS / f"{shard['name']}.safetensors").read_bytes()
        header = 8 + int.from_bytes(data[:8], "little")
        if shard["clips"]:
            assert (len(data) - header) == shard["clips"] * size["view_bytes"]  # exact, per view
    assert size["shape"] == [3, 4, 8, 8] and size["dtype"] == "bfloat16"  # 12 frames of 64x64, 4 channels
    on_disk = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())
    per_view = on_disk / (manifest["clips"])
    assert on_disk <= size["total"] and size["total"] / size["clips"] < 1.5 * per_view, (on_disk, size)
    line = next(t for t in text.splitlines() if t.startswith("  size"))
    assert (
        (f"{size['train_videos']} videos x 2 views + {size['val_videos']} validation clips = {size['clips']} views x ")
        in line
        and "(3x4x8x8 bfloat16 latents = 1,536 B + ~" in line
        and "GB free at " in line
    )
    assert not (tmp_path / "new").exists() and not (tmp_path / "output").exists()  # a dry run writes nothing


@pytest.mark.slow
def test_a_cache_that_does_not_fit_is_refused_before_anything_is_written(tmp_path):
    """1e5 views of 2048x2048 clips need ~1.1 TB: the job, its dry run and validate-env --cache refuse it."""
    big = ("--views", "100000", *overrides("height=2048 width=2048"))
    out = tmp_path / "lc"
    refusal = (
        r"^error: the latent cache needs about 1\.\d\d TB more \(700,002 views x 1\.57 MB\), but .* has "
        r"[\d.]+ [GMT]B free: free space, lower --views or the clip size, or set latent_cache to a folder "
        r"on a larger filesystem$"
    )
    assert_one_line_error(cache_job(tmp_path, out, *big), refusal)
    assert not out.exists() and not (tmp_path / "output").exists()
    dry = cache_job(tmp_path, out, "--dry-run", *big)
    assert dry.returncode == 2 and re.search(refusal, dry.stderr.strip()) and "about 1.10 TB" in dry.stdout
    env = clean_env(TAEHV_CACHE=str(tmp_path / "taehv-cache"))
    check = run_cli(
        "validate-env",
        "1",
        "cpu",
        "--cache",
        "--quick",
        *overrides(
            f"latent_cache={str(out)!r}",
            f"data_root={str(shared_videos())!r}",
            f"output_dir={str(tmp_path / 'o')!r}",
            "height=2048 width=2048 cache_views=100000",
        ),
        env=env,
        cwd=tmp_path,
    )
    assert check.returncode == 1 and re.search(
        r"FAIL  cache space +the latent cache needs about 1\.\d\d TB more", check.stdout
    ), check.stdout
    assert not out.exists()


def test_the_view_list_is_flat_arrays_with_the_same_records(cache):
    """#27: the views training reads are a ViewTable (numpy arrays, no per-view Python objects for forked
    workers to copy) that gives back exactly the records of the shard indexes, in order."""
    from taehv_launch.train.data.cached import build_cached_datasets
    from taehv_launch.dataindex.viewtable import ViewTable

    manifest = json.loads((cache / lc.MANIFEST).read_text())
    expected = {"train": [], "val": []}
    for s in manifest["shards"]:
        expected[s["name"][: s["name"].index("-")]] += [
            (s["name"], v) for v in lc.read_index(cache, s["name"])["views"] if "row" in v
        ]
    acc = SimpleNamespace(is_main_process=True, wait_for_everyone=lambda: None)
    train, val = build_cached_datasets(cfg_for(cache), acc, lambda _: None)
    assert isinstance(train.views, ViewTable) and isinstance(val.views, ViewTable)
    assert list(train.views) == expected["train"] and list(val.views) == expected["val"]
    assert train.views[-1] == expected["train"][-1] and list(train.views[2:4]) == expected["train"][2:4]
    assert len(train.views.videos) == len({r["video"] for _, r in expected["train"]})
    assert all(a.dtype != object for a in train.views.a.values())
