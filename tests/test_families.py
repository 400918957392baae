"""A new reference-VAE family and a new hardware profile are each one record.

The tests register a fake of each (as a contributor adding LTX-Video or a B200 would) and check
that every path that needs the fact finds it: config checking, resolve, the memory plan, the
dry-run, the tiny demo VAE, loading and encoding, TAEHV's trim rule. A record with a field
missing cannot be built at all.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from taehv_launch.errors import ConfigError
from taehv_launch.plan import families, profiles
from taehv_launch.plan.families import Family, get_family
from taehv_launch.plan.memory import CUDA_CONTEXT_GIB, TRAINER_OVERHEAD_GIB, predict_gib
from taehv_launch.plan.profiles import GPU_SHARED, H100_ROWS, PROFILES, Profile
from taehv_launch.plan.resolve import resolve
from taehv_launch.plan.topology import detect_topology

FAKE = Family(
    name="fakevae",
    upstream="taefake",
    aliases=("taefake",),
    models="a fake Wan-like model",
    class_name="AutoencoderKLWan",
    channels_key="z_dim",
    latent_channels=16,
    time_stride=4,
    space_stride=8,
    patch_size=1,
    encoder_time_downscale=(True, True, False),
    decoder_time_upscale=(False, True, True),
    even_latents_decode_all=True,
    latent_norm="latents_mean_std",
    norm_source="a test",
    default_n_frames=12,
    encode_gib=9.0,
    demo_config=families.FAMILIES["wan"].demo_config,
)
B200 = Profile(
    name="b200",
    description="a fake 192 GB GPU",
    rows=H100_ROWS,
    config=GPU_SHARED,
    alloc_conf="expandable_segments:False",
    device="cuda",
    gpu_gib=178.4,
    table="the seeds' H100 table",
)


@pytest.fixture
def fake_family(monkeypatch):
    monkeypatch.setitem(families.FAMILIES, FAKE.name, FAKE)
    return FAKE


@pytest.fixture
def fake_profile(monkeypatch):
    monkeypatch.setitem(profiles.PROFILES, B200.name, B200)
    return B200


def plan_for(gpus: int, profile: str, **sets):
    topo = detect_topology(gpus, {}, profile=profile)
    return resolve(gpus, profile, topo, set_values=sets)


# The facts a contributor must give for a new record, written here rather than read from the dataclass,
# so a default slipped onto one of them (a family without its encode memory) fails this test.
REQUIRED = {
    Family: [
        "name",
        "upstream",
        "aliases",
        "models",
        "class_name",
        "channels_key",
        "latent_channels",
        "time_stride",
        "space_stride",
        "patch_size",
        "encoder_time_downscale",
        "decoder_time_upscale",
        "even_latents_decode_all",
        "latent_norm",
        "norm_source",
        "default_n_frames",
        "encode_gib",
        "demo_config",
    ],
    Profile: ["name", "description", "table", "rows", "config", "alloc_conf", "device", "gpu_gib"],
}


@pytest.mark.parametrize("record", [Family, Profile])
def test_an_incomplete_record_cannot_be_built(record):
    required = REQUIRED[record]
    full = {f: getattr(FAKE if record is Family else B200, f) for f in required}
    record(**full)  # these fields alone build one
    for name in required:
        with pytest.raises(TypeError, match=name):
            record(**{k: v for k, v in full.items() if k != name})


def test_every_shipped_record_is_complete():
    for fam in families.FAMILIES.values():
        assert fam.time_stride >= 1 and fam.space_stride >= 1 and fam.latent_channels > 0
        assert fam.encode_gib is None or fam.encode_gib > 0  # None: not measured, never a guess
        assert fam.valid_n_frames(fam.default_n_frames), f"{fam.name}: its default n_frames breaks its rule"
        assert fam.upstream in fam.aliases and get_family(fam.upstream) is fam
    for prof in PROFILES.values():
        assert (prof.gpu_gib is None) == (prof.device == "cpu"), f"{prof.name}: gpu_gib must be set on GPU profiles"
        assert prof.rows and prof.description


@pytest.mark.parametrize("name", list(families.FAMILIES))
def test_the_demo_vae_has_the_familys_real_strides(name):
    """The tiny demo VAE (demo_config) builds the family's diffusers class with the asked channels under
    channels_key and compresses like the released one: a clip of the family's default n_frames at the
    smallest size its strides allow (2 latents a side) encodes to the record's latent shape and decodes
    to its decoded_frames."""
    import diffusers

    fam = families.FAMILIES[name]
    torch.manual_seed(0)
    vae = getattr(diffusers, fam.class_name)(**fam.demo_config(4)).eval()
    assert vae.config[fam.channels_key] == 4, f"{fam.name}: demo_config ignores the channel count"
    n, side = fam.ref_frames(fam.default_n_frames), 2 * fam.space_stride
    with torch.no_grad():
        z = vae.encode(torch.rand(1, 3, n, side, side * 2) * 2 - 1).latent_dist.mode()
        frames = vae.decode(z).sample.shape[2]
    expect = (1, 4, fam.latent_frames(fam.default_n_frames), 2, 4)
    assert tuple(z.shape) == expect, f"{fam.name}: demo VAE gives {tuple(z.shape)}, its record says {expect}"
    assert (
        frames == fam.decoded_frames(z.shape[2]) == fam.default_n_frames - (fam.time_stride - 1) * (not fam.clip_length)
    )


def test_real_configs_fit_their_class():
    """bench's real-architecture VAE (class defaults + real_config) takes every key the record gives."""
    import inspect

    import diffusers

    for fam in families.FAMILIES.values():
        params = inspect.signature(getattr(diffusers, fam.class_name).__init__).parameters
        assert set(fam.real_config) <= set(params), f"{fam.name}: {set(fam.real_config) - set(params)}"


def test_a_new_family_is_one_record(fake_family, tmp_path):
    from taehv_launch.train.model.losses import DistillNet
    from taehv_launch.train.model.taehv import TAEHV
    from taehv_launch.train.reference.refvae import load_reference_vae
    from taehv_launch.train.data.synthetic import make_tiny_ref_vae

    plan = plan_for(1, "cpu", ref_vae_type="fakevae")  # the config key accepts it
    assert plan.config["ref_vae_type"] == "fakevae"
    assert plan_for(8, "h100", ref_vae_type="fakevae").memory.fits  # its encode memory is predicted
    assert predict_gib(1, 12, 480, 720, True, "fakevae", 1) == pytest.approx(
        TRAINER_OVERHEAD_GIB + 9.0 + CUDA_CONTEXT_GIB
    )
    path = make_tiny_ref_vae("fakevae", str(tmp_path / "vae"))  # the demo builds a tiny one
    vae = load_reference_vae("fakevae", path)  # it loads and encodes
    z = vae.encode(torch.rand(1, 12, 3, 32, 32))
    assert z.shape == (1, 3, 4, 4, 4) and vae.family is fake_family
    net = DistillNet(TAEHV(latent_channels=4), get_family("fakevae"))  # its trim rule reaches TAEHV
    assert not net.trims(6) and net.trims(3)


def test_a_family_with_other_strides_gives_taehv_its_shape(monkeypatch):
    """TAEHV's shape and n_frames come from the record; a --set that breaks the strides is refused."""
    ltx = dataclasses.replace(
        FAKE,
        name="ltxish",
        aliases=(),
        time_stride=8,
        space_stride=32,
        patch_size=4,
        encoder_time_downscale=(True, True, True),
        decoder_time_upscale=(True, True, True),
        even_latents_decode_all=False,
        default_n_frames=16,
        encode_gib=None,
    )
    monkeypatch.setitem(families.FAMILIES, ltx.name, ltx)
    plan = plan_for(1, "cpu", ref_vae_type="ltxish")
    c = plan.config
    assert (c["patch_size"], c["encoder_time_downscale"], c["n_frames"]) == (4, (True, True, True), 16)
    assert c["latent_channels"] == 4  # the cpu profile's demo channels stay
    assert plan_for(8, "h100", ref_vae_type="ltxish").config["latent_channels"] == 16  # the record's
    with pytest.raises(ConfigError, match="compresses 8x in time and 8x in space.*ltxish.*8x and 32x"):
        plan_for(1, "cpu", ref_vae_type="ltxish", patch_size=1)
    with pytest.raises(ConfigError, match="n_frames=24 does not fit ref_vae_type=ltxish.*use 16, 40 or 64"):
        plan_for(1, "cpu", ref_vae_type="ltxish", n_frames=24)
    with pytest.raises(Exception, match="TAEHV's space stride"):  # a record that contradicts itself
        dataclasses.replace(ltx, patch_size=2)


def test_unknown_family_is_one_line():
    with pytest.raises(ConfigError, match="ref_vae_type='ltx' .*not one of cogvideox, hunyuan, wan, wan22"):
        from taehv_launch.plan.configfile import parse_sets

        parse_sets(["ref_vae_type='ltx'"])
    with pytest.raises(ConfigError, match="ref_vae_type='ltx' is not supported: use one of cogvideox \\(taecvx\\)"):
        get_family("ltx")


def test_a_new_profile_is_one_record(fake_profile):
    plan = plan_for(8, "b200", n_frames=24)
    assert plan.memory.gpu_gib == 178.4 and plan.memory.fits  # its memory is checked
    assert plan_for(8, "h100", n_frames=24).memory.fits is False  # where the H100 would not fit
    assert plan.profile.alloc_conf == "expandable_segments:False"


def test_a_new_profile_reaches_the_cli(tmp_path):
    """A profile registered before the CLI runs gets a dry-run like the shipped ones."""
    code = (
        "import sys; from taehv_launch.plan import profiles; "
        "from dataclasses import replace; "
        "profiles.PROFILES['b200'] = replace(profiles.PROFILES['h100'], name='b200', gpu_gib=178.4); "
        "from taehv_launch.cli import main; sys.argv = ['taehv-launch', '8', 'b200', '--dry-run', '--json', "
        "'--set', 'n_frames=24', '--set', f'output_dir={sys.argv[1]}']; main()"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["profile"] == "b200" and plan["memory"]["fits"] and plan["memory"]["gpu_gib"] == 178.4
