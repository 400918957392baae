"""`taehv-launch bench`: measure one training step's time and peak memory, side by side.

Builds the real pieces (TAEHV, Seraena, a diffusers reference VAE with its real default
architecture and random weights) on this machine's accelerator and times them for several
micro-batch sizes in one run, so ratios are comparable. Absolute numbers only mean something
on the GPU they were measured on; the output says which GPU that was.
"""

from __future__ import annotations

import json
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
    latent_channels: int,
    device: torch.device,
    checkpointing: bool,
    seraena: bool,
    repeats: int = 3,
) -> dict[str, Any]:
    """TAEHV encode + decode + Seraena + backward + AdamW step on random data (no reference VAE)."""
    from ..train.model.taehv import TAEHV
    from ..train.model.seraena import VideoSeraena

    _peak_reset(device)
    model = TAEHV(latent_channels=latent_channels, gradient_checkpointing=checkpointing).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ser = (
        VideoSeraena(
            latent_channels, autocast_dtype=torch.bfloat16 if device.type == "cuda" else None, buffer_bytes=1 << 30
        ).to(device)
        if seraena
        else None
    )
    frames = torch.rand(micro, n_frames, 3, height, width, device=device)
    latents = torch.randn(micro, n_frames // 4, latent_channels, height // 8, width // 8, device=device)
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
    latent_channels: int = 16,
    as_json: bool = False,
) -> int:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    rows: list[dict[str, Any]] = []
    for micro in micros:
        for ckpt in (False, True):
            try:
                rows.append(time_train_step(micro, n_frames, height, width, latent_channels, device, ckpt, True))
            except torch.OutOfMemoryError:
                rows.append({"what": "TAEHV+Seraena train step", "micro": micro, "checkpointing": ckpt, "oom": True})
    if ref_vae_type:
        for chunk in chunks:
            rows.append(time_reference_encode(ref_vae_type, max(micros), chunk, n_frames, height, width, device))
    report = {
        "device": gpu,
        "height": height,
        "width": width,
        "n_frames": n_frames,
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "rows": rows,
    }
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print(f"bench on {gpu}, {n_frames} frames of {height}x{width}, torch {torch.__version__}")
        base = next((r for r in rows if not r.get("oom") and not r.get("checkpointing", False)), None)
        for r in rows:
            if r.get("oom"):
                print(f"  {r['what']:<32} micro {r['micro']:>2} ckpt {r['checkpointing']!s:<5}  out of memory")
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
