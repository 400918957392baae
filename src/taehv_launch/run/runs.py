"""Run directories and checkpoint discovery. Stdlib only: used by the CLI and the trainer.

Layout: <output_dir>/<run id>/checkpoint-<step>/ ... ; <output_dir>/latest -> newest run.
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
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..errors import CheckpointError, ConfigError

COMPLETE = "COMPLETE"                 # marker file inside a finished checkpoint
REQUEUE = "REQUEUE"                   # marker in the run dir: stopped by a signal after saving
CHECKSUM = "crc32"                    # zlib.crc32 of the whole file, 8 hex digits
CKPT_RE = re.compile(r"^checkpoint-(\d+)$")
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def node_suffix(node: int) -> str:
    """"" on node 0, ".node<k>" on the others: per-node files (launch log, env, exit status)."""
    return "" if node == 0 else f".node{node}"


def status_path(run_dir: Path, node: int) -> Path:
    """Where the trainer's local rank 0 of `node` records its exit code for the launcher."""
    return run_dir / f"exit_status{node_suffix(node)}.json"


def run_id_for(run_name: str | None, job_id: str | None, now: float | None = None) -> tuple[str, str]:
    """(run id, where it came from): --run-name, else the scheduler's job id, else a timestamp."""
    if run_name:
        if not RUN_ID_RE.match(run_name):
            raise ConfigError(f"--run-name {run_name!r} must be letters, digits, '.', '_' or '-' "
                              f"(at most 128, not starting with a symbol)")
        return run_name, "--run-name"
    if job_id:
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", job_id)[:120]
        return f"job-{safe}", "scheduler job id"
    return time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(now)), "timestamp"


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


def incomplete_reason(ckpt: Path) -> str | None:
    """Why `ckpt` is not complete (marker missing or unreadable, a listed file missing or of
    another size), or None. Cheap: no file is read; see checksum_problem for that."""
    marker = ckpt / COMPLETE
    if not marker.is_file():
        return "no COMPLETE marker (interrupted while saving)"
    try:
        meta = json.loads(marker.read_text())
    except (OSError, ValueError):
        return "unreadable COMPLETE marker"
    missing = [f for f in meta.get("files", []) if not (ckpt / f).exists()]
    if missing:
        return f"missing {', '.join(missing[:3])}"
    sizes = meta.get("sizes") or {}
    wrong = [f for f, n in sizes.items() if _size(ckpt / f) != n]
    if wrong:
        return f"{', '.join(wrong[:3])} changed size since it was saved (truncated or damaged)"
    return None


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
    meta = {"step": step, "files": files, "sizes": {f: _size(folder / f) for f in files},
            "checksum": CHECKSUM, "checksums": _checksums(folder, files)}
    tmp = folder / f".{COMPLETE}.tmp"
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, folder / COMPLETE)
    return meta


def checksum_problem(ckpt: Path) -> tuple[str | None, str | None]:
    """(problem, note): reads every file of a complete checkpoint and compares its checksum.
    A marker without checksums (an earlier version) is no problem, only a note."""
    try:
        meta = json.loads((ckpt / COMPLETE).read_text())
    except (OSError, ValueError):
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
    for step, path, why in reversed(list_checkpoints(run_dir)):
        note = None
        if why is None and verify:
            why, note = checksum_problem(path)
        if why is None:
            return path, skipped + ([note] if note else [])
        skipped.append(f"skipping {path.name}: {why}")
    return None, skipped


def latest_run(output_dir: Path) -> Path | None:
    link = output_dir / "latest"
    if link.is_symlink() or link.is_dir():
        target = link.resolve()
        if target.is_dir():
            return target
    runs = [p for p in output_dir.iterdir() if p.is_dir() and p.name != "latest"] if output_dir.is_dir() else []
    return max(runs, key=lambda p: p.stat().st_mtime) if runs else None


def runs_newest_first(output_dir: Path) -> list[Path]:
    if not output_dir.is_dir():
        return []
    runs = [p for p in output_dir.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")]
    return sorted(runs, key=lambda p: p.stat().st_mtime, reverse=True)


def resolve_resume(resume: str, output_dir: Path, run_dir: Path | None) -> tuple[Path | None, list[str]]:
    """`auto` -> newest complete checkpoint of this run, else of the newest run that has one
    (a run that failed before its first checkpoint is passed over). None: start fresh.

    A path -> that checkpoint (or the newest complete one inside a run dir); missing or
    incomplete is an error.
    """
    if resume == "auto":
        notes: list[str] = []
        seen: set[Path] = set()
        for candidate in [run_dir, latest_run(output_dir), *runs_newest_first(output_dir)]:
            if candidate is None or candidate.resolve() in seen:
                continue
            seen.add(candidate.resolve())
            found, skipped = newest_complete(candidate, verify=True)
            notes += skipped
            if found is not None:
                return found, notes
        return None, notes + ["--resume auto: no complete checkpoint found; starting from scratch"]
    path = Path(resume).expanduser()
    if not path.exists():
        raise CheckpointError(f"resume checkpoint {str(path)!r} does not exist: pass a checkpoint-<step> "
                              f"folder, a run folder, or --resume auto")
    if checkpoint_step(path) is None and path.is_dir():   # a run directory
        found, skipped = newest_complete(path, verify=True)
        if found is None:
            raise CheckpointError(f"run folder {path} has no complete checkpoint"
                                  + (f" ({'; '.join(skipped)})" if skipped else "")
                                  + ": pass another folder or start without --resume")
        return found, skipped
    why = incomplete_reason(path)
    if why is not None:
        raise CheckpointError(f"checkpoint {path} is incomplete ({why}): pass an older checkpoint or "
                              f"--resume auto to take the newest complete one")
    why, note = checksum_problem(path)
    if why is not None:
        raise CheckpointError(f"checkpoint {path} is damaged: {why}; pass an older checkpoint or "
                              f"--resume auto to take the newest intact one")
    return path, [note] if note else []


def point_latest(output_dir: Path, run_dir: Path) -> None:
    """Atomically repoint <output_dir>/latest at run_dir (relative link)."""
    link = output_dir / "latest"
    tmp = output_dir / f".latest.{os.getpid()}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(os.path.relpath(run_dir, output_dir), tmp)
    os.replace(tmp, link)


PORTABLE_FILES = ("model.safetensors", "optimizer.safetensors")   # train/portable.py writes them


def layout_name(world: int, zero: int) -> str:
    return f"{world} process(es) with {'ZeRO-' + str(zero) if zero else 'DDP'}"


def layout_change_problem(old_world: int, old_zero: int, new_world: int, new_zero: int,
                          path: Path) -> str | None:
    """None when a checkpoint can resume on the new layout; else what to do instead.

    Same layout: always (DeepSpeed's own files). Another world size or ZeRO stage: through the
    world-size-free state every checkpoint holds (full fp32 weights and AdamW moments by name).
    """
    if old_world == new_world and old_zero == new_zero:
        return None
    missing = [f for f in PORTABLE_FILES if not (path / f).is_file()]
    if not missing:
        return None
    return (f"checkpoint {path.name} was written by {layout_name(old_world, old_zero)} and has no world-size-free "
            f"state ({', '.join(missing)} missing); this run has {layout_name(new_world, new_zero)}: use the same "
            f"GPU count and --set zero_stage={old_zero}, or start a new run from its weights with "
            f"--set pretrained_model_path={path / 'ema.safetensors'}")


def layout_change_note(ckpt: Path, new_world: int, new_cfg: dict) -> str | None:
    """What resuming `ckpt` with `new_world` processes and config `new_cfg` does (None: same
    layout). Raises CheckpointError if it cannot."""
    try:
        state = json.loads((ckpt / "trainer_state.json").read_text())
        old_world, old_zero = int(state["world_size"]), int(state["zero_stage"])
    except (OSError, ValueError, KeyError, TypeError):
        raise CheckpointError(f"checkpoint {ckpt} has no readable trainer_state.json: pass another checkpoint") \
            from None
    new_zero = new_cfg["zero_stage"]
    problem = layout_change_problem(old_world, old_zero, new_world, new_zero, ckpt)
    if problem:
        raise CheckpointError(problem)
    if old_world == new_world and old_zero == new_zero:
        return None
    note = (f"{ckpt.name} was written by {layout_name(old_world, old_zero)}, this run has "
            f"{layout_name(new_world, new_zero)}: the weights, AdamW moments and step, schedule, EMA and Seraena "
            f"carry over through its world-size-free state; ")
    if old_world != new_world:
        note += "the data order is reshuffled and the random streams restart from the seed for the new world size"
    else:
        note += "the data order and random streams continue"
    old_cfg, changes = state.get("config") or {}, []
    if old_cfg:
        def batch(cfg: dict, world: int) -> int:
            return int(cfg["train_batch_size"]) * int(cfg["gradient_accumulation_steps"]) * world
        try:
            if batch(old_cfg, old_world) != batch(new_cfg, new_world):
                changes.append(f"global batch {batch(old_cfg, old_world)} -> {batch(new_cfg, new_world)}")
            if float(old_cfg["learning_rate"]) != float(new_cfg["learning_rate"]):
                changes.append(f"learning rate {old_cfg['learning_rate']:g} -> {new_cfg['learning_rate']:g}")
        except (KeyError, TypeError, ValueError):
            pass
    return note + (f" ({', '.join(changes)})" if changes else "")
