"""Every upstream TAE family through the plan (issue #36): names and aliases, TAEHV's shape and n_frames
from the family, the frame rule, the latent space line, the memory model's unmeasured families, and
bad input as one line with exit 2 and nothing written. In-process CLI runs (no trainer starts)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import assert_one_line_error, clean_env, overrides, run_cli_here
from taehv_launch.plan import families
from taehv_launch.plan.families import FAMILIES, get_family
from taehv_launch.plan.resolve import resolve
from taehv_launch.plan.topology import detect_topology

# Upstream's files (madebyollin/taehv at 62f7591) and what taehv.py builds for each.
UPSTREAM = {
    "cogvideox": ("taecvx", 1, 16, (True, True, False), (False, True, True)),
    "hunyuan": ("taehv", 1, 16, (True, True, False), (False, True, True)),
    "wan": ("taew2_1", 1, 16, (True, True, False), (False, True, True)),
    "wan22": ("taew2_2", 2, 48, (True, True, False), (False, True, True)),
    "hunyuan15": ("taehv1_5", 2, 32, (True, True, False), (False, True, True)),
    "ltx2": ("taeltx_2", 4, 128, (True, True, True), (True, True, True)),
    "ltx23": ("taeltx2_3", 4, 128, (True, True, True), (True, True, True)),
    "h3": ("taeh3", 2, 24, (True, True, False), (False, True, True)),
}
VALID = {  # the first valid n_frames with Seraena's 3-frame groups
    "cogvideox": [12, 24, 36],
    "hunyuan": [12, 24, 36],
    "wan": [12, 24, 36],
    "wan22": [12, 24, 36],
    "hunyuan15": [12, 24, 36],
    "ltx2": [16, 40, 64],
    "ltx23": [16, 40, 64],
    "h3": [39, 90, 141],
}


def plan_for(gpus: int, profile: str, **sets):
    return resolve(gpus, profile, detect_topology(gpus, {}, profile=profile), set_values=sets)


def dry_json(tmp_path, *args: str) -> dict:
    proc = run_cli_here(*args, "--dry-run", "--json", "--set", f"output_dir={str(tmp_path / 'out')!r}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_every_upstream_file_has_a_family():
    assert set(FAMILIES) == set(UPSTREAM)
    for name, (stem, patch, channels, enc, dec) in UPSTREAM.items():
        fam = get_family(name)
        assert (fam.upstream, fam.patch_size, fam.latent_channels) == (stem, patch, channels)
        assert (fam.encoder_time_downscale, fam.decoder_time_upscale) == (enc, dec)
        assert get_family(stem) is fam and fam.export_stem() == stem and fam.export_stem("super") == f"{stem}_super"
    names = [n for f in FAMILIES.values() for n in (f.name, *f.aliases)]
    assert len(names) == len(set(names)), "a name or alias names two families"


@pytest.mark.parametrize("name", list(UPSTREAM))
def test_the_plan_takes_the_familys_shape_and_frames(name):
    fam = get_family(name)
    c = plan_for(8, "h100", ref_vae_type=fam.upstream).config  # an alias is stored as the family's name
    assert c["ref_vae_type"] == name
    _, patch, channels, enc, dec = UPSTREAM[name]
    assert (c["patch_size"], c["latent_channels"], c["encoder_time_downscale"], c["decoder_time_upscale"]) == (
        patch,
        channels,
        enc,
        dec,
    )
    assert c["n_frames"] == fam.default_n_frames == VALID[name][0]
    assert c["height"] % fam.space_stride == 0 and c["width"] % fam.space_stride == 0
    cpu = plan_for(1, "cpu", ref_vae_type=name).config
    assert cpu["latent_channels"] == 4 and cpu["n_frames"] == fam.default_n_frames  # the demo's channels stay
    assert [n for n in range(1, VALID[name][-1] + 1) if fam.valid_n_frames(n)] == VALID[name]


def test_a_set_value_beats_the_family():
    c = plan_for(1, "cpu", ref_vae_type="wan", n_frames=24).config
    assert c["n_frames"] == 24
    assert plan_for(1, "cpu", ref_vae_type="h3", n_seraena_frames=1, n_frames=22).config["n_frames"] == 22


def test_keys_offers_every_family(tmp_path):
    proc = run_cli_here("keys", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    key = next(k for k in json.loads(proc.stdout) if k["name"] == "ref_vae_type")
    assert key["choices"] == list(UPSTREAM)


def test_the_plan_shows_the_latent_space(tmp_path):
    doc = dry_json(tmp_path, "1", "cpu", "--set", "ref_vae_type=taew2_1")
    assert doc["config"]["ref_vae_type"] == "wan"
    assert doc["latent_space"].startswith("(z - latents_mean) / latents_std (the VAE's config.json)")
    given = dry_json(tmp_path, "1", "cpu", *overrides("ref_latent_mean=(0,0,0,0) ref_latent_std=(1,1,1,1)"))
    assert "ref_latent_mean" in given["latent_space"]
    proc = run_cli_here("1", "cpu", "--dry-run", "--set", "ref_vae_type=hunyuan", cwd=tmp_path)
    assert "  latents   z * scaling_factor (the VAE's config.json): the latent space of upstream's taehv" in proc.stdout


def test_memory_of_an_unmeasured_family_is_not_guessed(monkeypatch):
    fam = FAMILIES["wan22"]
    monkeypatch.setitem(families.FAMILIES, "wan22", dataclasses.replace(fam, encode_gib=None, step_fit={}))
    new = plan_for(8, "h100", ref_vae_type="wan22").memory
    assert new.predicted_gib is None and new.fits is None and new.gpu_gib is not None
    assert "wan22 reference encode" in new.detail and "patch_size 2" in new.detail
    old = plan_for(8, "h100", ref_vae_type="wan").memory
    assert old.fits and old.predicted_gib > 0
    cached = plan_for(8, "h100", ref_vae_type="wan22", latent_cache="/x", latent_cache_encode="never").memory
    assert "reference encode" not in cached.detail and cached.fits is None  # the step is still unmeasured
    monkeypatch.undo()
    for fam in FAMILIES.values():  # every family is measured now (docs/evidence/families/ for the new ones)
        assert fam.encode_gib is not None and (False in fam.step_fit or fam.patch_size == 1), fam.name


@pytest.mark.parametrize("profile", ["h100", "h200", "a800"])
def test_h3s_record_caps_the_rows_micro_batch_and_keeps_the_global_batch(profile):
    """h3's step ran out of memory at micro 8 on one H100 (docs/evidence/families/): its record's max_micro 4
    caps every GPU profile's row, accumulation raised to keep the global batch, and the plan says why."""
    plan = plan_for(8, profile, ref_vae_type="h3")
    other = plan_for(8, profile, ref_vae_type="wan22")
    c = plan.config
    assert c["micro_batch_size"] == min(4, other.config["micro_batch_size"])
    assert plan.global_batch_size == other.global_batch_size
    assert c["learning_rate"] == other.config["learning_rate"]
    assert ("the family's max_micro 4" in plan.row_source) == (other.config["micro_batch_size"] > 4)
    assert plan.memory.fits, plan.memory.detail


def test_a_set_micro_batch_is_the_users_and_the_memory_plan_answers_it():
    plan = plan_for(1, "h100", ref_vae_type="h3", micro_batch_size=8)
    assert plan.config["micro_batch_size"] == 8 and "max_micro" not in plan.row_source
    assert plan.config["gradient_accumulation_steps"] == 16  # the uncapped row's: the global batch stays 128
    assert plan.memory.fits is False and plan.memory.best_micro == 4 and "micro_batch_size=4" in plan.memory.detail


def test_a_cap_that_does_not_divide_the_batch_scales_the_lr():
    from taehv_launch.plan.profiles import get_profile, row_for

    row, how = row_for(get_profile("h100"), 1, max_micro=3)
    assert (row.micro_batch_size, row.gradient_accumulation_steps) == (3, 43)
    assert "gives 129 instead of the global batch 128" in how and row.learning_rate == 1.008e-4
    assert row_for(get_profile("h100"), 1, max_micro=8) == row_for(get_profile("h100"), 1)  # at or above: no change


def test_an_ltx_plan_rounds_the_profiles_width_and_says_so():
    plan = plan_for(8, "h100", ref_vae_type="ltx2")
    assert (plan.config["height"], plan.config["width"]) == (480, 704)
    assert any("width 720 -> 704" in n for n in plan.notes)
    with pytest.raises(Exception, match="width=720 must be a positive multiple of 32"):
        plan_for(8, "h100", ref_vae_type="ltx2", width=720)  # the user's own value is not changed


@pytest.mark.parametrize(
    "sets,match",
    [
        (["ref_vae_type=ltx"], r"ref_vae_type='ltx' in --set ref_vae_type=ltx is not one of cogvideox, .*, h3$"),
        (["ref_vae_type=ltx2", "n_frames=24"], r"n_frames=24 does not fit ref_vae_type=ltx2: .*use 16, 40 or 64"),
        (["ref_vae_type=h3", "n_frames=24"], r"n_frames=24 does not fit ref_vae_type=h3: it takes 17k \+ 5 frames"),
        (["ref_vae_type=taew2_2", "n_frames=20"], r"n_frames=20 does not fit ref_vae_type=wan22: .*use 12, 24 or 36"),
        (["ref_vae_type=wan22", "patch_size=1"], r"TAEHV compresses 4x in time and 8x in space .* wan22 .* 16x"),
    ],
)
def test_bad_family_input_is_one_line_and_writes_nothing(tmp_path, sets, match):
    out = tmp_path / "out"
    args = ["1", "cpu", "--set", f"output_dir={str(out)!r}", *overrides(*sets)]
    proc = run_cli_here(*args, env=clean_env(TAEHV_CACHE=str(tmp_path / "cache")), cwd=tmp_path)
    assert_one_line_error(proc, match)
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_a_family_record_lists_its_valid_frames_in_its_message():
    for fam in families.FAMILIES.values():
        with pytest.raises(Exception, match=f"use {VALID[fam.name][0]}, {VALID[fam.name][1]} or"):
            fam.check_n_frames(1)


def test_a_wan21_folder_for_wan22_is_refused_before_anything_is_written(tmp_path):
    """One diffusers class, two families: config.json's patch_size tells the launcher which it is."""
    from taehv_launch.train.data.synthetic import make_tiny_ref_vae

    make_tiny_ref_vae("wan", str(tmp_path / "wan21" / "vae"), 4)
    out = tmp_path / "out"
    args = ["1", "cpu", *overrides(f"output_dir={str(out)!r}", f"ref_vae_path={str(tmp_path / 'wan21')!r}")]
    proc = run_cli_here(*args, "--set", "ref_vae_type=taew2_2", "--dry-run", cwd=tmp_path)
    assert_one_line_error(
        proc, r"is an AutoencoderKLWan of the wan family, not the AutoencoderKLWan \(Wan 2.2 5B.*set ref_vae_type=wan$"
    )
    assert run_cli_here(*args, "--set", "ref_vae_type=wan", "--dry-run", cwd=tmp_path).returncode == 0
    assert not out.exists()
