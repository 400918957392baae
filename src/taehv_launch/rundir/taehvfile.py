"""TAEHV weight files, upstream's and ours: what a file is for, read without torch.

Upstream madebyollin/taehv picks a file's shape and decode rule from its name (`taecvx` -> CogVideoX's
decode, `taew2_2` -> patch 2 and 48 channels, `taeltx` -> 8x in time, `_super` -> the Super decoder), so
our exports carry upstream's names (`<stem>.pth` and its `.safetensors` twin, plan/families.py
`export_stem`) and the twin's metadata says the rest (META_*: ComfyUI reads `tae_latent_channels`).
This module reads those facts back from any TAEHV file: the safetensors header, or the pickle of a
torch .pth read with stand-ins that build nothing. The launcher uses it to refuse a pretrained file of
another family or decoder before it writes anything; the trainer's strict load (train/model/weights.py)
gives the same line. Families reach it as arguments (duck-typed `Family` records): no plan import here.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import struct
import zipfile
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..errors import ModelError
from .layout import EXPORT_META, LEGACY_PTH, LEGACY_SAFETENSORS

# safetensors metadata of our exports (all values are strings, as the format wants)
META_FORMAT = "taehv_launch_export"  # EXPORT_FORMAT ("format" stays safetensors' usual "pt")
META_CHANNELS = "tae_latent_channels"  # ComfyUI's key for a TAE's latent channel count
META_FAMILY = "family"  # our ref_vae_type (exports before #36 wrote only "ref_vae_type")
META_ARCH = "decoder_arch"  # "base" or "super"
META_PATCH = "patch_size"
META_STEM = "upstream_name"  # the upstream file stem, e.g. "taecvx_super"
EXPORT_FORMAT = "taehv-launch export 1"

ENCODER_TPOOLS = (2, 7, 12)  # encoder indices of the TPool layers (blocks.encoder)
DECODER_TGROWS = {"base": (7, 13, 19), "super": (7, 14, 21)}  # blocks.base_decoder / super_decoder
DECODER_WIDTH = {"base": ("decoder.1.weight", 256), "super": ("decoder.0.weight", 512)}  # first conv, out


@dataclass(frozen=True)
class Facts:
    """What a TAEHV weight file is: read from its tensors' shapes, and the family it says it is for."""

    path: str
    latent_channels: int | None
    patch_size: int | None
    decoder_arch: str | None  # "base", "super", "other" (a TAEHV decoder of neither layout), None: no decoder
    time_stride: int | None  # the encoder's: 2 ** (TPools of stride 2)
    decoder_time_upscale: tuple[bool, ...] | None
    family: str | None = None  # the family its metadata, export.json or name gives
    named_by: str = ""  # "its metadata", "its export.json", "its name (taecvx)"
    legacy_export: bool = False  # one of our exports from before #36 (trained on raw latents)

    def describe(self) -> str:
        parts = [
            f"patch {self.patch_size}" if self.patch_size else "",
            f"{self.latent_channels} latent channels" if self.latent_channels else "",
            {"base": "base decoder", "super": "super decoder", "other": "a decoder of another layout"}.get(
                self.decoder_arch or "", ""
            ),
            f"{self.time_stride}x in time" if self.time_stride else "",
        ]
        what = ", ".join(p for p in parts if p)
        return (
            f"{self.family} weights ({what}; the family from {self.named_by})"
            if self.family
            else f"TAEHV weights ({what})"
        )


@dataclass(frozen=True)
class Wanted:
    """What the run builds: the family (its name and export stem) and TAEHV's shape."""

    family: str
    stem: str
    latent_channels: int
    patch_size: int
    decoder_arch: str
    time_stride: int
    decoder_time_upscale: tuple[bool, ...]

    def describe(self) -> str:
        return (
            f"{self.family} (upstream {self.stem}: patch {self.patch_size}, {self.latent_channels} latent "
            f"channels, {self.decoder_arch} decoder, {self.time_stride}x in time)"
        )


class _NotUnderstood(Exception):
    """A .pth this reader cannot follow (old torch format, objects besides tensors): torch decides."""


class _Shape(tuple):
    pass


class _Unpickler(pickle.Unpickler):
    """Reads a torch zip .pth's data.pkl: tensors become their shapes, storages are never read, and
    any class but the few a state dict pickles is refused (nothing is built)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if module == "torch" and name.endswith("Storage"):
            return name
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda _storage, _offset, size, *_rest: _Shape(size)
        if (module, name) in (
            ("torch._utils", "_rebuild_parameter"),
            ("torch._utils", "_rebuild_parameter_with_state"),
        ):
            return lambda data, *_rest: data
        raise _NotUnderstood(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> None:
        return None


def _pth_shapes(path: str) -> dict[str, tuple[int, ...]]:
    try:
        with zipfile.ZipFile(path) as z:
            names = [n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            if len(names) != 1:
                raise _NotUnderstood("no single data.pkl")
            sd = _Unpickler(z.open(names[0])).load()
    except (zipfile.BadZipFile, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise _NotUnderstood(str(exc)) from None
    if not isinstance(sd, Mapping) or not all(isinstance(v, _Shape) for v in sd.values()):
        raise _NotUnderstood("not a flat state dict")
    return {str(k): tuple(v) for k, v in sd.items()}


def _safetensors_header(path: str) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """(name -> shape, metadata) from the JSON header; ModelError when it is not one."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100 << 20 or n > os.fstat(f.fileno()).st_size - 8:
                raise _NotUnderstood(f"header length {n} is past the file's end")
            header = json.loads(f.read(n))
        meta = header.pop("__metadata__", None) or {}
        shapes = {k: tuple(int(d) for d in v["shape"]) for k, v in header.items()}
        if not isinstance(meta, dict):
            raise _NotUnderstood("__metadata__ is not an object")
    except (OSError, ValueError, struct.error, KeyError, TypeError, AttributeError, _NotUnderstood) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ModelError(
            f"cannot read TAEHV weights {path} ({reason}); expected a state dict saved as .pth or .safetensors"
        ) from None
    return shapes, {str(k): str(v) for k, v in meta.items()}


def shape_facts(shapes: Mapping[str, tuple[int, ...]], path: str = "") -> Facts:
    """The TAEHV settings a state dict's shapes imply (None where the keys are not there)."""
    enc0 = shapes.get("encoder.0.weight")
    patch = math.isqrt(enc0[1] // 3) if enc0 and len(enc0) == 4 else None
    arch = channels = None
    for name, (key, width) in DECODER_WIDTH.items():
        w = shapes.get(key)
        if w and len(w) == 4:
            arch, channels = (name if w[0] == width else "other"), w[1]
            break
    if channels is None and (last := shapes.get("encoder.17.weight")):
        channels = last[0]
    pools = [shapes.get(f"encoder.{i}.conv.weight") for i in ENCODER_TPOOLS]
    stride = 2 ** sum(p[1] == 2 * p[0] for p in pools) if all(p and len(p) == 4 for p in pools) else None
    grows = [shapes.get(f"decoder.{i}.conv.weight") for i in DECODER_TGROWS.get(arch or "", ())]
    up = tuple(g[0] == 2 * g[1] for g in grows) if grows and all(g and len(g) == 4 for g in grows) else None
    return Facts(path, channels, patch, arch, stride, up)


def family_by_name(path: str, stems: Mapping[str, str]) -> tuple[str | None, str]:
    """(family, stem) from the file name as upstream reads it: the longest known stem in it."""
    name = os.path.basename(path).lower()
    found = [s for s in stems if s in name]
    stem = max(found, key=len) if found else None
    return (stems[stem] if stem else None), stem or ""


def _export_json(path: str) -> dict | None:
    """The export.json beside one of our exports when it describes this file: it lists the file (exports
    since #36), or the file has the name every export had before (taehv.pth, whatever the family)."""
    meta_file = Path(path).parent / EXPORT_META
    try:
        meta = json.loads(meta_file.read_text()) if meta_file.stat().st_size < 1 << 20 else None
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict):
        return None
    listed = isinstance(meta.get("files"), dict) and os.path.basename(path) in meta["files"]
    legacy = os.path.basename(path) in (LEGACY_PTH, LEGACY_SAFETENSORS) and "files" not in meta
    return meta if listed or legacy else None


def _known(value: Any, stems: Mapping[str, str]) -> str | None:
    """A family name from a record: a name, or an upstream stem (None for anything else)."""
    return value if value in stems.values() else stems.get(value) if isinstance(value, str) else None


def read_facts(path: str, stems: Mapping[str, str]) -> Facts | None:
    """Facts of the file at `path`; stems: upstream file stem (and stem-like alias) -> family name.
    ModelError when it is missing or not a safetensors file it claims to be; None for a .pth this
    reader cannot follow (the trainer's torch load then decides)."""
    if not os.path.isfile(path):
        raise ModelError(
            f"TAEHV weights not found: {path}; set pretrained_model_path to an existing "
            f".pth/.safetensors file, or to '' to train from scratch"
        )
    meta: dict[str, str] = {}
    if path.endswith(".safetensors"):
        shapes, meta = _safetensors_header(path)
    else:
        try:
            shapes = _pth_shapes(path)
        except _NotUnderstood:
            return None
    facts = shape_facts(shapes, path)
    family, how = _known(meta.get(META_FAMILY) or meta.get("ref_vae_type"), stems), "its metadata"
    legacy = bool(meta) and "ref_vae_type" in meta and META_FORMAT not in meta
    if not family and (export := _export_json(path)) and isinstance(export.get("ref_vae_type"), str):
        family, how, legacy = (
            _known(export.get("family") or export["ref_vae_type"], stems),
            f"its {EXPORT_META}",
            "files" not in export,
        )
    if not family:
        family, stem = family_by_name(path, stems)
        how = f"its name ({stem})"
    return replace(facts, family=family, named_by=how if family else "", legacy_export=legacy)


def problem(facts: Facts, want: Wanted) -> str | None:
    """One line when the file cannot start this run (another family, decoder or shape), else None."""
    fam_differs = facts.family is not None and facts.family != want.family
    arch_differs = facts.decoder_arch is not None and facts.decoder_arch != want.decoder_arch
    shape_differs = [
        k
        for k, have, need in (
            ("patch_size", facts.patch_size, want.patch_size),
            ("latent_channels", facts.latent_channels, want.latent_channels),
            ("time stride", facts.time_stride, want.time_stride),
        )
        if have is not None and have != need
    ]
    up = facts.decoder_time_upscale
    if up is not None and not arch_differs and any(w and not h for h, w in zip(up, want.decoder_time_upscale)):
        shape_differs.append("decoder_time_upscale")
    if not (fam_differs or arch_differs or shape_differs):
        return None
    arch = facts.decoder_arch if facts.decoder_arch in ("base", "super") else None
    if fam_differs:
        fix = f"use the {want.stem} weights, or set --set ref_vae_type={facts.family}"
        fix += f" --set decoder_arch={arch}" if arch_differs and arch else ""
        if facts.named_by == "its name (taehv)":
            fix += (
                f" (taehv-launch exports before #36 were all named taehv.pth/.safetensors: if this file "
                f"holds {want.family} weights, rename it to {want.stem}{Path(facts.path).suffix})"
            )
    elif arch_differs and arch and not shape_differs:
        fix = f"set --set decoder_arch={arch}, or use the {want.stem} weights"
    elif arch_differs and not arch:
        fix = f"use the {want.stem} weights (upstream's {want.decoder_arch} decoder)"
    else:
        fix = f"use the {want.stem} weights, or set {'/'.join(shape_differs)} to match the file"
    return f"pretrained_model_path {facts.path} holds {facts.describe()}, but this run trains {want.describe()}: {fix}"


def stems_of(families: Iterable[Any]) -> dict[str, str]:
    """Upstream file stem (and each stem-like alias) -> family name, for reading a file's name."""
    out: dict[str, str] = {}
    for f in families:
        for stem in (f.upstream, *f.aliases):
            if stem and stem.startswith("tae"):
                out[stem] = f.name
    return out


def wanted_for(family: Any, config: Mapping[str, Any]) -> Wanted:
    """What a pretrained file must be for a run of this family and config (the plan's dict)."""
    arch = str(config.get("decoder_arch") or "base")
    return Wanted(
        family=family.name,
        stem=family.export_stem(arch),
        latent_channels=int(config["latent_channels"]),
        patch_size=int(config["patch_size"]),
        decoder_arch=arch,
        time_stride=2 ** sum(bool(v) for v in config["encoder_time_downscale"]),
        decoder_time_upscale=tuple(bool(v) for v in config["decoder_time_upscale"]),
    )


def check_pretrained(config: Mapping[str, Any], family: Any, families: Iterable[Any]) -> list[str]:
    """The launcher's check of pretrained_model_path, before it writes anything: ModelError in one line
    for a missing file, an unreadable safetensors one, or one of another family, decoder or shape.
    Returns notes (an export from before #36 of a family whose latents are now normalized)."""
    path = os.path.expanduser(str(config["pretrained_model_path"]))
    facts = read_facts(path, stems_of(families))
    if facts is None:
        return []
    if line := problem(facts, wanted_for(family, config)):
        raise ModelError(line)
    return [legacy_note(facts, family)] if facts.legacy_export and family.latent_norm != "raw" else []


def legacy_note(facts: Facts, family: Any) -> str:
    return (
        f"pretrained_model_path {facts.path} is a taehv-launch export from before #36, trained on the "
        f"{family.name} VAE's raw latents; this run's targets are {family.latent_norm}-normalized (the latent "
        f"space of upstream's {family.upstream}), so it starts further from them"
    )


def file_sha256(path: str | Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
