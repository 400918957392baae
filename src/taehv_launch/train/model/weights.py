"""Loading TAEHV weights strictly: upstream's releases (`taecvx.pth`, `taew2_2_super.safetensors` ...) and
our exports, into the model the run builds.

First the file is named for what it is (rundir/taehvfile.py: the family from its metadata, export.json or
name; patch, channels, decoder and time stride from its shapes): a file of another family or decoder is
one line saying which, before any tensor is read. Then every key and shape must match (a checkpoint
whose TGrow layers upscale time more than the model, e.g. full weights into a preview decoder, is cut
to the last-timestep output channels, as upstream does).
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn

from ...errors import ModelError
from ...rundir import taehvfile
from .blocks import TGrow


def read_state_dict(path: str) -> dict[str, torch.Tensor]:
    if not os.path.isfile(path):
        raise ModelError(
            f"TAEHV weights not found: {path}; set pretrained_model_path to an existing "
            f".pth/.safetensors file, or to '' to train from scratch"
        )
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            sd = load_file(path, device="cpu")
        else:
            sd = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # weights_only=True refuses anything but tensors
        raise ModelError(
            f"cannot read TAEHV weights {path}: it holds pickled Python objects, not just "
            f"tensors; re-save it as model.state_dict() (.pth) or as .safetensors"
        ) from e
    except Exception as e:  # corrupt or truncated file, wrong format
        reason = (str(e).strip().splitlines() or [""])[0]  # keep the message to one line
        raise ModelError(
            f"cannot read TAEHV weights {path} ({type(e).__name__}: {reason}); "
            f"expected a state dict saved as .pth or .safetensors"
        ) from e
    if not isinstance(sd, Mapping) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ModelError(
            f"TAEHV weights {path} are not a flat state dict of tensors; "
            f"export the model's state_dict() (upstream taehv.pth format)"
        )
    return dict(sd)


def wanted(model: nn.Module, family: Any) -> taehvfile.Wanted:
    """What a file must be to load into `model` for `family`."""
    arch = model.decoder_arch
    return taehvfile.Wanted(
        family=family.name,
        stem=family.export_stem(arch),
        latent_channels=model.latent_channels,
        patch_size=model.patch_size,
        decoder_arch=arch,
        time_stride=model.t_downscale,
        decoder_time_upscale=tuple(b.stride == 2 for b in model.decoder if isinstance(b, TGrow)),
    )


def check_file(path: str, model: nn.Module, family: Any, families: Mapping[str, Any]) -> None:
    """ModelError in one line when the file is for another family, decoder or shape than `model`."""
    facts = taehvfile.read_facts(path, taehvfile.stems_of(families.values()))
    if facts is not None and (line := taehvfile.problem(facts, wanted(model, family))):
        raise ModelError(line)


def _shape_hint(model: nn.Module, sd: Mapping[str, torch.Tensor]) -> str:
    """What to change, from the settings the file's shapes imply."""
    f = taehvfile.shape_facts({k: tuple(v.shape) for k, v in sd.items()})
    diff = [
        f"{k}={have}"
        for k, have, ours in (
            ("latent_channels", f.latent_channels, model.latent_channels),
            ("patch_size", f.patch_size, model.patch_size),
            ("decoder_arch", f.decoder_arch, model.decoder_arch),
        )
        if have is not None and have != ours
    ]
    if diff:
        return f"the file was made with {', '.join(diff)}: set {'/'.join(d.split('=')[0] for d in diff)} to match"
    return "is this a TAEHV (upstream taehv.py layout) checkpoint?"


def load_state_dict_strict(model: nn.Module, sd: dict[str, torch.Tensor], path: str) -> None:
    want = model.state_dict()
    for i, b in enumerate(model.decoder):
        key = f"decoder.{i}.conv.weight"
        if isinstance(b, TGrow) and key in sd and sd[key].shape[0] > want[key].shape[0]:
            sd[key] = sd[key][-want[key].shape[0] :]
    for key, ref in want.items():
        if key not in sd:
            raise ModelError(
                f"TAEHV weights {path} lack {key} (model shape {tuple(ref.shape)}); {_shape_hint(model, sd)}"
            )
        if sd[key].shape != ref.shape:
            raise ModelError(
                f"TAEHV weights {path}: {key} has shape {tuple(sd[key].shape)} in the file but "
                f"{tuple(ref.shape)} in the model; {_shape_hint(model, sd)}"
            )
    extra = [k for k in sd if k not in want]
    if extra:
        raise ModelError(
            f"TAEHV weights {path} have a key the model lacks: {extra[0]} "
            f"(shape {tuple(sd[extra[0]].shape)}, {len(extra)} extra in all); {_shape_hint(model, sd)}"
        )
    model.load_state_dict(sd, strict=True)


def load_taehv_state_dict(model: nn.Module, path: str, family: Any = None, families: Mapping[str, Any] = {}):
    """Load upstream-layout TAEHV weights (.pth or .safetensors) into `model`, strictly. With a family,
    a file of another family or decoder is refused first, in one line naming both."""
    if family is not None:
        check_file(path, model, family, families)
    load_state_dict_strict(model, read_state_dict(path), path)
    return model
