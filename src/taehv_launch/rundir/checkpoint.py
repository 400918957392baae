"""The checkpoint format, in one place: folder and file names, what trainer_state.json holds
(TrainState), the world-size-free file format, the COMPLETE marker with every file's size and CRC-32,
listing and verifying, rotation, which layouts can resume, and the size estimate. Stdlib only: the
launcher (run/), preflight and the trainer (train/durability/checkpoint.py, which writes and reads the tensors,
and train/durability/portable.py) all use it.

A checkpoint is complete when its COMPLETE marker exists; it is written last, after every
file is on disk, and the directory is renamed from a temporary name only after that.
The marker lists every file with its size and CRC-32 (zlib; 3.2 GB/s on one core, see
docs/troubleshooting.md): a missing or truncated file is seen by every listing (sizes, cheap),
a damaged one when a resume verifies the checksums. Markers written before checksums were
recorded still resume, unverified, with a note.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import EXIT_FAILED, CheckpointError
from ..files import read_json, write_atomic
from .records import ANY, Field, ListOf, MapOf, OrNull, Record, Text, Whole

COMPLETE = "COMPLETE"  # marker file inside a finished checkpoint
CHECKSUM = "crc32"  # zlib.crc32 of the whole file, 8 hex digits
CKPT_RE = re.compile(r"^checkpoint-(\d+)$")
STATE_FILE = "trainer_state.json"  # step, samples seen, best PSNR, layout, config
EMA_FILE = "ema.safetensors"  # EMA TAEHV weights (also what pretrained_model_path can load)
MODEL_FILE = "model.safetensors"  # world-size-free fp32 weights (portable.py)
OPTIMIZER_FILE = "optimizer.safetensors"  # world-size-free AdamW moments by parameter name (portable.py)
PORTABLE_FILES = (MODEL_FILE, OPTIMIZER_FILE)
DEEPSPEED_DIR = "deepspeed"  # DeepSpeed's own files, under ZeRO (tag "state")
WRITING_PREFIX = ".tmp-"  # .tmp-checkpoint-<step>: being written, never resumed from
MOMENTS = ("exp_avg", "exp_avg_sq")  # OPTIMIZER_FILE's keys: `<moment>/<parameter name>`
PORTABLE_FORMAT = "taehv-launch portable optimizer v1"  # OPTIMIZER_FILE's metadata "format"


@dataclass
class TrainState:
    """What trainer_state.json holds (STATE_FILE): the loop's counters, the layout and the config."""

    step: int = 0  # optimizer steps done
    samples_seen: int = 0  # per rank: clips drawn from this rank's sampler
    best_psnr: float = -1.0
    best_step: int = -1
    bad_steps_total: int = 0
    skipped_files: list[str] = field(default_factory=list)
    world_size: int = 1
    zero_stage: int = 0
    config: dict[str, Any] = field(default_factory=dict)


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (disk full, quota, file size limit, I/O error)."""

    exit_code = EXIT_FAILED


class CheckpointMismatch(CheckpointError):
    """A checkpoint's tensors do not fit this run's model (other names or shapes)."""


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / f"checkpoint-{step}"


def writing_dir(run_dir: Path, step: int) -> Path:
    """Where checkpoint-<step> is written before it is complete; never resumed from."""
    return run_dir / f"{WRITING_PREFIX}checkpoint-{step}"


def rng_file(rank: int) -> str:
    return f"rng_rank{rank}.pt"


def seraena_file(rank: int) -> str:
    return f"seraena_rank{rank}.pt"


def estimate_bytes(
    taehv_params: int,
    disc_params: int,
    *,
    deepspeed: bool,
    world_size: int,
    use_seraena: bool,
    seraena_buffer_bytes: int,
) -> int:
    """An upper bound on one checkpoint: the world-size-free state (fp32 weights + AdamW moments) and
    the EMA; under ZeRO also DeepSpeed's files (training-precision weights, fp32 master copy,
    moments); per rank, Seraena's discriminator with its AdamW and the replay buffer when saved."""
    model = 4 * taehv_params * (3 + 1) + (4 * taehv_params * 4 if deepspeed else 0)
    seraena = (12 * disc_params + seraena_buffer_bytes) * world_size if use_seraena else 0
    return model + seraena


def read_state(ckpt: Path) -> dict:
    """trainer_state.json of a checkpoint, or CheckpointError in one line."""
    try:
        state = read_json(ckpt / STATE_FILE)
        int(state["world_size"]), int(state["zero_stage"])
        return state
    except (OSError, ValueError, KeyError, TypeError, OverflowError):
        raise CheckpointError(f"checkpoint {ckpt} has no readable {STATE_FILE}: pass another checkpoint") from None


def checkpoint_step(path: Path) -> int | None:
    m = CKPT_RE.match(path.name)
    return int(m.group(1)) if m else None


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path, str | None]]:
    """(step, path, why incomplete or None) for every checkpoint-<step> dir, oldest first."""
    out = []
    if not run_dir.is_dir():
        return out
    for p in run_dir.iterdir():
        step = checkpoint_step(p)
        if step is None or not p.is_dir():
            continue
        out.append((step, p, incomplete_reason(p)))
    return sorted(out, key=lambda t: t[0])


MARKER = Record(  # what a resume and every listing read of a COMPLETE marker
    COMPLETE,
    (
        Field("files", ListOf(Text()), default=[]),
        Field("sizes", OrNull(MapOf(Whole(None)))),
        Field("checksum", ANY),
        Field("checksums", OrNull(MapOf(Text()))),
    ),
    strict=True,
)


def read_marker(marker: Path) -> dict | None:
    """A COMPLETE marker's record, or None when it is unreadable or not one we wrote: `files` a list of
    names, `sizes` and `checksums` name -> value (a hand edit or a torn write must not crash a resume)."""
    return MARKER.read(marker).record


def incomplete_reason(ckpt: Path) -> str | None:
    """Why `ckpt` is not complete (marker missing or unreadable, a listed file missing or of
    another size), or None. Cheap: no file is read; see checksum_problem for that."""
    marker = ckpt / COMPLETE
    if not marker.is_file():
        return f"no COMPLETE marker, {_unmarked(ckpt)}"
    meta = read_marker(marker)
    if meta is None:
        return "unreadable COMPLETE marker"
    missing = [f for f in meta.get("files", []) if not (ckpt / f).exists()]
    if missing:
        return f"missing {', '.join(missing[:3])}"
    sizes = meta.get("sizes") or {}
    wrong = [f for f, n in sizes.items() if _size(ckpt / f) != n]
    if wrong:
        return f"{', '.join(wrong[:3])} changed size since it was saved (truncated or damaged)"
    return None


def _unmarked(ckpt: Path) -> str:
    """What a checkpoint-<step> folder without a COMPLETE marker is, from its files' names (no file read).
    Ours are saved under .tmp-checkpoint-<step> and renamed with the marker in them, so a save that
    stops never leaves one: it is another tool's folder of that name, or ours copied in part."""
    try:
        names = {p.name for p in ckpt.iterdir()}
    except OSError as exc:
        return f"cannot list it: {exc.strerror or exc}"
    if not names:
        return "an empty folder"
    if STATE_FILE in names and EMA_FILE in names:
        return "taehv-launch's files, but ours are renamed into place only when complete: copied in part?"
    return f"not a taehv-launch checkpoint: no {STATE_FILE} and {EMA_FILE} in it, another tool's folder?"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def file_checksum(path: Path, chunk: int = 8 << 20) -> str:
    """CRC-32 of a file (zlib releases the GIL: files hash in parallel threads)."""
    crc = 0
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(chunk)
        view = memoryview(buf)
        while n := f.readinto(buf):
            crc = zlib.crc32(view[:n], crc)
    return f"{crc & 0xFFFFFFFF:08x}"


def _checksums(folder: Path, files: list[str]) -> dict[str, str]:
    big_first = sorted(files, key=lambda f: -_size(folder / f))
    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1, len(files)))) as pool:
        sums = dict(zip(big_first, pool.map(lambda f: file_checksum(folder / f), big_first)))
    return {f: sums[f] for f in files}


def write_complete(folder: Path, step: int) -> dict:
    """List every file of a finished checkpoint folder, with sizes and checksums, in its COMPLETE
    marker (written last, atomically). Returns the marker's content."""
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != COMPLETE)
    meta = {
        "step": step,
        "files": files,
        "sizes": {f: _size(folder / f) for f in files},
        "checksum": CHECKSUM,
        "checksums": _checksums(folder, files),
    }
    write_atomic(folder / COMPLETE, json.dumps(meta))
    return meta


def checksum_problem(ckpt: Path) -> tuple[str | None, str | None]:
    """(problem, note): reads every file of a complete checkpoint and compares its checksum.
    A marker without checksums (an earlier version) is no problem, only a note."""
    meta = read_marker(ckpt / COMPLETE)
    if meta is None:
        return "unreadable COMPLETE marker", None
    sums = meta.get("checksums")
    if not sums:
        return None, (f"{ckpt.name} has no checksums (saved by an earlier taehv-launch): resuming it unverified")
    if meta.get("checksum") != CHECKSUM:
        return None, f"{ckpt.name} has {meta.get('checksum')!r} checksums, this version checks {CHECKSUM!r}: unverified"
    try:
        got = _checksums(ckpt, list(sums))
    except OSError as exc:
        return f"cannot read it ({exc.strerror or exc})", None
    bad = [f for f, want in sums.items() if got[f] != want]
    if bad:
        return f"{', '.join(bad[:3])} does not match the checksum saved with it (damaged on disk)", None
    return None, None


def newest_complete(run_dir: Path, verify: bool = False) -> tuple[Path | None, list[str]]:
    """The newest complete checkpoint in run_dir, and a line for each newer one skipped.
    verify: also compare every file's checksum (reads the checkpoint), falling back past damaged ones."""
    skipped = []
    for _step, path, why in reversed(list_checkpoints(run_dir)):
        note = None
        if why is None and verify:
            why, note = checksum_problem(path)
        if why is None:
            return path, skipped + ([note] if note else [])
        skipped.append(f"skipping {path.name}: {why}")
    return None, skipped


def layout_name(world: int, zero: int) -> str:
    return f"{world} process(es) with {'ZeRO-' + str(zero) if zero else 'DDP'}"


def layout_change_problem(old_world: int, old_zero: int, new_world: int, new_zero: int, path: Path) -> str | None:
    """None when a checkpoint can resume on the new layout; else what to do instead.

    Same layout: always (DeepSpeed's own files). Another world size or ZeRO stage: through the
    world-size-free state every checkpoint holds (full fp32 weights and AdamW moments by name).
    """
    if old_world == new_world and old_zero == new_zero:
        return None
    missing = [f for f in PORTABLE_FILES if not (path / f).is_file()]
    if not missing:
        return None
    return (
        f"checkpoint {path.name} was written by {layout_name(old_world, old_zero)} and has no world-size-free "
        f"state ({', '.join(missing)} missing); this run has {layout_name(new_world, new_zero)}: use the same "
        f"GPU count and --set zero_stage={old_zero}, or start a new run from its weights with "
        f"--set pretrained_model_path={path / EMA_FILE}"
    )


def rotate(run_dir: Path, keep: int, best_step: int) -> list[str]:
    """Delete the oldest complete checkpoints beyond `keep`; never the newest or the best one."""
    complete = [(s, p) for s, p, why in list_checkpoints(run_dir) if why is None]
    protected = {complete[-1][0] if complete else None, best_step}
    removable = [(s, p) for s, p in complete if s not in protected]
    excess = len(complete) - keep
    removed = []
    for _s, p in removable[: max(0, excess)]:
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p.name)
    return removed
