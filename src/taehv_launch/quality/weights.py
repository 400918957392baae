"""What each argument of `taehv-launch eval` is: an upstream release or one of our exports (a .pth or
.safetensors file, or an export folder such as final_model/), or a checkpoint folder (checkpoint-N: its
EMA weights, ema.safetensors, and the config in trainer_state.json). The family and decoder come from the
file (rundir/taehvfile.py: metadata, export.json, upstream's stem in the name; a checkpoint's config),
or from --family / --decoder-arch, which override."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ModelError
from ..plan.families import FAMILIES, get_family
from ..rundir import taehvfile
from ..rundir.checkpoint import EMA_FILE, STATE_FILE
from ..rundir.layout import EXPORT_META, export_weights


@dataclass(frozen=True)
class Weights:
    arg: str  # what the user wrote
    path: str  # the weight file read
    family: Any  # plan/family.py Family
    decoder_arch: str
    latent_channels: int
    patch_size: int
    encoder_time_downscale: tuple[bool, ...]
    decoder_time_upscale: tuple[bool, ...]

    @property
    def label(self) -> str:
        return f"{self.family.name}/{self.decoder_arch}"


def _checkpoint_config(folder: Path) -> dict:
    try:
        state = json.loads((folder / STATE_FILE).read_text())
        config = state.get("config") if isinstance(state, dict) else None
    except (OSError, ValueError) as exc:
        raise ModelError(
            f"cannot read {folder / STATE_FILE} ({type(exc).__name__}): is {folder} a complete checkpoint?"
        ) from None
    return config if isinstance(config, dict) else {}


def weight_file(arg: str) -> tuple[str, dict]:
    """(the weight file, the checkpoint's config or {}) for a file, an export folder or a checkpoint."""
    p = Path(arg).expanduser()
    if p.is_dir():
        if (p / EMA_FILE).is_file() and (p / STATE_FILE).is_file():
            return str(p / EMA_FILE), _checkpoint_config(p)
        if (p / EXPORT_META).is_file() and export_weights(p).is_file():
            return str(export_weights(p)), {}
        raise ModelError(
            f"{arg} is a folder but neither a checkpoint ({EMA_FILE} + {STATE_FILE}) nor an export "
            f"({EXPORT_META} + its weights): pass a .pth/.safetensors file, an export or a checkpoint-N folder"
        )
    if not p.is_file():
        raise ModelError(f"TAEHV weights not found: {arg}; pass an existing .pth/.safetensors file or folder")
    return str(p), {}


def describe(arg: str, family_flag: str | None, arch_flag: str | None) -> Weights:
    """The family, decoder and shape of the weights at `arg` (ModelError in one line when unknown)."""
    path, config = weight_file(arg)
    stems = taehvfile.stems_of(FAMILIES.values())
    facts = taehvfile.read_facts(path, stems)
    fam_name = family_flag or (facts.family if facts else None) or config.get("ref_vae_type")
    if not fam_name:
        raise ModelError(
            f"cannot tell which family {arg} is for (no metadata, export.json or upstream name such as "
            f"taecvx/taew2_1 in it): pass --family NAME ({', '.join(FAMILIES)})"
        )
    family = get_family(str(fam_name))
    if facts is not None and facts.family and family_flag and facts.family != family.name:
        raise ModelError(
            f"{arg} holds {facts.describe()}, not {family.name} weights: drop --family, or evaluate it on its own"
        )
    arch = arch_flag or (facts.decoder_arch if facts else None) or config.get("decoder_arch") or "base"
    if arch not in ("base", "super"):
        raise ModelError(f"{arg} has a decoder of neither upstream layout (base, super): not a TAEHV file?")

    def pick(key: str, fact: Any, default: Any) -> Any:
        return fact if fact is not None else config.get(key, default)

    up = facts.decoder_time_upscale if facts else None
    return Weights(
        arg=arg,
        path=path,
        family=family,
        decoder_arch=str(arch),
        latent_channels=int(pick("latent_channels", facts.latent_channels if facts else None, family.latent_channels)),
        patch_size=int(pick("patch_size", facts.patch_size if facts else None, family.patch_size)),
        encoder_time_downscale=tuple(
            bool(v) for v in config.get("encoder_time_downscale", family.encoder_time_downscale)
        ),
        decoder_time_upscale=tuple(
            bool(v) for v in (up or config.get("decoder_time_upscale", family.decoder_time_upscale))
        ),
    )


def load_model(w: Weights, device: Any):
    """The TAEHV of `w`'s shape with its weights, strictly loaded, in eval mode on `device`."""
    from ..train.model.taehv import TAEHV
    from ..train.model.weights import load_taehv_state_dict

    model = TAEHV.from_family(
        w.family,
        decoder_arch=w.decoder_arch,
        latent_channels=w.latent_channels,
        patch_size=w.patch_size,
        encoder_time_downscale=w.encoder_time_downscale,
        decoder_time_upscale=w.decoder_time_upscale,
    )
    load_taehv_state_dict(model, w.path, w.family, FAMILIES)
    return model.to(device).eval()
