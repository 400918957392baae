"""The measurement of `taehv-launch eval`: the held-out clips of a data root (the trainer's own split,
dataindex/index.py split_train_val, and its validation clips: the centre clip of each held-out video),
then for each weights file the decoder on the reference VAE's latents (when one is given) and the whole
model end to end, as PSNR, SSIM, LPIPS (when available), flicker (train/loop/metrics.py) and decode
frames/s. One row per weights file; --json gives the same numbers."""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import DataError, ModelError
from .weights import Weights, describe, load_model

METRICS = ("psnr", "ssim", "lpips", "flicker")


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
        try:
            w.family.check_n_frames(n, group=1)
        except Exception as exc:  # the family's own one-line rule
            raise ModelError(f"{w.arg} ({w.label}): {exc}") from None
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


def scores(dec, target, lpips_fn) -> dict[str, float]:
    from ..train.loop.metrics import flicker, psnr, ssim

    return {
        "psnr": psnr(dec, target),
        "ssim": ssim(dec, target),
        "lpips": lpips_fn(dec, target) if lpips_fn else None,
        "flicker": flicker(dec, target),
    }


def mean(rows: list[dict]) -> dict[str, float | None]:
    return {k: (sum(r[k] for r in rows) / len(rows) if rows and rows[0][k] is not None else None) for k in METRICS}


def run(o: Options) -> int:
    import torch

    from ..train.loop.metrics import load_lpips
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
        from ..train.reference.refvae import load_reference_vae

        ref = load_reference_vae(
            ws[0].family.name, o.ref_vae_path, device=device, expect_channels=ws[0].latent_channels
        )
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
                    dec_rows.append(scores(dec, decoder_targets(frames, dec), lpips_fn))
                latents = model.encode_video(frames)
                _sync(device)
                t0 = time.perf_counter()
                dec = model.decode_video(latents)
                _sync(device)
                if ref is None:
                    seconds += time.perf_counter() - t0
                    frames_out += dec.shape[1]
                e2e_rows.append(scores(dec, decoder_targets(frames, dec), lpips_fn))
                bar.update(1)
            results.append(
                {
                    "weights": w.arg,
                    "file": w.path,
                    "family": w.family.name,
                    "decoder_arch": w.decoder_arch,
                    "decoder": mean(dec_rows) if dec_rows else None,
                    "end_to_end": mean(e2e_rows),
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
