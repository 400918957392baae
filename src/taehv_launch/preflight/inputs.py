"""validate-env's checks of the run's inputs: the data (index, sampled decodes, the decoder) and the models
(reference VAE, pretrained TAEHV)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from ..errors import UserError
from ..plan.resolve import Plan
from .base import FAIL, PASS, WARN, Check


# ---------------------------------------------------------------- data
def _demo_asset(plan: Plan, which: int) -> str | None:
    """For the cpu demo's data (0) or reference VAE (1): where it is, or will be made by the first
    run (not a failure); None when the config names other assets."""
    path = plan.demo_assets[which]
    if not path or (plan.config["data_root"], plan.config["ref_vae_path"])[which] != path:
        return None
    return (
        f"present in {path}" if (Path(path) / ".complete").is_file() else f"will be created in {path} by the first run"
    )


def check_data(plan: Plan, quick: bool) -> list[Check]:
    from .decoder import check_decoder

    c = plan.config
    if not c["data_root"]:
        return [Check("data", FAIL, "data_root is not set", "--set data_root=/path/to/videos")]
    if demo := _demo_asset(plan, 0):
        return [Check("data", PASS, "built-in synthetic demo set: " + demo), check_decoder(plan, None)]
    from ..train.data.clips import VideoClipDataset
    from ..dataindex.index import build_index

    with tempfile.TemporaryDirectory() as cache:
        try:
            entries = build_index(c["data_root"], c["annotation_file"], cache)
        except UserError as err:
            return [Check("data", FAIL, str(err), "fix data_root / annotation_file")]
    out = [
        Check(
            "data index",
            PASS,
            f"{len(entries)} videos under {c['data_root']}"
            + (f" ({entries.missing} annotation paths missing)" if getattr(entries, "missing", 0) else ""),
        )
    ]
    sample = entries[:: max(1, len(entries) // (3 if quick else 8))][: 3 if quick else 8]
    broken = []
    for e in sample:
        ds = VideoClipDataset(
            [e], c["height"], c["width"], c["n_frames"], c["min_frame_delta"], c["max_frame_delta"], train=False
        )
        try:
            item = ds[0]
            if item["skipped"]:
                broken.append(e.path)
        except UserError:
            broken.append(e.path)
    share = len(broken) / max(1, len(sample))
    status = PASS if share == 0 else FAIL if share == 1 else WARN
    out.append(
        Check(
            "data decode",
            status,
            f"{len(sample) - len(broken)}/{len(sample)} sampled videos decode to "
            f"{c['n_frames']}x{c['height']}x{c['width']}" + (f"; broken e.g. {broken[0]}" if broken else ""),
            "" if status == PASS else "broken files are skipped during training; remove them or fix the paths",
        )
    )
    good = [e.path for e in sample if e.path not in broken]
    return out + [check_decoder(plan, good[0] if good else None)]


# ---------------------------------------------------------------- models
def check_models(plan: Plan, quick: bool) -> list[Check]:
    c, out = plan.config, []
    if c["latent_cache"] and c["latent_cache_encode"] == "never":  # settle() checked the cache's manifest
        out.append(Check("reference VAE", PASS, f"not loaded: the latent cache {c['latent_cache']} holds its latents"))
    elif c["use_ref_vae"]:
        if not c["ref_vae_path"]:
            out.append(Check("reference VAE", FAIL, "ref_vae_path is not set", "--set ref_vae_path=/path/to/vae"))
        elif demo := _demo_asset(plan, 1):
            out.append(Check("reference VAE", PASS, f"built-in tiny {c['ref_vae_type']} VAE: " + demo))
        else:
            out.append(_check_ref_vae(c, quick))
    if c["pretrained_model_path"]:
        from ..train.model.taehv import build_taehv

        try:
            build_taehv(c)
            out.append(Check("pretrained TAEHV", PASS, f"{c['pretrained_model_path']} loads with matching keys"))
        except UserError as err:
            out.append(Check("pretrained TAEHV", FAIL, str(err), "fix pretrained_model_path or the model keys"))
    return out


def _check_ref_vae(c: dict, quick: bool) -> Check:
    import torch

    from ..train.reference.refvae import ChannelMismatch, load_reference_vae

    try:
        t0 = time.perf_counter()
        ref = load_reference_vae(
            c["ref_vae_type"],
            c["ref_vae_path"],
            dtype=torch.float32,
            device="cpu",
            expect_channels=c["latent_channels"],
        )
        if quick:
            return Check("reference VAE", PASS, f"{c['ref_vae_type']} loads ({ref.latent_channels} latent channels)")
        lat = ref.encode(torch.rand(1, 12, 3, 64, 64))
        return Check(
            "reference VAE",
            PASS,
            f"{c['ref_vae_type']} loads and encodes 12x64x64 -> {tuple(lat.shape)} in {time.perf_counter() - t0:.1f} s",
        )
    except ChannelMismatch as err:
        return Check("reference VAE", FAIL, str(err), f"--set latent_channels={err.channels}")
    except UserError as err:
        return Check("reference VAE", FAIL, str(err), "fix ref_vae_path / ref_vae_type")
