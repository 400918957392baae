"""The cpu demo for every upstream family (issue #36): real `taehv-launch 1 cpu --set ref_vae_type=X`
processes train 2 steps on a tiny reference VAE with the family's real strides (built on first use),
one new family on 2 ranks, and one new family through `taehv-launch cache` and a run from its cache.

Slow: each run starts accelerate and the trainer: 30-67 s a test, 8 min 14 s for the file on our shared
2-core machine when these tests were written (pytest --durations).
"""

from __future__ import annotations

import pytest

from taehv_launch.plan.families import FAMILIES
from trainrun import launch, ok
from conftest import overrides

pytestmark = pytest.mark.slow

# Half by upstream's file stem: the alias reaches the trainer as the family's name.
NAMES = {name: (fam.upstream if i % 2 else name) for i, (name, fam) in enumerate(FAMILIES.items())}


def _trained(proc, steps: int = 2) -> str:
    ok(proc)
    out = proc.stdout
    assert f"step {steps}/{steps}" in out and f"validation at step {steps}" in out, out[-3000:]
    assert "latents: RMS" in out, out[-3000:]  # the start-of-training scale line
    return out


@pytest.mark.parametrize("name", list(NAMES))
def test_the_cpu_demo_trains_every_family(name, tmp_path):
    fam = FAMILIES[name]
    proc, run_dir = launch(tmp_path, 1, *overrides(f"ref_vae_type={NAMES[name]}", "max_train_steps=2"))
    out = _trained(proc)
    assert f"reference VAE is a tiny randomly initialised {name}" in out
    assert f"upstream's {fam.upstream}" in out  # the latent space it trains in
    config = (run_dir / "config.py").read_text()
    assert f"args.ref_vae_type = '{name}'" in config and f"args.n_frames = {fam.default_n_frames}" in config
    assert f"args.patch_size = {fam.patch_size}" in config


def test_a_new_family_trains_on_two_ranks(tmp_path):
    proc, run_dir = launch(tmp_path, 2, *overrides("ref_vae_type=wan22 max_train_steps=2"))
    _trained(proc)
    assert (run_dir / "checkpoint-2").is_dir()


def test_a_new_family_trains_from_its_latent_cache(tmp_path):
    from conftest import clean_env, run_cli

    env = clean_env(TAEHV_CACHE=str(tmp_path.parent / "taehv-cache"), OMP_NUM_THREADS="1")
    cache = tmp_path / "lc"
    common = overrides("ref_vae_type=h3", f"latent_cache={str(cache)!r}")
    job = run_cli(
        "cache",
        "1",
        "cpu",
        "--views",
        "1",
        "--run-name",
        "job",
        *overrides(f"output_dir={str(tmp_path / 'output')!r}", "dataloader_num_workers=0"),
        *common,
        env=env,
        cwd=tmp_path,
    )
    ok(job)
    assert "cache: done" in job.stdout
    proc, _ = launch(tmp_path, 1, *common, *overrides("max_train_steps=2 latent_cache_encode=never"))
    out = _trained(proc)
    assert "reference encode: never" in out
