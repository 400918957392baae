#!/usr/bin/env python3
"""Check our TAEHV port and its exports against upstream madebyollin/taehv's own `taehv.py`.

    git -C <taehv clone> show HEAD:taehv.py > /tmp/upstream_taehv/taehv.py   # needs torch and tqdm
    python scripts/check_upstream_taehv.py /tmp/upstream_taehv/taehv.py [--fixture tests/fixtures/upstream_taehv.json]

For every family (plan/families.py) and decoder (base, super): our port (TAEHV.from_family) is exported
by the trainer's own export code (named as upstream names it, e.g. taecvx_super.pth, with its
.safetensors twin and export.json), upstream's `TAEHV(checkpoint_path=<that file>)` loads it strictly
(picking shape and decode rule from the name, as upstream users do), and both decode the same random
latents (every latent count 1-8 and 12: CogVideoX's even/odd rule, H3's 5-latent chunks) and encode the
same random frames (H3's 17-frame clips, LTX's 8x) in float64; the largest difference is printed. The
release's own layout (upstream built by name) also loads back into our port through pretrained_model_path.

--fixture writes what CI checks without upstream's code (tests/test_exports.py): per upstream file name,
upstream's state-dict keys and shapes, which raw decoded frames its decode_video keeps for each latent
count, and how many latents its encode_video gives for each frame count. Derived data, not code.
Exit 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import re
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn as nn

LATENT_COUNTS = (1, 2, 3, 4, 5, 6, 7, 8, 12)
FRAME_COUNTS = (1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 24, 33, 34, 35)
TOL = 1e-9  # float64


def load_upstream(path: str):
    spec = importlib.util.spec_from_file_location("upstream_taehv", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Built(Exception):
    pass


def upstream_by_name(U, stem: str) -> nn.Module:
    """Upstream's TAEHV as its constructor lays it out for the file name `<stem>.pth` (no file read:
    the constructor stops at its torch.load, after every layer is made)."""
    model = U.TAEHV.__new__(U.TAEHV)
    real = torch.load

    def stop(*args, **kwargs):
        raise _Built

    torch.load = stop
    try:
        U.TAEHV.__init__(model, checkpoint_path=f"{stem}.pth")
    except _Built:
        pass
    finally:
        torch.load = real
    return model


class IndexDecoder(nn.Module):
    """Stands in for a decoder: latent i becomes t_up frames whose every value is (raw frame index + 1) /
    1000, so the frames a decode_video keeps can be read back (0 = padding it added)."""

    def __init__(self, t_up: int, channels: int):
        super().__init__()
        self.t_up, self.channels = t_up, channels

    def forward(self, x):
        NT, _, H, W = x.shape
        idx = x[:, :1].repeat_interleave(self.t_up, 0)  # latent index (+1) per frame
        idx = (idx - 1) * self.t_up + torch.arange(self.t_up, dtype=x.dtype).repeat(NT)[:, None, None, None] + 1
        return (idx / 1000).expand(-1, self.channels, H, W).contiguous()


def kept_frames(model: nn.Module, n_latents: int, decode) -> list[int]:
    """The raw decoded frames (0-based; -1 = padding) that `decode` keeps for n_latents latents."""
    c_out = model.image_channels * model.patch_size**2
    saved = model.decoder
    model.decoder = nn.Sequential(IndexDecoder(model.t_upscale, c_out))
    try:
        z = (torch.arange(n_latents, dtype=torch.float64) + 1)[None, :, None, None, None]
        z = z.expand(1, n_latents, model.latent_channels, 1, 1)
        out = decode(z)
    finally:
        model.decoder = saved
    return [int(round(v * 1000)) - 1 for v in out[0, :, 0, 0, 0].tolist()]


def encoded_latents(model: nn.Module, n_frames: int, encode) -> int:
    side = 8 * model.patch_size
    with torch.no_grad():
        return encode(torch.rand(1, n_frames, 3, side, side)).shape[1]


def compact_json(data: dict) -> str:
    """JSON with every list of numbers on one line (a shape, the frames kept)."""
    text = json.dumps(data, indent=1)
    one_line = lambda m: "[" + ", ".join(v.strip() for v in m.group(1).split(",")) + "]"  # noqa: E731
    return re.sub(r"\[\s*(-?\d+(?:,\s*-?\d+)*)\s*\]", one_line, text)


def fixture_entry(U, stem: str) -> dict:
    m = upstream_by_name(U, stem).eval()
    up_decode = lambda z: m.decode_video(z, parallel=True, show_progress_bar=False)  # noqa: E731
    up_encode = lambda x: m.encode_video(x, parallel=True, show_progress_bar=False)  # noqa: E731
    return {
        "state_dict": {k: list(v.shape) for k, v in m.state_dict().items()},
        "latent_channels": m.latent_channels,
        "patch_size": m.patch_size,
        "t_downscale": m.t_downscale,
        "t_upscale": m.t_upscale,
        "decode_keeps": {str(n): kept_frames(m, n, up_decode) for n in LATENT_COUNTS},
        "encode_latents": {str(t): encoded_latents(m, t, up_encode) for t in FRAME_COUNTS},
    }


def config_for(family, arch: str):
    from taehv_launch.plan.schema import make_config

    return make_config(
        {
            "ref_vae_type": family.name,
            "decoder_arch": arch,
            "latent_channels": family.latent_channels,
            "patch_size": family.patch_size,
            "encoder_time_downscale": tuple(family.encoder_time_downscale),
            "decoder_time_upscale": tuple(family.decoder_time_upscale),
        }
    )


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_one(U, family, arch: str, tmp: Path) -> tuple[list[str], str]:
    """(failures, summary line) for one family and decoder."""
    from safetensors import safe_open

    from taehv_launch.rundir.checkpoint import TrainState
    from taehv_launch.train.durability.checkpoint import export_meta, export_model
    from taehv_launch.train.model.taehv import TAEHV, build_taehv

    bad: list[str] = []
    torch.manual_seed(0)
    ours = TAEHV.from_family(family, arch).double().eval()
    with torch.no_grad():  # biases too, so that every weight matters
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    cfg = config_for(family, arch)
    folder = tmp / f"{family.name}-{arch}" / "final_model"
    names = export_model(ours.state_dict(), folder, export_meta(cfg, TrainState(step=7), "final_model"))
    stem = family.export_stem(arch)
    if names != [f"{stem}.safetensors", f"{stem}.pth"]:
        bad.append(f"export names {names}, expected {stem}.safetensors/.pth")
    meta = json.loads((folder / "export.json").read_text())
    for name in names:
        if meta["files"][name]["sha256"] != sha256(folder / name):
            bad.append(f"export.json's SHA-256 of {name} is not the file's")
    with safe_open(str(folder / names[0]), "pt") as f:
        st_meta = f.metadata()
        twin_equal = all(torch.equal(f.get_tensor(k), v.float()) for k, v in ours.state_dict().items())
    want_meta = {"tae_latent_channels": str(family.latent_channels), "family": family.name, "decoder_arch": arch}
    want_meta["patch_size"] = str(family.patch_size)
    if any(st_meta.get(k) != v for k, v in want_meta.items()) or not twin_equal:
        bad.append(f"safetensors twin: metadata {st_meta} or tensors differ")

    up = U.TAEHV(checkpoint_path=str(folder / names[1])).double().eval()  # strict load_state_dict, by name
    ours = ours.float().double()  # the exported (float32) weights, as upstream got them
    diffs, frames = [], []
    with torch.no_grad():
        for n in LATENT_COUNTS:
            z = torch.randn(1, n, family.latent_channels, 2, 3, dtype=torch.float64)
            a = ours.decode_video(z)
            for parallel in (True, False) if n in (3, 4, 7) else (True,):
                b = up.decode_video(z.clone(), parallel=parallel, show_progress_bar=False)
                if a.shape != b.shape:
                    bad.append(f"decode of {n} latents: ours {tuple(a.shape)}, upstream {tuple(b.shape)}")
                    continue
                diffs.append(float((a - b).abs().max()) if a.numel() else 0.0)
            frames.append(f"{n}:{a.shape[1]}")
        enc_diffs, lat = [], []
        side = 8 * family.patch_size * 2
        for t in FRAME_COUNTS:
            x = torch.rand(1, t, 3, side, side, dtype=torch.float64)
            a, b = ours.encode_video(x), up.encode_video(x.clone(), parallel=True, show_progress_bar=False)
            if a.shape != b.shape:
                bad.append(f"encode of {t} frames: ours {tuple(a.shape)}, upstream {tuple(b.shape)}")
                continue
            enc_diffs.append(float((a - b).abs().max()))
            lat.append(f"{t}:{a.shape[1]}")
    worst, worst_enc = max(diffs, default=float("nan")), max(enc_diffs, default=float("nan"))
    if not worst <= TOL or not worst_enc <= TOL:
        bad.append(f"outputs differ: decode {worst:.2e}, encode {worst_enc:.2e} (tolerance {TOL:g})")

    release = tmp / "release" / f"{stem}.pth"  # upstream's own layout for the name, loaded back into ours
    release.parent.mkdir(exist_ok=True)
    torch.save(upstream_by_name(U, stem).state_dict(), release)
    back = build_taehv({**asdict(cfg), "pretrained_model_path": str(release)})
    if back.state_dict().keys() != ours.state_dict().keys():
        bad.append("upstream's layout does not load back into our port")
    line = (
        f"{family.name:10} {arch:5} {names[1]:20} upstream loads it strictly; decode max|diff| {worst:.1e} "
        f"(latents:frames {' '.join(frames)}); encode max|diff| {worst_enc:.1e} (frames:latents {' '.join(lat)}); "
        f"safetensors twin, metadata and SHA-256 ok; {stem}.pth of upstream's layout loads in ours"
    )
    return bad, line


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("upstream", help="path of upstream's taehv.py")
    ap.add_argument("--fixture", help="write the CI fixture (JSON) here")
    args = ap.parse_args()
    U = load_upstream(args.upstream)
    from taehv_launch.plan.families import FAMILIES

    torch.set_num_threads(1)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for family in FAMILIES.values():
            for arch in ("base", "super"):
                bad, line = check_one(U, family, arch, Path(tmp))
                print(f"FAIL {family.name} {arch}: {'; '.join(bad)}" if bad else f"ok   {line}")
                failures += bool(bad)
    if args.fixture:
        stems = sorted({f.export_stem(a) for f in FAMILIES.values() for a in ("base", "super")})
        data = {
            "upstream_taehv_py_sha256": sha256(Path(args.upstream)),
            "latent_counts": LATENT_COUNTS,
            "frame_counts": FRAME_COUNTS,
            "files": {s: fixture_entry(U, s) for s in stems},
        }
        Path(args.fixture).write_text(compact_json(data) + "\n")
        print(f"wrote {args.fixture} ({len(stems)} upstream file names)")
    print("all checks passed" if not failures else f"{failures} of {2 * len(FAMILIES)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
