"""The reference latents of every family (issue #36): normalized as the family record says, from the VAE's
own config.json or weight buffers, with ref_latent_mean/std replacing that; MiniMax-H3's ImageNet pixels
and kept tiling; the start-of-training scale line; and the latent cache for each family, written and
read back in-process (the cache job's pieces), with caches of raw latents refused.
Tiny randomly initialised diffusers VAEs, as the demo builds them."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from taehv_launch.dataindex import latentcache as lc
from taehv_launch.errors import ConfigError, ModelError
from taehv_launch.plan.families import FAMILIES
from taehv_launch.plan.schema import DEFAULTS, make_config
from taehv_launch.train.data.synthetic import make_tiny_ref_vae, write_demo_videos
from taehv_launch.train.reference.latentscale import LatentScale, scale_line
from taehv_launch.train.reference.refvae import IMAGENET_MEAN, IMAGENET_STD, load_reference_vae

C = 4  # the demo's latent channels
MEAN = [0.5, -0.25, 1.0, 0.0]
STD = [2.0, 0.5, 1.0, 4.0]


@pytest.fixture(autouse=True)
def one_thread(one_thread):
    yield


def _save_with_stats(kind: str, path: Path) -> Path:
    """A tiny `kind` VAE whose normalization is not the identity: non-trivial latents_mean/std in its
    config (or weight buffers for LTX), scaling_factor 0.5 (2.0 for LTX)."""
    import diffusers

    fam = FAMILIES[kind]
    kwargs = fam.demo_config(C)
    if "latents_mean" in kwargs:
        kwargs.update(latents_mean=MEAN, latents_std=STD)
    if kind in ("cogvideox", "hunyuan", "hunyuan15"):
        kwargs["scaling_factor"] = 0.5
    if fam.latent_norm == "buffers_mean_std":
        kwargs["scaling_factor"] = 2.0
    torch.manual_seed(0)
    model = getattr(diffusers, fam.class_name)(**kwargs)
    if fam.latent_norm == "buffers_mean_std":
        model.latents_mean.copy_(torch.tensor(MEAN))
        model.latents_std.copy_(torch.tensor(STD))
    model.save_pretrained(str(path / "vae"))
    return path


def _clip(fam, n=1, seed=0) -> torch.Tensor:
    side = 2 * fam.space_stride
    return torch.rand(n, fam.default_n_frames, 3, side, side, generator=torch.Generator().manual_seed(seed))


EXPECTED = {  # (mean, std) each family's normalization takes z through: (z - mean) / std
    "raw": (0.0, 1.0),
    "scaling_factor": (0.0, 1 / 0.5),  # z * 0.5
    "latents_mean_std": (torch.tensor(MEAN), torch.tensor(STD)),
    "buffers_mean_std": (torch.tensor(MEAN), torch.tensor(STD) / 2.0),  # (z - mean) * 2.0 / std
}


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_each_family_normalizes_as_its_pipeline(kind, tmp_path):
    fam = FAMILIES[kind]
    path = _save_with_stats(kind, tmp_path / kind)
    vae = load_reference_vae(kind, str(path))
    raw = load_reference_vae(kind, str(path))
    raw.latent_mean = raw.latent_std = None
    x = _clip(fam)
    z, zr = vae.encode(x), raw.encode(x)
    mean, std = EXPECTED[fam.latent_norm]
    shape = (1, 1, C, 1, 1)
    mean = mean.view(shape) if isinstance(mean, torch.Tensor) else mean
    std = std.view(shape) if isinstance(std, torch.Tensor) else std
    torch.testing.assert_close(z, (zr - mean) / std, rtol=1e-5, atol=1e-6)
    assert vae.latent_space.startswith(fam.latent_space().split(":")[0])
    torch.testing.assert_close(vae.decode(z), raw.decode(zr), rtol=1e-4, atol=1e-5)  # decode undoes it
    # the user's statistics replace the family's
    given = load_reference_vae(kind, str(path), latent_mean=(0, 0, 0, 0), latent_std=(1, 1, 1, 1))
    torch.testing.assert_close(given.encode(x), zr)
    assert "ref_latent_mean" in given.latent_space


def test_a_vae_without_its_statistics_is_refused(tmp_path):
    path = tmp_path / "w"
    make_tiny_ref_vae("wan", str(path / "vae"), C)
    cfg_path = path / "vae" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["latents_std"] = [1.0, 1.0, 0.0, 1.0]
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="no usable latents_mean/latents_std for its 4 channels"):
        load_reference_vae("wan", str(path))
    # given statistics do not need the VAE's own
    assert load_reference_vae("wan", str(path), latent_mean=(0,) * 4, latent_std=(1,) * 4).latent_std is not None


def test_h3_sees_imagenet_pixels_and_keeps_its_tiling(tmp_path):
    fam = FAMILIES["h3"]
    make_tiny_ref_vae("h3", str(tmp_path / "h3" / "vae"), C)
    vae = load_reference_vae("h3", str(tmp_path / "h3"))
    assert vae.model.use_tiling  # released with tiling on: its latents are the tiled encode's
    x = _clip(fam)
    mean, std = torch.tensor(IMAGENET_MEAN).view(1, 1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 1, 3, 1, 1)
    with torch.no_grad():
        want = vae.model.encode(((x - mean) / std).permute(0, 2, 1, 3, 4)).latent_dist.mode().permute(0, 2, 1, 3, 4)
    torch.testing.assert_close(vae.encode(x), want)
    make_tiny_ref_vae("wan", str(tmp_path / "wan" / "vae"), C)
    assert not load_reference_vae("wan", str(tmp_path / "wan")).model.use_tiling


def test_hunyuan15_encodes_one_clip_per_call(tmp_path):
    """diffusers 0.42.1's HunyuanVideo 1.5 attention fails for batches above 1: the adapter splits."""
    make_tiny_ref_vae("hunyuan15", str(tmp_path / "h" / "vae"), C)
    vae = load_reference_vae("hunyuan15", str(tmp_path / "h"), chunk_size=4)
    z = vae.encode(_clip(FAMILIES["hunyuan15"], n=3))
    assert z.shape[0] == 3 and vae._chunk(3) == 1


# --- the scale line at the start of training -----------------------------------------------


def test_the_scale_line_warns_far_from_unit_scale():
    line, warn = scale_line(0.94, 0.03, 8, "space", demo=False)
    assert not warn and line.startswith("latents: RMS 0.940, mean +0.030 over this rank's first 8 micro-batches")
    for rms, mean in ((2.4, 0.1), (0.2, 0.0), (1.0, 0.8)):
        line, warn = scale_line(rms, mean, 8, "space", demo=False)
        assert warn and line.startswith("warning: latents:") and "blurry" in line and "\n" not in line
    line, warn = scale_line(0.2, 0.0, 8, "space", demo=True)
    assert not warn and "demo" in line


def test_latent_scale_reads_once_after_its_batches():
    lines = []
    scale = LatentScale(lines.append, "space", batches=2)
    scale.add(None)  # no reference latents (use_ref_vae=False): nothing counted
    scale.add(torch.full((2, 3, 4, 2, 2), 3.0))
    assert not lines
    scale.add(torch.full((2, 3, 4, 2, 2), -1.0))
    scale.add(torch.zeros(1))  # after the report: ignored
    assert len(lines) == 1 and "RMS 2.236, mean +1.000 over this rank's first 2" in lines[0]
    assert lines[0].startswith("warning:")


# --- the latent cache, per family --------------------------------------------------------------


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("videos")
    write_demo_videos(str(root), 3, 64, 64, 48)
    return root


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_the_latent_cache_works_for_each_family(kind, videos, tmp_path):
    """The cache job's pieces (plan_work, the view dataset, _encode_shard, the manifest) write a cache
    of the family's normalized latents; the training side reads it back, fingerprint checked, and its
    latents are the reference encode of the same clip."""
    from taehv_launch.plan.resolve import resolve
    from taehv_launch.plan.topology import detect_topology
    from taehv_launch.train.cachejob import Clock, ViewDataset, _encode_shard, _loader, plan_work
    from taehv_launch.train.data.cached import build_cached_datasets

    fam = FAMILIES[kind]
    make_tiny_ref_vae(kind, str(tmp_path / "vae" / "vae"), C)
    out = tmp_path / "lc"
    sets = dict(
        ref_vae_type=kind,
        ref_vae_path=str(tmp_path / "vae"),
        data_root=str(videos),
        latent_cache=str(out),
        output_dir=str(tmp_path / "output"),
        cache_views=1,
        cache_shard_size=2,
        micro_batch_size=1,
        dataloader_num_workers=0,
        validation_fraction=0.3,
    )
    plan = resolve(1, "cpu", detect_topology(1, {}, profile="cpu"), set_values=sets)
    cfg = make_config(plan.config)
    job, shards, work, root = plan_work(cfg, lambda _: None)
    assert job["fingerprint"]["latent_space"] == lc.LATENT_SPACE
    assert lc.claim(out, job)
    ref = load_reference_vae(kind, cfg.ref_vae_path)
    loader = _loader(ViewDataset(work, root, cfg), [[j] for _, part in shards for j in part], cfg)
    it = iter(loader)
    for name, part in shards:
        _encode_shard(out, name, part, it, ref, torch.float32, 1, 0, Clock())
    records = [lc.ShardRecord(**{k: v for k, v in lc.read_index(out, n).items() if k != "views"}) for n, _ in shards]
    lc.write_manifest(out, job, records)
    train, val = build_cached_datasets(cfg, SimpleNamespace(is_main_process=True), lambda _: None)
    item = train[0]
    s = fam.space_stride
    assert item["latents"].shape == (fam.latent_frames(cfg.n_frames), C, 64 // s, 64 // s) and not item["online"]
    torch.testing.assert_close(item["latents"][None], ref.encode(item["frames"][None]), rtol=1e-4, atol=1e-5)
    assert len(val) >= 1


def test_a_cache_of_raw_latents_is_refused():
    """Caches written before each family's normalization hold raw latents: one line, write it again."""
    cfg = make_config({**DEFAULTS, "latent_channels": 4})
    fp = lc.fingerprint(cfg, "w")
    lc.check_fingerprint(fp, cfg, "w", "C")
    old = {k: v for k, v in fp.items() if k != "latent_space"}
    with pytest.raises(ConfigError, match="latent cache C holds latents in another space .*raw reference latents"):
        lc.check_fingerprint(old, cfg, "w", "C")
    with pytest.raises(ConfigError, match="write it again with `taehv-launch cache"):
        lc.check_fingerprint({**fp, "latent_space": "v3"}, cfg, "w", "C")
