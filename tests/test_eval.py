"""`taehv-launch eval` (#37 item 1): tiny random TAEHV weights made by the project's model code (the cpu
demo's shape, latent_channels 4), measured side by side on the sample videos' held-out clip; the one-line
refusals (exit 2) for weights of another family, an unreadable file, a folder without videos, a shape
the weights cannot take and clips the videos cannot give. The decoder on the reference VAE's latents
(--ref-vae-path) on tiny randomly initialised diffusers VAEs (the cpu demo's, make_tiny_ref_vae), and the
refusals of a reference the weights cannot decode. Validation during training measures as eval does:
test_validation_metrics.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import assert_one_line_error, run_cli, run_cli_here

CPU = ("--profile", "cpu")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """Two cogvideox-family weight files (our export's .safetensors name and an upstream-style .pth) and
    a checkpoint folder holding EMA weights, each with other random weights."""
    import torch
    from safetensors.torch import save_file

    from taehv_launch.plan.families import get_family
    from taehv_launch.train.model.taehv import TAEHV

    root = tmp_path_factory.mktemp("eval")

    def state(seed: int) -> dict:
        torch.manual_seed(seed)
        model = TAEHV.from_family(get_family("cogvideox"), latent_channels=4)
        return {k: v.contiguous() for k, v in model.state_dict().items()}

    out = {"st": root / "export" / "taecvx.safetensors", "pth": root / "upstream" / "taecvx.pth"}
    for p in out.values():
        p.parent.mkdir()
    save_file(state(0), str(out["st"]), metadata={"family": "cogvideox", "decoder_arch": "base"})
    torch.save(state(1), out["pth"])
    ckpt = root / "run" / "checkpoint-5"
    ckpt.mkdir(parents=True)
    save_file(state(2), str(ckpt / "ema.safetensors"))
    (ckpt / "trainer_state.json").write_text(
        json.dumps({"step": 5, "config": {"ref_vae_type": "cogvideox", "latent_channels": 4, "decoder_arch": "base"}})
    )
    out["ckpt"] = ckpt
    wan = root / "other" / "taew2_1.safetensors"  # the name says Wan 2.1
    wan.parent.mkdir()
    shutil.copy(out["st"].with_name("taecvx.safetensors"), wan)
    save_file(state(0), str(wan))
    out["wan"] = wan
    bad = root / "bad" / "taecvx.safetensors"
    bad.parent.mkdir()
    bad.write_bytes(b"not a safetensors file at all")
    out["bad"] = bad
    from taehv_launch.train.data.synthetic import make_tiny_ref_vae

    for name, fam, channels in (("ref", "cogvideox", 4), ("ref8", "cogvideox", 8), ("refwan", "wan", 4)):
        out[name] = Path(make_tiny_ref_vae(fam, str(root / name / "vae"), channels)).parent  # <dir>/vae
    return out


def test_side_by_side_json(tiny, videos):
    proc = run_cli(
        "eval", str(tiny["st"]), str(tiny["pth"]), str(tiny["ckpt"]), "--data-root", str(videos), *CPU, "--json"
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["height"], report["width"], report["n_frames"], report["clips"]) == (64, 64, 12, 1)
    assert [r["weights"] for r in report["results"]] == [str(tiny["st"]), str(tiny["pth"]), str(tiny["ckpt"])]
    assert report["results"][2]["file"].endswith("ema.safetensors")
    for r in report["results"]:
        assert (r["family"], r["decoder_arch"], r["decoder"]) == ("cogvideox", "base", None)
        e2e = r["end_to_end"]
        assert set(e2e) == {"psnr", "ssim", "lpips", "flicker"}
        assert e2e["psnr"] > 0 and 0 < e2e["ssim"] <= 1 and e2e["flicker"] >= 0 and r["decode_fps"] > 0
    assert report["results"][0]["end_to_end"] != report["results"][1]["end_to_end"]  # other weights, other numbers
    assert any("--ref-vae-path" in n for n in report["notes"])
    lpips_here = report["results"][0]["end_to_end"]["lpips"] is not None
    assert lpips_here or any(n.startswith("LPIPS n/a: ") for n in report["notes"])


def test_table(tiny, videos):
    proc = run_cli("eval", str(tiny["st"]), "--data-root", str(videos), *CPU, "--n-frames", "8", "--max-clips", "1")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("1 held-out clip(s) of ") and "8x64x64" in lines[0]
    assert lines[1].split()[:4] == ["weights", "family", "part", "PSNR"]
    assert lines[2].startswith(str(tiny["st"])) and "cogvideox/base" in lines[2] and "end to end" in lines[2]


@pytest.mark.parametrize(
    "case, extra, match",
    [
        (
            "other family",
            ("{wan}",),
            r"taew2_1\.safetensors holds wan weights but .*taecvx\.safetensors holds cogvideox",
        ),
        ("family flag", ("--family", "wan"), r"taecvx\.safetensors holds cogvideox weights .*not wan weights"),
        ("unreadable", ("{bad}",), r"cannot read TAEHV weights .*bad/taecvx\.safetensors"),
        ("missing", ("/nonexistent/taecvx.pth",), r"TAEHV weights not found: /nonexistent/taecvx\.pth"),
        ("shape", ("--height", "60"), r"multiples of 8, not 60x64"),
        ("frames", ("--n-frames", "5"), r"takes clips of a multiple of 4 .*, not 5 frames: pass --n-frames 4, 8 or 12"),
        ("too short", ("--n-frames", "3000"), r"no video under .* gives 3000 frames"),
    ],
)
def test_refusals(tiny, videos, case, extra, match):
    args = [a.format(wan=tiny["wan"], bad=tiny["bad"]) for a in extra]
    weights = [str(tiny["st"])] + [a for a in args if not a.startswith("-") and "/" in a]
    flags = [a for a in args if a not in weights]
    if case == "unreadable":
        weights = [str(tiny["bad"])]
    proc = run_cli_here("eval", *weights, "--data-root", str(videos), *CPU, *flags)
    assert_one_line_error(proc, match)


def test_folder_without_videos(tiny, tmp_path):
    proc = run_cli_here("eval", str(tiny["st"]), "--data-root", str(tmp_path), *CPU)
    assert_one_line_error(proc, r"video|no ")


def test_decoder_on_the_reference_latents(tiny, videos):
    """--ref-vae-path: a decoder row per file (the reference's latents of the same clips), end to end
    beside it, decode frames/s from the decoder part; the table shows both parts."""
    weights = (str(tiny["st"]), str(tiny["ckpt"]))
    ref = ("--ref-vae-path", str(tiny["ref"]))
    proc = run_cli("eval", *weights, "--data-root", str(videos), *CPU, "--n-frames", "8", *ref, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert not any("--ref-vae-path" in n for n in report["notes"]), report["notes"]
    for r in report["results"]:
        dec, e2e = r["decoder"], r["end_to_end"]
        assert dec is not None and set(dec) == set(e2e) == {"psnr", "ssim", "lpips", "flicker"}
        assert dec["psnr"] > 0 and 0 < dec["ssim"] <= 1 and dec["flicker"] >= 0 and r["decode_fps"] > 0
        assert dec != e2e  # other latents (the reference's, not the weights' own encoder's), other numbers
        assert (dec["lpips"] is None) == (e2e["lpips"] is None)
    assert report["results"][0]["decoder"] != report["results"][1]["decoder"]  # other weights, same latents
    from taehv_launch.quality.measure import table  # the same report as a table (what eval prints without --json)

    lines = table(report).splitlines()
    assert "  decoder  " in lines[2] and "  end to end  " in lines[3], lines
    assert len(lines[2].split()) == 8 and len(lines[3].split()) == 9  # decode fr/s on the decoder row only


@pytest.mark.parametrize(
    "ref, match",
    [
        (
            "ref8",
            r"--ref-vae-path .*ref8 gives 8 latent channels but .*taecvx\.safetensors decodes 4: pass --ref-vae-path",
        ),
        ("refwan", r"--ref-vae-path .*refwan holds a wan VAE but .*taecvx\.safetensors holds cogvideox/base weights"),
        ("missing", r"--ref-vae-path /nonexistent/vae: no such folder, .*the cogvideox VAE"),
    ],
)
def test_reference_the_weights_cannot_decode(tiny, videos, ref, match):
    path = str(tiny[ref]) if ref in tiny else "/nonexistent/vae"
    proc = run_cli_here("eval", str(tiny["st"]), "--data-root", str(videos), *CPU, "--ref-vae-path", path)
    assert_one_line_error(proc, match)
    assert "--set" not in proc.stderr  # eval's own flags, not the trainer's keys
