"""What the trainer would refuse in its first seconds, checked before the launch writes or starts
anything, so that exit 2 means nothing was written: the data folder (exists, holds a video) and the
reference VAE folder (config.json of the family asked for, with the latent channel count the config
says), pretrained_model_path (a TAEHV file of this family, decoder and shape: rundir/taehvfile.py reads
its header, no tensor), and the library of each chosen tracker (wandb, mlflow, swanlab: found, not imported). Cheap:
one config.json read and a walk that stops at the first video file. The trainer checks everything
again, fully (every file, the weights), when it loads them. An existing run directory (a resume): its
heartbeat paths and events.jsonl (check_run_dir).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DataError, LaunchError, ModelError
from ..plan.families import FAMILIES, family_of_config, get_family
from ..plan.resolve import tracker_library_line, tracker_names
from ..rundir.events import EVENTS_FILE, rollbacks
from ..rundir.heartbeat import heartbeat_dir, stacks_dir
from ..rundir.taehvfile import check_pretrained

RANK_FILE = re.compile(r"rank\d+(\.dead|\.done|\.hang)?")  # heartbeat/ files the watchdog replaces or removes


def check_inputs(
    config: dict[str, Any], demo_assets: tuple[str, str], task: str = "train", run_dir: Path | None = None
) -> list[str]:
    """Refuses (UserError) what the trainer would; returns notes for the launch to print. run_dir: the
    run directory, checked (check_run_dir) when it exists already (a resume, --run-name again)."""
    notes = check_run_dir(run_dir) if run_dir is not None and task == "train" else []
    demo_data, demo_vae = demo_assets
    if task == "train":  # a cache job logs to no tracker, nor starts from TAEHV weights
        check_trackers(config["trackers"])
        if config["pretrained_model_path"]:  # of this family, decoder and shape (the trainer loads it strictly)
            notes += check_pretrained(config, get_family(config["ref_vae_type"]), FAMILIES.values())
    reads_videos = not (config["latent_cache"] and config["latent_cache_encode"] == "never")
    if reads_videos and not config["annotation_file"] and config["data_root"] and config["data_root"] != demo_data:
        check_data_root(config["data_root"])
    if reads_videos and config["use_ref_vae"] and config["ref_vae_path"] and config["ref_vae_path"] != demo_vae:
        check_reference_folder(config["ref_vae_path"], config["ref_vae_type"], config["latent_channels"])
    return notes


def _kind(path: Path) -> str:
    if path.is_symlink() and not path.exists():
        return "a symlink to nothing"
    if path.is_dir():
        return "a folder"
    if path.is_file():
        return "a file"
    return "a special file (a FIFO, socket or device)"


def check_run_dir(run_dir: Path) -> list[str]:
    """An existing run directory the trainer would fail in: a heartbeat path of the wrong kind (its
    watchdog makes heartbeat/ and heartbeat/stacks/, and replaces heartbeat/rank<r>* files), an
    events.jsonl that is no file (it appends to it, and reads it on a resume) -> LaunchError, one
    line naming the path. Rollback records a resume cannot use -> a note (the trainer leaves them out
    and says so again: bookkeeping, not state, so the run goes on)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    beat = heartbeat_dir(run_dir)
    wrong = []
    if os.path.lexists(beat) and not beat.is_dir():
        wrong.append((beat, "the folder for its heartbeats"))
    elif beat.is_dir():
        stacks = stacks_dir(run_dir)
        if os.path.lexists(stacks) and not stacks.is_dir():
            wrong.append((stacks, "the folder for a hang's stack dumps"))
        try:
            entries = sorted(beat.iterdir())
        except OSError:
            entries = []
        wrong += [(p, "a rank's heartbeat file") for p in entries if RANK_FILE.fullmatch(p.name) and p.is_dir()]
    events = run_dir / EVENTS_FILE
    if os.path.lexists(events) and not events.is_file():
        wrong.append((events, "a file: the run's event log"))
    if wrong:
        path, role = wrong[0]
        raise LaunchError(
            f"{path} is {_kind(path)}, where the trainer needs {role}: move it away or remove it "
            f"(the trainer makes it again), then launch again"
        )
    _, _, note = rollbacks(run_dir)
    return [note] if note else []


def check_trackers(value: str) -> None:
    """Each chosen tracker's library is installed (TensorBoard comes with taehv-launch)."""
    for name in tracker_names(value):
        if name != "tensorboard" and importlib.util.find_spec(name) is None:
            raise ConfigError(tracker_library_line(name))


def check_data_root(data_root: str) -> None:
    from ..dataindex.index import VIDEO_EXTENSIONS, check_root

    root = check_root(data_root, "")
    for folder, dirs, files in os.walk(root, followlinks=True):
        if any(f.lower().endswith(VIDEO_EXTENSIONS) and os.path.isfile(os.path.join(folder, f)) for f in files):
            return
        dirs.sort()
    raise DataError(
        f"no video files ({' '.join(VIDEO_EXTENSIONS)}) under {root}: point data_root at "
        f"your videos or give an annotation_file"
    )


def check_reference_folder(path: str, kind: str, latent_channels: int) -> None:
    """The reference VAE's config.json: the family's class and its latent channels."""
    fix = "set ref_vae_path to a local diffusers folder (with vae/config.json or config.json)"
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ModelError(f"reference VAE folder not found: {path}: {fix}")
    cfg_file = next((f for f in (folder / "vae" / "config.json", folder / "config.json") if f.is_file()), None)
    if cfg_file is None:
        raise ModelError(f"no config.json in {path} or {path}/vae: {fix}")
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, ValueError) as err:
        raise ModelError(f"cannot read {cfg_file} ({err}): re-download the reference VAE") from None
    if not isinstance(cfg, dict):
        raise ModelError(f"{cfg_file} is not a diffusers config: re-download the reference VAE")
    family = get_family(kind)
    found = cfg.get("_class_name")
    marks = all(cfg.get(k) == v for k, v in family.config_marks.items())  # Wan 2.1 / 2.2 share a class
    if found and (found != family.class_name or not marks):
        other = family_of_config(cfg)
        hint = f"set ref_vae_type={other.name}" if other else f"use a {family.class_name} folder"
        what = f"an {found}" + (f" of the {other.name} family" if other and found == family.class_name else "")
        raise ModelError(
            f"{cfg_file.parent} is {what}, not the {family.class_name} ({family.models}) that ref_vae_type={kind} needs: {hint}"
        )
    channels = cfg.get(family.channels_key)
    if isinstance(channels, int) and channels != latent_channels:
        raise ConfigError(
            f"the reference VAE at {path} has {channels} latent channels but "
            f"latent_channels={latent_channels}: set --set latent_channels={channels}"
        )
