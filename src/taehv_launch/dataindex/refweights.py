"""The reference VAE folder on disk, as both sides read it: where its config.json lives (the folder or
its vae/ subfolder, as diffusers' `from_pretrained(path, subfolder="vae")` expects), which files its
latents depend on, and their SHA-256 (the latent cache's fingerprint records it; a training run
from the cache checks it). Pure file reading: no torch, no diffusers."""

from __future__ import annotations

import hashlib
import os

from ..errors import ModelError


def model_dir(path: str) -> tuple[str, str | None]:
    """(folder holding config.json, subfolder arg for from_pretrained) or ModelError."""
    fix = "set ref_vae_path to a local diffusers folder (with vae/config.json or config.json)"
    if not path:
        raise ModelError(f"ref_vae_path is empty: {fix}, or set use_ref_vae=False")
    if not os.path.isdir(path):
        raise ModelError(f"reference VAE folder not found: {path}: {fix}")
    if os.path.isfile(os.path.join(path, "vae", "config.json")):
        return os.path.join(path, "vae"), "vae"
    if os.path.isfile(os.path.join(path, "config.json")):
        return path, None
    raise ModelError(f"no config.json in {path} or {path}/vae: {fix}")


def weight_files(path: str) -> list[str]:
    """config.json and the weight files of a reference VAE folder, sorted (what its latents depend on)."""
    folder, _ = model_dir(path)
    names = sorted(
        n
        for n in os.listdir(folder)
        if n == "config.json"
        or (n.startswith("diffusion_pytorch_model") and n.endswith((".safetensors", ".bin", ".json")))
    )
    return [os.path.join(folder, n) for n in names]


def weights_digest(ref_vae_path: str) -> str:
    """SHA-256 of the reference VAE folder's config.json and weight files (what its latents depend on)."""
    h = hashlib.sha256()
    for path in weight_files(ref_vae_path):
        h.update(os.path.basename(path).encode())
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                h.update(block)
    return h.hexdigest()
