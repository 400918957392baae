"""The measurement of `taehv-launch eval`: the held-out clips of a data root (the trainer's own split,
dataindex/index.py split_train_val, and its validation clips: the centre clip of each held-out video),
then for each weights file the decoder on the reference VAE's latents (when one is given) and the whole
model end to end, as PSNR, SSIM, LPIPS (when available) and flicker (train/loop/metrics.py's
clip_scores, which validation during training uses too) and decode frames/s. One row per weights file;
--json gives the same numbers."""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DataError, ModelError
from .weights import Weights, describe, load_model


@dataclass
class Options:
    weights: list[str]
    data_root: str
    height: int
    width: int
    n_frames: int | None  # None: the family's default
    max_clips: int = 8
    family: str | None = None
    decoder_arch: str | None = None
    ref_vae_path: str = ""
    validation_fraction: float = 0.05
    seed: int = 42
    device: str = "auto"
    as_json: bool = False
    notes: list[str] = field(default_factory=list)


def check_shapes(ws: list[Weights], o: Options) -> int:
    """n_frames for every file; ModelError in one line for a clip shape one of them cannot take."""
    n = o.n_frames or ws[0].family.default_n_frames
    for w in ws:
        step = 8 * w.patch_size
        if o.height % step or o.width % step:
            raise ModelError(
                f"{w.arg} ({w.label}, patch {w.patch_size}) takes frames whose sides are multiples of {step}, "
                f"not {o.height}x{o.width}: pass --height/--width multiples of {step}"
            )
        fam = w.family
        if not fam.valid_n_frames(n, group=1):  # the family's frame rule (eval has no Seraena groups)
            near = fam.first_valid(3, 1, start=n - 2 * fam.spacing(1))
            raise ModelError(
                f"{w.arg} ({w.label}) takes clips of {fam.frame_rule()}, not {n} frame{'s' if n != 1 else ''}: pass --n-frames "
                f"{', '.join(map(str, near[:-1]))} or {near[-1]}"
            )
    return n


def held_out_clips(o: Options, n_frames: int) -> list[Any]:
    """The validation clips (uint8 TCHW tensors) of o.data_root, as the trainer picks them."""
    from ..dataindex.index import build_index, split_train_val
    from ..train.data.clips import VideoClipDataset
    from ..train.data.probe import usable_entries

    entries = build_index(o.data_root)
    train_e, val_e = split_train_val(entries, o.validation_fraction, 64, o.seed)
    chosen = usable_entries(val_e, n_frames)
    if not chosen:  # as the trainer: validate on a usable training video when no held-out one is
        chosen = usable_entries(train_e[: min(len(train_e), 32)], n_frames)[:1]
        if chosen:
            o.notes.append(f"no usable held-out video: measuring on training video {chosen[0].path}")
    if not chosen:
        raise DataError(
            f"no video under {o.data_root} gives {n_frames} frames of at least a few pixels a side: "
            f"pass --n-frames smaller, or a folder of longer videos"
        )
    ds = VideoClipDataset(chosen, height=o.height, width=o.width, n_frames=n_frames, train=False)
    return [ds[i]["frames"] for i in range(min(len(ds), o.max_clips))]


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reference(o: Options, w: Weights, device) -> Any:
    """The reference VAE of --ref-vae-path for weights `w`, or ModelError in one line that says what to
    pass to eval (the loader's own messages speak of the trainer's keys)."""
    from ..dataindex.refweights import model_dir
    from ..plan.families import family_of_config
    from ..train.reference.refvae import load_reference_vae

    path, fam = o.ref_vae_path, w.family
    want = f"pass --ref-vae-path the local diffusers folder of the {fam.name} VAE ({fam.models}) the weights decode"
    try:
        folder, _ = model_dir(path)
    except ModelError:
        raise ModelError(
            f"--ref-vae-path {path}: no such folder, or no config.json in it or in its vae/: {want}"
        ) from None
    try:
        config = json.loads(Path(folder, "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(
            f"--ref-vae-path {path}: cannot read {folder}/config.json ({type(exc).__name__}): {want}"
        ) from None
    if not isinstance(config, dict):
        config = {}
    found = config.get("_class_name")
    if found and (found != fam.class_name or any(config.get(k) != v for k, v in fam.config_marks.items())):
        other = family_of_config(config)
        what = f"a {other.name} VAE" if other is not None else f"an {found}"
        raise ModelError(f"--ref-vae-path {path} holds {what} but {w.arg} holds {w.label} weights: {want}")
    ref = load_reference_vae(fam.name, path, device=device)
    if ref.latent_channels != w.latent_channels:
        raise ModelError(
            f"--ref-vae-path {path} gives {ref.latent_channels} latent channels but {w.arg} decodes "
            f"{w.latent_channels}: {want}"
        )
    return ref


def run(o: Options) -> int:
    import torch

    from ..train.loop.metrics import clip_scores, load_lpips, mean_scores
    from ..train.model.losses import decoder_targets

    ws = [describe(a, o.family, o.decoder_arch) for a in o.weights]
    fams = {w.family.name for w in ws}
    if len(fams) > 1:
        first, other = ws[0], next(w for w in ws if w.family.name != ws[0].family.name)
        raise ModelError(
            f"{other.arg} holds {other.family.name} weights but {first.arg} holds {first.family.name} weights: "
            f"eval compares weights of one family on one reference's latents; run eval once per family"
        )
    n_frames = check_shapes(ws, o)
    device = torch.device(o.device if o.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    ref = None
    if o.ref_vae_path:
        ref = reference(o, ws[0], device)
    else:
        o.notes.append("no --ref-vae-path: the decoder on the reference latents is not measured (end to end only)")
    clips = held_out_clips(o, n_frames)
    lpips_fn, why = load_lpips(device)
    if why:
        o.notes.append(why)
    from tqdm import tqdm

    bar = tqdm(total=len(ws) * len(clips), desc="eval", unit="clip", file=sys.stderr, disable=o.as_json or None)
    ref_latents: list[Any] = []
    results = []
    with torch.no_grad():
        for w in ws:
            model = load_model(w, device)
            dec_rows, e2e_rows, frames_out, seconds = [], [], 0, 0.0
            for i, clip in enumerate(clips):
                frames = clip[None].to(device).float().div_(255.0)
                if ref is not None:
                    if len(ref_latents) <= i:
                        ref_latents.append(ref.encode(frames).float())
                    _sync(device)
                    t0 = time.perf_counter()
                    dec = model.decode_video(ref_latents[i])
                    _sync(device)
                    seconds += time.perf_counter() - t0
                    frames_out += dec.shape[1]
                    dec_rows.append(clip_scores(dec, decoder_targets(frames, dec), lpips_fn))
                latents = model.encode_video(frames)
                _sync(device)
                t0 = time.perf_counter()
                dec = model.decode_video(latents)
                _sync(device)
                if ref is None:
                    seconds += time.perf_counter() - t0
                    frames_out += dec.shape[1]
                e2e_rows.append(clip_scores(dec, decoder_targets(frames, dec), lpips_fn))
                bar.update(1)
            results.append(
                {
                    "weights": w.arg,
                    "file": w.path,
                    "family": w.family.name,
                    "decoder_arch": w.decoder_arch,
                    "decoder": mean_scores(dec_rows) if dec_rows else None,
                    "end_to_end": mean_scores(e2e_rows),
                    "decode_fps": frames_out / seconds if seconds > 0 else None,
                }
            )
            del model
    bar.close()
    report = {
        "data_root": o.data_root,
        "clips": len(clips),
        "height": o.height,
        "width": o.width,
        "n_frames": n_frames,
        "device": str(device),
        "notes": o.notes,
        "results": results,
    }
    print(json.dumps(report, indent=2) if o.as_json else table(report))
    return 0


def _fmt(v: float | None, digits: int) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def table(report: dict) -> str:
    head = ["weights", "family", "part", "PSNR dB", "SSIM", "LPIPS", "flicker", "decode fr/s"]
    rows = []
    for r in report["results"]:
        for part in ("decoder", "end_to_end"):
            m = r[part]
            if m is None:
                continue
            rows.append(
                [
                    r["weights"],
                    f"{r['family']}/{r['decoder_arch']}",
                    part.replace("_", " "),
                    _fmt(m["psnr"], 2),
                    _fmt(m["ssim"], 4),
                    _fmt(m["lpips"], 4),
                    _fmt(m["flicker"], 4),
                    _fmt(r["decode_fps"], 1) if part == ("decoder" if r["decoder"] else "end_to_end") else "",
                ]
            )
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    lines = [
        f"{report['clips']} held-out clip(s) of {report['data_root']}, {report['n_frames']}x"
        f"{report['height']}x{report['width']}, on {report['device']}",
        "  ".join(h.ljust(n) for h, n in zip(head, widths)),
        *("  ".join(str(c).ljust(n) for c, n in zip(row, widths)) for row in rows),
        *(f"note: {n}" for n in report["notes"]),
    ]
    return "\n".join(line.rstrip() for line in lines)
