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
    class_name="AutoencoderKLWan",
    channels_key="z_dim",
    latent_channels=16,
    time_stride=4,
    space_stride=8,
    even_latents_decode_all=True,
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
        "class_name",
        "channels_key",
        "latent_channels",
        "time_stride",
        "space_stride",
        "even_latents_decode_all",
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
    import diffusers

    for fam in families.FAMILIES.values():
        assert fam.time_stride >= 1 and fam.space_stride >= 1 and fam.encode_gib > 0 and fam.latent_channels > 0
        # the demo config builds the family's diffusers class with the asked channels under channels_key,
        # and the tiny model has the record's strides: 9 frames of 32x48 -> 3 latents of 4x6
        torch.manual_seed(0)
        vae = getattr(diffusers, fam.class_name)(**fam.demo_config(3)).eval()
        assert vae.config[fam.channels_key] == 3, f"{fam.name}: demo_config ignores the channel count"
        with torch.no_grad():
            z = vae.encode(torch.rand(1, 3, 9, 32, 48) * 2 - 1).latent_dist.mode()
        expect = (1, 3, fam.latent_frames(9), 32 // fam.space_stride, 48 // fam.space_stride)
        assert tuple(z.shape) == expect, f"{fam.name}: demo VAE gives {tuple(z.shape)}, its record says {expect}"
    for prof in PROFILES.values():
        assert (prof.gpu_gib is None) == (prof.device == "cpu"), f"{prof.name}: gpu_gib must be set on GPU profiles"
        assert prof.rows and prof.description


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


def test_a_family_with_other_strides_is_refused_until_taehv_matches(monkeypatch):
    ltx = dataclasses.replace(FAKE, name="ltxish", time_stride=8, space_stride=32)
    monkeypatch.setitem(families.FAMILIES, ltx.name, ltx)
    with pytest.raises(ConfigError, match="compresses 4x in time and 8x in space.*ltxish.*8x and 32x"):
        plan_for(1, "cpu", ref_vae_type="ltxish")
    # matching strides: TAEHV downscales 8x in time and patch 4 x 8 = 32x in space
    plan = plan_for(
        1,
        "cpu",
        ref_vae_type="ltxish",
        encoder_time_downscale=(True, True, True),
        decoder_time_upscale=(True, True, True),
        patch_size=4,
        n_frames=24,
        height=64,
        width=64,
    )
    assert plan.config["patch_size"] == 4


def test_unknown_family_is_one_line():
    with pytest.raises(ConfigError, match="ref_vae_type='ltx' .*not one of cogvideox, hunyuan, wan"):
        from taehv_launch.plan.configfile import parse_sets

        parse_sets(["ref_vae_type='ltx'"])


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
