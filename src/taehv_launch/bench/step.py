"""`taehv-launch bench`: measure one training step's time and peak memory, side by side.

Builds the real pieces (TAEHV, Seraena, a diffusers reference VAE with its real default
architecture and random weights) on this machine's accelerator and times them for several
micro-batch sizes in one run, so ratios are comparable. Absolute numbers only mean something
on the GPU they were measured on; the output says which GPU that was.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None  # no GPU: not measured


def real_reference_vae(kind: str, device: torch.device, dtype: torch.dtype):
    """The diffusers class with the family's real architecture (the class default, or the record's
    real_config over it) and random weights, frozen as the trainer freezes the loaded one."""
    import diffusers

    from ..plan.families import get_family
    from ..train.reference.refvae import freeze

    family = get_family(kind)
    return freeze(getattr(diffusers, family.class_name)(**family.real_config).to(device, dtype), family)


def time_reference_encode(
    kind: str, micro: int, chunk: int, n_frames: int, height: int, width: int, device: torch.device, repeats: int = 2
) -> dict[str, Any]:
    from ..train.reference.refvae import ReferenceVAE

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    vae = real_reference_vae(kind, device, dtype)
    ref = ReferenceVAE(kind=kind, model=vae, dtype=dtype, device=device, chunk_size=chunk)
    frames = torch.rand(micro, n_frames, 3, height, width, device=device)
    ref.encode(frames[:1])  # warm-up (cuDNN autotune)
    _peak_reset(device)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        lat = ref.encode(frames)
    _sync(device)
    out = {
        "what": f"reference encode {kind}",
        "micro": micro,
        "chunk": chunk,
        "seconds": (time.perf_counter() - t0) / repeats,
        "peak_gib": _peak_gib(device),
        "latent_shape": list(lat.shape),
        "params_m": sum(p.numel() for p in vae.parameters()) / 1e6,
    }
    del vae, ref, frames, lat
    return out


def time_train_step(
    micro: int,
    n_frames: int,
    height: int,
    width: int,
    latent_channels: int | None,
    device: torch.device,
    checkpointing: bool,
    seraena: bool,
    repeats: int = 3,
    family: str = "cogvideox",
    decoder_arch: str = "base",
) -> dict[str, Any]:
    """TAEHV encode + decode + Seraena + backward + AdamW step on random data (no reference VAE), TAEHV of
    the family's released shape (patch size, time strides, its decode rule) with `decoder_arch`'s decoder;
    latent_channels None: the family's."""
    from ..plan.families import get_family
    from ..train.model.seraena import VideoSeraena
    from ..train.model.taehv import TAEHV

    fam = get_family(family)
    latent_channels = latent_channels or fam.latent_channels
    _peak_reset(device)
    model = (
        TAEHV.from_family(fam, decoder_arch, latent_channels=latent_channels, gradient_checkpointing=checkpointing)
        .to(device)
        .train()
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ser = (
        VideoSeraena(
            latent_channels, autocast_dtype=torch.bfloat16 if device.type == "cuda" else None, buffer_bytes=1 << 30
        ).to(device)
        if seraena
        else None
    )
    frames = torch.rand(micro, n_frames, 3, height, width, device=device)
    space = 8 * fam.patch_size
    latents = torch.randn(
        micro, fam.latent_frames(n_frames), latent_channels, height // space, width // space, device=device
    )
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def step():
        with autocast:
            enc = model.encode_video(frames)
            dec = model.decode_video(latents, clamp=False)
        dec = dec.float()
        target = frames[:, : dec.shape[1]]
        loss = F.mse_loss(dec, target) + F.mse_loss(enc.float(), latents)
        if ser is not None:
            corrected, _ = ser.step_and_make_targets(target, dec.detach().clamp(0, 1), latents)
            loss = loss + 0.3 * F.mse_loss(dec, corrected)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        step()
    _sync(device)
    out = {
        "what": "TAEHV+Seraena train step" if seraena else "TAEHV train step",
        "family": fam.name,
        "decoder_arch": decoder_arch,
        "micro": micro,
        "checkpointing": checkpointing,
        "seconds": (time.perf_counter() - t0) / repeats,
        "peak_gib": _peak_gib(device),
        "samples_per_s": micro * repeats / (time.perf_counter() - t0),
    }
    del model, opt, ser, frames, latents
    return out


def run(
    micros: list[int],
    height: int,
    width: int,
    n_frames: int,
    ref_vae_type: str | None,
    chunks: list[int],
    latent_channels: int | None = None,
    as_json: bool = False,
    decoder_arch: str = "base",
    checkpointing: tuple[bool, ...] = (False, True),
    encode_micros: list[int] | None = None,
    step: bool = True,
) -> int:
    """The step rows for every micro x checkpointing (TAEHV of ref_vae_type's family, cogvideox's shape when
    none is named), then the reference encode of encode_micros clips (default: the largest micro) per chunk.
    --json: the report on stdout, and each row on stderr as soon as it is measured."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    family = ref_vae_type or "cogvideox"
    rows: list[dict[str, Any]] = []

    def add(row: dict[str, Any]) -> None:
        rows.append(row)
        if as_json:  # as it comes, on stderr: a row measured before a crash or a time limit is kept
            print(f"bench row: {json.dumps(row)}", file=sys.stderr, flush=True)

    for micro in micros if step else []:
        for ckpt in checkpointing:
            try:
                add(
                    time_train_step(
                        micro,
                        n_frames,
                        height,
                        width,
                        latent_channels,
                        device,
                        ckpt,
                        True,
                        family=family,
                        decoder_arch=decoder_arch,
                    )  # fmt: skip
                )
            except torch.OutOfMemoryError:
                torch.cuda.empty_cache()
                add({"what": "TAEHV+Seraena train step", "family": family, "decoder_arch": decoder_arch,
                     "micro": micro, "checkpointing": ckpt, "oom": True})  # fmt: skip
    if ref_vae_type:
        for chunk in chunks:
            for micro in [m for m in encode_micros or [max(micros)] if m > 0]:
                try:
                    add(time_reference_encode(ref_vae_type, micro, chunk, n_frames, height, width, device))
                except torch.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    add({"what": f"reference encode {ref_vae_type}", "micro": micro, "chunk": chunk, "oom": True})
    report = {
        "device": gpu,
        "height": height,
        "width": width,
        "n_frames": n_frames,
        "family": family,
        "decoder_arch": decoder_arch,
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "rows": rows,
    }
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print(
            f"bench on {gpu}, {n_frames} frames of {height}x{width}, TAEHV for {family} ({decoder_arch} decoder), "
            f"torch {torch.__version__}"
        )
        base = next((r for r in rows if not r.get("oom") and not r.get("checkpointing", False)), None)
        for r in rows:
            if r.get("oom"):
                extra = f"ckpt {r['checkpointing']!s:<5}" if "checkpointing" in r else f"chunk {r['chunk']:>2}   "
                print(f"  {r['what']:<32} micro {r['micro']:>2} {extra}  out of memory")
                continue
            extra = f"ckpt {r['checkpointing']!s:<5}" if "checkpointing" in r else f"chunk {r['chunk']:>2}   "
            ratio = (
                f"{r['seconds'] / base['seconds'] * base['micro'] / r['micro']:.2f}x per sample vs first row"
                if base and "checkpointing" in r
                else ""
            )
            peak = "" if r["peak_gib"] is None else f"peak {r['peak_gib']:6.2f} GiB  "
            print(f"  {r['what']:<32} micro {r['micro']:>2} {extra} {r['seconds'] * 1000:9.1f} ms  {peak}{ratio}")
    return 0
