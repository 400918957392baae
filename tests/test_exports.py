"""Exports and pretrained weights against upstream madebyollin/taehv, without upstream's code (#36).

tests/fixtures/upstream_taehv.json is derived data: scripts/check_upstream_taehv.py built upstream's own
taehv.py (git show HEAD:taehv.py of madebyollin/taehv at 1f14a56) by file name and recorded, per upstream
file name, its state-dict keys and shapes, which raw decoded frames its decode_video keeps for each
latent count, and how many latents its encode_video gives for each frame count. The script itself
(run by hand, output in the #36 closing note) also loads our exports in upstream's code and compares
the decoded and encoded values.
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from conftest import REPO, assert_one_line_error, overrides, run_cli
from taehv_launch.errors import ModelError
from taehv_launch.plan.families import FAMILIES
from taehv_launch.plan.schema import make_config
from taehv_launch.rundir.checkpoint import TrainState
from taehv_launch.rundir.layout import export_weights
from taehv_launch.rundir.taehvfile import check_pretrained, file_sha256, read_facts, stems_of
from taehv_launch.train.durability.checkpoint import export_meta, export_model
from taehv_launch.train.model.taehv import TAEHV, build_taehv, load_taehv_state_dict

FIXTURE = json.loads((REPO / "tests" / "fixtures" / "upstream_taehv.json").read_text())
ARCHS = ("base", "super")
# What upstream ships (its repository's *.pth, README "What video models does TAEHV support?"), less
# taeos1_3 (Open-Sora 1.3: no reference VAE family here).
UPSTREAM_RELEASES = {
    "taecvx", "taehv", "taew2_1", "taew2_2", "taew2_2_super", "taehv1_5", "taehv1_5_super",
    "taeltx_2", "taeltx2_3", "taeh3",
}  # fmt: skip
CASES = [(f, a) for f in FAMILIES.values() for a in ARCHS]
IDS = [f"{f.name}-{a}" for f, a in CASES]

pytestmark = pytest.mark.usefixtures("one_thread")


def _script():
    spec = importlib.util.spec_from_file_location("check_upstream_taehv", REPO / "scripts" / "check_upstream_taehv.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SCRIPT = _script()  # its IndexDecoder / kept_frames: the same probe the fixture was made with


def config(family, arch="base", **values):
    return make_config(
        {
            "ref_vae_type": family.name,
            "decoder_arch": arch,
            "latent_channels": family.latent_channels,
            "patch_size": family.patch_size,
            "encoder_time_downscale": tuple(family.encoder_time_downscale),
            "decoder_time_upscale": tuple(family.decoder_time_upscale),
            **values,
        }
    )


def test_every_upstream_release_is_a_family_and_decoder():
    ours = {f.export_stem(a) for f, a in CASES}
    assert UPSTREAM_RELEASES <= ours, UPSTREAM_RELEASES - ours
    assert set(FIXTURE["files"]) == ours  # the fixture covers every name we export


@pytest.mark.parametrize("family,arch", CASES, ids=IDS)
def test_state_dict_is_upstreams_for_the_name(family, arch):
    """Our port, built for the family and decoder, has exactly the keys and shapes upstream's
    TAEHV(checkpoint_path='<stem>.pth') builds from that name: weights load both ways."""
    entry = FIXTURE["files"][family.export_stem(arch)]
    model = TAEHV.from_family(family, arch)
    assert [(k, list(v.shape)) for k, v in model.state_dict().items()] == list(entry["state_dict"].items())
    assert (model.t_downscale, model.t_upscale) == (entry["t_downscale"], entry["t_upscale"])


@pytest.mark.parametrize("family", FAMILIES.values(), ids=list(FAMILIES))
def test_decode_keeps_the_frames_upstream_keeps(family):
    """The decode alignment: for every latent count, our decode_video keeps the same raw decoded frames
    as upstream's for that file name (CogVideoX's even counts untrimmed, H3's per-chunk trim)."""
    model = TAEHV.from_family(family, "base")
    entry = FIXTURE["files"][family.export_stem("base")]
    for n in FIXTURE["latent_counts"]:
        kept = SCRIPT.kept_frames(model, n, lambda z: model.decode_video(z))
        assert kept == entry["decode_keeps"][str(n)], (family.name, n)


@pytest.mark.parametrize("family", FAMILIES.values(), ids=list(FAMILIES))
def test_encode_gives_upstreams_latent_count(family):
    model = TAEHV.from_family(family, "base").eval()
    entry = FIXTURE["files"][family.export_stem("base")]
    got = {str(t): SCRIPT.encoded_latents(model, t, model.encode_video) for t in FIXTURE["frame_counts"]}
    assert got == entry["encode_latents"]


def test_the_decode_rule_probe_sees_a_wrong_rule():
    """The alignment test is not vacuous: CogVideoX's model without its even-count rule keeps other frames."""
    cvx = FAMILIES["cogvideox"]
    wrong = TAEHV.from_family(cvx, even_latents_decode_all=False)
    kept = SCRIPT.kept_frames(wrong, 4, lambda z: wrong.decode_video(z))
    assert kept != FIXTURE["files"][cvx.export_stem("base")]["decode_keeps"]["4"]


@pytest.mark.parametrize("family,arch", [(FAMILIES["cogvideox"], "base"), (FAMILIES["cogvideox"], "super")])
def test_export_names_metadata_and_checksums(tmp_path, family, arch):
    model = TAEHV.from_family(family, arch)
    cfg = config(family, arch)
    folder = tmp_path / "final_model"
    names = export_model(model.state_dict(), folder, export_meta(cfg, TrainState(step=5), "final_model"))
    stem = family.export_stem(arch)
    assert sorted(p.name for p in folder.iterdir()) == sorted([f"{stem}.pth", f"{stem}.safetensors", "export.json"])
    assert names == [f"{stem}.safetensors", f"{stem}.pth"]
    meta = json.loads((folder / "export.json").read_text())
    assert (meta["step"], meta["family"], meta["decoder_arch"], meta["upstream_name"]) == (5, family.name, arch, stem)
    assert meta["differs_from_upstream"] == {}
    for name in names:
        assert meta["files"][name] == {"sha256": file_sha256(folder / name), "bytes": (folder / name).stat().st_size}
    with safe_open(str(folder / names[0]), "pt") as f:
        st = f.metadata()
    assert st["tae_latent_channels"] == str(family.latent_channels)
    assert (st["family"], st["decoder_arch"], st["patch_size"]) == (family.name, arch, str(family.patch_size))
    assert export_weights(folder) == folder / names[0] and export_weights(folder, ".pth") == folder / names[1]
    for name in names:  # both load back strictly through pretrained_model_path
        back = build_taehv(replace(cfg, pretrained_model_path=str(folder / name)))
        for k, v in model.state_dict().items():
            assert torch.equal(back.state_dict()[k], v), k


def test_export_of_another_shape_says_where_it_differs_from_the_release(tmp_path):
    """The cpu demo's 4 latent channels: named taecvx all the same, and export.json says how it differs."""
    cvx = FAMILIES["cogvideox"]
    cfg = config(cvx, latent_channels=4)
    meta = export_meta(cfg, TrainState(step=1), "best_model")
    assert meta["differs_from_upstream"] == {"latent_channels": [4, cvx.latent_channels]}


def test_an_export_before_36_still_reads(tmp_path):
    """final_model/ of an old run: taehv.safetensors + taehv.pth, export.json without files."""
    old = tmp_path / "final_model"
    old.mkdir()
    sd = TAEHV(latent_channels=4).state_dict()
    meta = {"step": 8, "val_psnr": None, "latent_channels": 4, "patch_size": 1, "ref_vae_type": "cogvideox"}
    save_file(sd, str(old / "taehv.safetensors"), metadata={k: str(v) for k, v in meta.items()})
    torch.save(sd, old / "taehv.pth")
    (old / "export.json").write_text(json.dumps(meta))
    assert export_weights(old) == old / "taehv.safetensors"
    stems = stems_of(FAMILIES.values())
    for name in ("taehv.safetensors", "taehv.pth"):  # cogvideox by its metadata / export.json, not its name
        facts = read_facts(str(old / name), stems)
        assert (facts.family, facts.legacy_export) == ("cogvideox", True)
        cfg = config(FAMILIES["cogvideox"], latent_channels=4, pretrained_model_path=str(old / name))
        build_taehv(cfg)
        assert check_pretrained(asdict(cfg), FAMILIES["cogvideox"], FAMILIES.values()) == []  # raw latents then and now
    # hunyuan's targets are normalized since #36: an old hunyuan export loads, with a note saying so
    meta["ref_vae_type"] = "hunyuan"
    (old / "export.json").write_text(json.dumps(meta))
    cfg = asdict(config(FAMILIES["hunyuan"], latent_channels=4, pretrained_model_path=str(old / "taehv.pth")))
    (note,) = check_pretrained(cfg, FAMILIES["hunyuan"], FAMILIES.values())
    assert "export from before #36, trained on the hunyuan VAE's raw latents" in note


def _save(path: Path, model: TAEHV, metadata: dict | None = None) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".safetensors":
        save_file(model.state_dict(), str(path), metadata=metadata)
    else:
        torch.save(model.state_dict(), path)
    return str(path)


@pytest.mark.parametrize("family", FAMILIES.values(), ids=list(FAMILIES))
def test_every_release_of_the_family_and_decoder_loads(tmp_path, family):
    """Upstream's files for the family (.pth and the safetensors/ twin, base and super), strictly, with
    the family check of pretrained_model_path (build_taehv's path)."""
    for arch in ARCHS:
        stem = family.export_stem(arch)
        release, model = TAEHV.from_family(family, arch), TAEHV.from_family(family, arch)
        for path in (tmp_path / f"{stem}.pth", tmp_path / "safetensors" / f"{stem}.safetensors"):
            load_taehv_state_dict(model, _save(path, release), family, FAMILIES)
            assert all(torch.equal(model.state_dict()[k], v) for k, v in release.state_dict().items())


def _refusal(cfg) -> str:
    with pytest.raises(ModelError) as err:
        build_taehv(cfg)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_file_of_another_family_or_decoder_is_one_line(tmp_path):
    cvx, wan = FAMILIES["cogvideox"], FAMILIES["wan"]
    same_shape = TAEHV.from_family(wan)  # patch 1, 16 channels: only its name tells it apart
    line = _refusal(config(cvx, pretrained_model_path=_save(tmp_path / f"{wan.export_stem('base')}.pth", same_shape)))
    assert re.search(r"holds wan weights .*the family from its name .*this run trains cogvideox", line), line
    assert "set --set ref_vae_type=wan" in line and f"use the {cvx.export_stem('base')} weights" in line
    sup = _save(tmp_path / f"{cvx.export_stem('super')}.safetensors", TAEHV.from_family(cvx, "super"))
    line = _refusal(config(cvx, "base", pretrained_model_path=sup))
    assert "super decoder" in line and "set --set decoder_arch=super" in line, line
    meta = {"family": "wan", "decoder_arch": "base"}  # ours, renamed: its metadata says wan
    renamed = _save(tmp_path / "mine.safetensors", same_shape, meta)
    assert "the family from its metadata" in _refusal(config(cvx, pretrained_model_path=renamed))
    legacy = _save(tmp_path / "copied" / "taehv.pth", TAEHV.from_family(cvx))  # an old export, moved away
    line = _refusal(config(cvx, pretrained_model_path=legacy))
    assert "holds hunyuan weights" in line and f"rename it to {cvx.export_stem('base')}.pth" in line, line


def test_a_file_of_another_shape_is_one_line(tmp_path):
    cvx = FAMILIES["cogvideox"]
    other = _save(tmp_path / "w.pth", TAEHV(latent_channels=32, patch_size=2))
    line = _refusal(config(cvx, pretrained_model_path=other))
    assert "patch 2, 32 latent channels" in line and "set patch_size/latent_channels to match" in line, line


def test_launch_refuses_a_pretrained_file_of_another_family_before_writing(tmp_path):
    """Through the CLI: one line, exit 2, no run folder (the launcher reads the file's header, no torch)."""
    wan_file = _save(tmp_path / "taew2_1.pth", TAEHV(latent_channels=4))  # the cpu profile's 4 channels
    out = tmp_path / "out"
    proc = run_cli("1", "cpu", *overrides(f"pretrained_model_path={wan_file}", f"output_dir={out}"))
    assert_one_line_error(proc, r"pretrained_model_path .*taew2_1\.pth holds wan weights .* this run trains cogvideox")
    assert not out.exists()


def test_load_taehv_state_dict_without_a_family_checks_shapes_only(tmp_path):
    path = _save(tmp_path / "taew2_1.pth", TAEHV())
    load_taehv_state_dict(TAEHV(), path)  # no family asked: any name loads if every key fits


@pytest.mark.slow
def test_a_run_that_exported_taehv_pth_still_resumes_and_shows(tmp_path):
    """A run dir from before #36: its exports renamed back to taehv.safetensors / taehv.pth with the old
    export.json. status reads it, --resume auto continues it, and the new exports carry upstream's name."""
    from trainrun import launch, ok

    proc, run = launch(tmp_path, 1, "--set", "max_train_steps=2")
    ok(proc)
    for folder in ("best_model", "final_model"):
        export = run / folder
        meta = json.loads((export / "export.json").read_text())
        for name in meta["files"]:
            (export / name).rename(export / ("taehv" + Path(name).suffix))
        old = {k: meta[k] for k in ("step", "val_psnr", "latent_channels", "patch_size", "ref_vae_type", "ema_decay")}
        (export / "export.json").write_text(json.dumps(old))
    status = run_cli("status", str(run))
    assert status.returncode == 0 and "Traceback" not in status.stdout + status.stderr, status.stderr
    proc, _ = launch(tmp_path, 1, "--resume", "auto", "--set", "max_train_steps=4")
    ok(proc)
    assert "resumed from" in proc.stdout
    assert sorted(p.name for p in (run / "final_model").iterdir()) == [
        "export.json",
        "taecvx.pth",
        "taecvx.safetensors",
    ]
    assert json.loads((run / "final_model" / "export.json").read_text())["step"] == 4


def test_decoder_arch_takes_base_or_super():
    proc = run_cli("1", "cpu", "--set", "decoder_arch=wide", "--dry-run")
    assert_one_line_error(proc, r"decoder_arch='wide' in --set decoder_arch=wide is not one of base, super")


@pytest.mark.slow
def test_the_demo_trains_and_exports_the_super_decoder(tmp_path):
    """decoder_arch=super through the real trainer: checkpoints, EMA, validation and an export named
    taecvx_super that loads back strictly as the Super decoder."""
    from trainrun import launch, ok

    proc, run = launch(tmp_path, 1, *overrides("decoder_arch=super max_train_steps=2"))
    ok(proc)
    stem = FAMILIES["cogvideox"].export_stem("super")
    assert sorted(p.name for p in (run / "final_model").iterdir()) == sorted(
        ["export.json", f"{stem}.pth", f"{stem}.safetensors"]
    )
    cfg = config(FAMILIES["cogvideox"], "super", latent_channels=4)
    for name in (f"{stem}.pth", f"{stem}.safetensors"):
        model = build_taehv(replace(cfg, pretrained_model_path=str(run / "final_model" / name)))
        assert model.decoder_arch == "super"
