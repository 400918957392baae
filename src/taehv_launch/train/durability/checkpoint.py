"""Checkpoints that are complete or absent, and exports of the EMA TAEHV.

A checkpoint is written into `.tmp-checkpoint-<step>/`, then every file is listed in a
COMPLETE marker with its size and CRC-32 (rundir/checkpoint.py, the format; a resume verifies them), then the
folder is renamed to `checkpoint-<step>/` (files.publish_dir, as the exports are); a crash at any point
leaves either the previous checkpoints or a temp folder that resume ignores. A write that fails (disk
full) is one error line and removes the temp folder. Assumes the run
directory is on a filesystem every node sees (as DeepSpeed's own checkpoints do).

Contents: model + optimizer as a world-size-free state (portable.py: full fp32 weights and
AdamW moments by parameter name, safetensors) and, under ZeRO, DeepSpeed's own files too;
EMA weights (safetensors), Seraena per rank, RNG states per rank, and trainer_state.json
(step, samples consumed, best PSNR, the layout and config it ran with).

Resume on the layout that wrote it uses DeepSpeed's own files (exact, DeepSpeed's code); on
any other world size or ZeRO stage, and for DDP, the portable state.
Everything we load ourselves is safetensors or `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ...errors import CheckpointError
from ...files import disk_errors, publish_dir
from ...rundir.checkpoint import (
    DEEPSPEED_DIR,
    EMA_FILE,
    STATE_FILE,
    CheckpointMismatch,
    CheckpointWriteError,
    TrainState,
    checkpoint_dir,
    checksum_problem,
    layout_change_problem,
    list_checkpoints,
    rng_file,
    seraena_file,
    write_complete,
    writing_dir,
)
from ...plan.families import get_family
from ...rundir import taehvfile
from ...rundir.layout import EXPORT_META
from . import portable
from .progress import PROGRESS


def rng_state() -> dict[str, torch.Tensor]:
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": torch.tensor(random.getstate()[1], dtype=torch.int64),
        "python_pos": torch.tensor([random.getstate()[2] or 0], dtype=torch.int64),
        "numpy": torch.from_numpy(np_state[1].astype(np.int64)),
        "numpy_pos": torch.tensor([np_state[2]], dtype=torch.int64),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((3, tuple(int(v) for v in state["python"].tolist()), None))
    np.random.set_state(("MT19937", state["numpy"].numpy().astype(np.uint32), int(state["numpy_pos"][0])))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


@contextlib.contextmanager
def torch_write_errors():
    """torch.save and safetensors report a failed write (disk full ...) as a RuntimeError or SafetensorError:
    raise it as the OSError it is, so files.disk_errors turns it into one line."""
    try:
        yield
    except (RuntimeError, SafetensorError) as exc:
        if isinstance(exc, RuntimeError) and not any(s in str(exc) for s in _TORCH_WRITE_FAILURES):
            raise  # not a write failure (e.g. a collective with a dead peer): the full error
        if m := re.search(r"os error (\d+)", str(exc)):  # safetensors' I/O errors
            raise OSError(int(m.group(1)), os.strerror(int(m.group(1)))) from exc
        err = OSError("a write failed")  # torch.save hides the OS error
        err.strerror = "a write failed"
        raise err from exc


# torch.save's messages when the underlying write fails (PyTorchStreamWriter)
_TORCH_WRITE_FAILURES = ("file write failed", "unexpected pos", "inline_container", "PytorchStreamWriter")


def _then_resume(run_dir: Path) -> Callable[[], str]:
    """What to do once the disk has room, asked after the failed folder is removed."""

    def then() -> str:
        previous = [p.name for s, p, why in list_checkpoints(run_dir) if why is None]
        return "then continue with --resume auto" + (
            f" from {previous[-1]}, which is complete" if previous else " (no complete checkpoint yet)"
        )

    return then


def _writing(run_dir: Path, tmp: Path, step: int):
    """A failed write is one line; the partial folder stays a temporary one and is removed."""
    return disk_errors(f"checkpoint-{step}", run_dir, _then_resume(run_dir), remove=tmp, error=CheckpointWriteError)


def save_checkpoint(
    run_dir: Path, accelerator, model, optimizer, ema, seraena, state: TrainState, include_buffer: bool
) -> Path:
    """Collective: every rank calls it. Returns the final checkpoint path.

    A write that fails (disk full ...) raises CheckpointWriteError on the rank that saw it; the
    temporary folder is removed and the previous checkpoints are untouched."""
    final = checkpoint_dir(run_dir, state.step)
    tmp = writing_dir(run_dir, state.step)
    rank = accelerator.process_index
    if accelerator.is_main_process:  # makes tmp, and renames it to final once COMPLETE is in it
        folder = publish_dir(final, then=_then_resume(run_dir), tmp=tmp, error=CheckpointWriteError)
    else:  # writes its files into tmp
        folder = _writing(run_dir, tmp, state.step)
    with folder, torch_write_errors():
        accelerator.wait_for_everyone()  # the main rank made tmp
        if accelerator.state.deepspeed_plugin is not None:
            model.save_checkpoint(str(tmp / DEEPSPEED_DIR), tag="state", save_latest=False)
        full = portable.gather(accelerator, model, optimizer)
        if full is not None:
            portable.save(tmp, full)
        torch.save(rng_state(), tmp / rng_file(rank))
        if seraena is not None:
            torch.save(seraena.state_dict_for_checkpoint(include_buffer=include_buffer), tmp / seraena_file(rank))
        if accelerator.is_main_process:
            save_file(_contiguous(ema.state_dict()), str(tmp / EMA_FILE))
            (tmp / STATE_FILE).write_text(json.dumps(asdict(state), indent=2))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            write_complete(tmp, state.step)  # every file with its size and checksum
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(
    path: Path, accelerator, model, optimizer, ema, seraena, world_size: int, zero_stage: int
) -> TrainState:
    """Collective. Restores everything save_checkpoint wrote; says clearly what does not fit."""
    try:
        state = TrainState(**json.loads((path / STATE_FILE).read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise CheckpointError(
            f"checkpoint {path} has no readable {STATE_FILE} ({exc}): pass another checkpoint"
        ) from None
    problem = layout_change_problem(state.world_size, state.zero_stage, world_size, zero_stage, path)
    if problem:
        raise CheckpointError(problem)
    same_layout = state.world_size == world_size and state.zero_stage == zero_stage
    try:
        if accelerator.state.deepspeed_plugin is not None and same_layout:
            load_path, _ = model.load_checkpoint(str(path / DEEPSPEED_DIR), tag="state", load_module_strict=True)
            if load_path is None:
                raise CheckpointError(f"DeepSpeed found no state in {path / DEEPSPEED_DIR}: the checkpoint is damaged")
        else:
            portable.load(path, accelerator, model, optimizer, zero_stage)
        ema.load_state_dict(load_file(str(path / EMA_FILE)))  # copied onto the EMA model's device
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(
            f"checkpoint {path} is damaged ({str(exc).splitlines()[0]}): pass an older checkpoint of the run"
        ) from None
    except (CheckpointMismatch, RuntimeError) as exc:
        # DeepSpeed's own load reports a mismatch with torch's load_state_dict error (a RuntimeError)
        if not isinstance(exc, CheckpointMismatch) and "Error(s) in loading state_dict" not in str(exc):
            raise  # not a shape mismatch (e.g. another rank failed): the full error
        raise CheckpointMismatch(
            f"checkpoint {path} does not fit this model ({str(exc).splitlines()[0]}): "
            f"resume with the config it was written with (see its {STATE_FILE})"
        ) from None
    rank = accelerator.process_index
    rng_path = path / rng_file(rank)
    if rng_path.exists() and state.world_size == world_size:
        set_rng_state(torch.load(rng_path, map_location="cpu", weights_only=True))
    # Seraena's discriminator is the same on every rank; a rank beyond the old world takes the last one's buffer
    ser_file = path / seraena_file(min(rank, state.world_size - 1))
    if seraena is not None and ser_file.exists():
        # "cpu", not accelerate's torch.device("cpu", 0), which torch.load cannot map to
        where = "cpu" if accelerator.device.type == "cpu" else accelerator.device
        seraena.load_checkpoint_state(torch.load(ser_file, map_location=where, weights_only=True))
    if state.world_size != world_size:  # the same number of clips seen, spread over the new ranks
        state.samples_seen = state.samples_seen * state.world_size // world_size
    state.world_size, state.zero_stage = world_size, zero_stage  # the next checkpoint is of this layout
    return state


def rollback_checkpoint(run_dir: Path, accelerator, at_most: int) -> tuple[Path | None, list[str]]:
    """Collective, for a rollback in-process: the newest complete checkpoint of step <= at_most, the same on
    every rank (rank 0 verifies the checksums, falling back past damaged ones, and broadcasts its step),
    and a line for each newer one skipped."""
    step, notes = -1, []
    if accelerator.is_main_process:
        for s, path, why in reversed(list_checkpoints(run_dir)):
            if s > at_most:
                continue
            note = None
            if why is None:
                why, note = checksum_problem(path)
            if why is None:
                step, notes = s, notes + ([note] if note else [])
                break
            notes.append(f"skipping {path.name}: {why}")
    if accelerator.num_processes > 1:
        import torch.distributed as dist

        t = torch.tensor([step], dtype=torch.int64, device=accelerator.device)
        PROGRESS.count_collective()
        dist.broadcast(t, src=0)
        step = int(t.item())
    return (checkpoint_dir(run_dir, step) if step >= 0 else None), notes


def export_meta(cfg, state: TrainState, name: str) -> dict[str, Any]:
    """export.json of an export (best_model carries its validation PSNR): the family and decoder, the
    upstream name the files carry, the model's shape and where it differs from upstream's release of
    that name (upstream's TAEHV(checkpoint_path=...) builds the release's shape from the name)."""
    family = get_family(cfg.ref_vae_type)
    arch = cfg.decoder_arch
    shape = {
        "latent_channels": cfg.latent_channels,
        "patch_size": cfg.patch_size,
        "encoder_time_downscale": list(cfg.encoder_time_downscale),
        "decoder_time_upscale": list(cfg.decoder_time_upscale),
        "decoder_space_upscale": list(cfg.decoder_space_upscale),
    }
    release = {
        "latent_channels": family.latent_channels,
        "patch_size": family.patch_size,
        "encoder_time_downscale": list(family.encoder_time_downscale),
        "decoder_time_upscale": list(family.decoder_time_upscale),
        "decoder_space_upscale": [True, True, True],
    }
    return {
        "step": state.step,
        "val_psnr": state.best_psnr if name == "best_model" else None,
        "family": family.name,
        "ref_vae_type": family.name,  # the key exports before #36 wrote
        "decoder_arch": arch,
        "upstream_name": family.export_stem(arch),
        **shape,
        "differs_from_upstream": {k: [v, release[k]] for k, v in shape.items() if v != release[k]},
        "ema_decay": cfg.ema_decay,
    }


def _safetensors_metadata(meta: dict[str, Any]) -> dict[str, str]:
    """The export's facts as safetensors metadata (strings): what a loader reads without export.json."""
    out = {k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()}
    out[taehvfile.META_FORMAT] = taehvfile.EXPORT_FORMAT
    out["format"] = "pt"  # safetensors' usual tag of torch tensors
    out[taehvfile.META_CHANNELS] = str(meta["latent_channels"])  # ComfyUI's key
    return out


def export_model(taehv_state: dict[str, torch.Tensor], folder: Path, meta: dict[str, Any]) -> list[str]:
    """Write EMA TAEHV weights as `<upstream_name>.safetensors` and `.pth` (meta from export_meta: e.g.
    taecvx.pth, which upstream taehv.py loads by its name) and export.json with each file's SHA-256.

    All or nothing: a write that fails (disk full ...) leaves the previous export as it was and raises
    DiskWriteError in one line. Returns the weight files' names."""
    sd = {k: v.detach().float().cpu().contiguous() for k, v in taehv_state.items()}
    stem = meta["upstream_name"]
    names = [f"{stem}.safetensors", f"{stem}.pth"]
    with publish_dir(folder, then=_then_export(folder, meta.get("step"))) as tmp, torch_write_errors():
        save_file(sd, str(tmp / names[0]), metadata=_safetensors_metadata(meta))
        torch.save(sd, tmp / names[1])
        files = {n: {"sha256": taehvfile.file_sha256(tmp / n), "bytes": (tmp / n).stat().st_size} for n in names}
        (tmp / EXPORT_META).write_text(json.dumps({**meta, "files": files}, indent=2, default=str))
    return names


def _then_export(folder: Path, step: int | None) -> str:
    """What to do after a failed export. At the end of a run the step's checkpoint (written just before)
    holds the weights, and a resume of it is refused (nothing left to train): point there instead."""
    kept = f" (the previous {folder.name} is kept)" if folder.exists() else ""
    ckpt = checkpoint_dir(folder.parent, step) if step is not None else None
    if ckpt is not None and (ckpt / EMA_FILE).is_file():
        return f"then take {ckpt.name}/{EMA_FILE}, which holds the same EMA weights{kept}"
    return f"then continue with --resume auto{kept}"


def _contiguous(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().contiguous() for k, v in sd.items()}
