"""Whether a checkpoint can resume with this launch's plan: another layout (world size, ZeRO stage),
another model shape or reference VAE family, or a run already at max_train_steps. Read from the
checkpoint's trainer_state.json before anything is written or started. Stdlib only: the CLI uses it.
The checkpoint format itself is rundir/checkpoint.py.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import CheckpointError
from ..plan.schema import global_batch
from ..rundir.checkpoint import EMA_FILE, layout_change_problem, layout_name, read_state
from ..rundir.layout import FINAL_MODEL, exported_step


def layout_change_note(ckpt: Path, new_world: int, new_cfg: dict) -> str | None:
    """What resuming `ckpt` with `new_world` processes and config `new_cfg` does (None: same
    layout). Raises CheckpointError if it cannot."""
    state = read_state(ckpt)
    old_world, old_zero = int(state["world_size"]), int(state["zero_stage"])
    new_zero = new_cfg["zero_stage"]
    problem = layout_change_problem(old_world, old_zero, new_world, new_zero, ckpt)
    if problem:
        raise CheckpointError(problem)
    if old_world == new_world and old_zero == new_zero:
        return None
    note = (
        f"{ckpt.name} was written by {layout_name(old_world, old_zero)}, this run has "
        f"{layout_name(new_world, new_zero)}: the weights, AdamW moments and step, schedule, EMA and Seraena "
        f"carry over through its world-size-free state; "
    )
    if old_world != new_world:
        note += "the data order is reshuffled and the random streams restart from the seed for the new world size"
    else:
        note += "the data order and random streams continue"
    old_cfg, changes = state.get("config") or {}, []
    if old_cfg:
        try:
            if global_batch(old_cfg, old_world) != global_batch(new_cfg, new_world):
                changes.append(f"global batch {global_batch(old_cfg, old_world)} -> {global_batch(new_cfg, new_world)}")
            if float(old_cfg["learning_rate"]) != float(new_cfg["learning_rate"]):
                changes.append(f"learning rate {old_cfg['learning_rate']:g} -> {new_cfg['learning_rate']:g}")
        except (KeyError, TypeError, ValueError):  # written by an older version with other keys
            changes.append("its config could not be compared with this one")
    return note + (f" ({', '.join(changes)})" if changes else "")


# Config keys that decide the shapes of the saved tensors (TAEHV and Seraena's discriminator).
SHAPE_KEYS = (
    "latent_channels",
    "patch_size",
    "encoder_time_downscale",
    "decoder_time_upscale",
    "decoder_space_upscale",
    "use_seraena",
    "n_seraena_frames",
)


def _same(a, b) -> bool:
    return (list(a) if isinstance(a, (list, tuple)) else a) == (list(b) if isinstance(b, (list, tuple)) else b)


def resume_problem(ckpt: Path, new_cfg: dict) -> tuple[str | None, str | None]:
    """(refusal, note) for continuing `ckpt` with `new_cfg`, read from its trainer_state.json before
    anything is written or started: a model of other shapes, another reference VAE family (unless
    allow_family_change), or a checkpoint already at max_train_steps."""
    state = read_state(ckpt)
    old_cfg = state.get("config") or {}
    changed = [
        f"{k}={old_cfg[k]!r} -> {new_cfg[k]!r}"
        for k in SHAPE_KEYS
        if k in old_cfg and k in new_cfg and not _same(old_cfg[k], new_cfg[k])
    ]
    if changed:
        return (
            f"checkpoint {ckpt} does not fit this model ({', '.join(changed)}): resume with its settings, or "
            f"start a new run from its weights with --set pretrained_model_path={ckpt / EMA_FILE}"
        ), None
    note = None
    old_family, new_family = old_cfg.get("ref_vae_type"), new_cfg.get("ref_vae_type")
    if old_family and new_family and old_family != new_family:
        if not new_cfg.get("allow_family_change"):
            return (
                f"{ckpt.name} was trained against the {old_family} reference VAE, this run asks for "
                f"{new_family}: resume with --set ref_vae_type={old_family}, or pass --set "
                f"allow_family_change=True to go on distilling from {new_family} (recorded in the run)"
            ), None
        note = (
            f"reference VAE family changes on resume: {old_family} ({ckpt.name}) -> {new_family} "
            f"(allow_family_change=True)"
        )
    step, total = int(state.get("step", 0)), int(new_cfg["max_train_steps"])
    if step >= total:
        exported = exported_step(ckpt.parent / FINAL_MODEL)
        if exported is not None and exported >= step:
            return (
                f"{ckpt.name} is at step {step}, and max_train_steps is {total}: nothing left to train (its "
                f"run's final_model holds the result); raise --set max_train_steps to train further"
            ), None
        note = ((note + "; ") if note else "") + (
            f"{ckpt.name} is at max_train_steps={total} but final_model "
            f"was not written from it: this launch only exports it"
        )
    return None, note
