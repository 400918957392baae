"""Run directories: the run id, `latest`, and which checkpoint `--resume` continues. Stdlib only:
used by the CLI. The names the trainer shares (REQUEUE, exit status, exports) are in rundir/, the
checkpoint format (names, COMPLETE marker, checksums, layouts) is rundir/checkpoint.py.

Layout: <output_dir>/<run id>/checkpoint-<step>/ ... ; <output_dir>/latest -> newest run.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from ..errors import CheckpointError, ConfigError
from ..rundir.checkpoint import checkpoint_step, checksum_problem, incomplete_reason, newest_complete

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def run_id_for(run_name: str | None, job_id: str | None, now: float | None = None) -> tuple[str, str]:
    """(run id, where it came from): --run-name, else the scheduler's job id, else a timestamp."""
    if run_name:
        if not RUN_ID_RE.match(run_name):
            raise ConfigError(
                f"--run-name {run_name!r} must be letters, digits, '.', '_' or '-' "
                f"(at most 128, not starting with a symbol)"
            )
        return run_name, "--run-name"
    if job_id:
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", job_id)[:120]
        return f"job-{safe}", "scheduler job id"
    return time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(now)), "timestamp"


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


THIS_RUN = "this-run"


def resolve_resume(resume: str, output_dir: Path, run_dir: Path | None) -> tuple[Path | None, list[str]]:
    """`auto` with a named run (run_dir: --run-name or the scheduler's job id) -> newest complete
    checkpoint of that run only, else start fresh: naming the run is how a user says which one.
    `auto` without a name (each launch gets a new timestamped run) -> the newest complete checkpoint
    of the newest run that has one (a run that failed before its first checkpoint is passed over);
    the caller continues in that checkpoint's run directory. None: start fresh.

    `this-run` -> newest complete checkpoint of this named run only (run_dir, from --run-name or the
    scheduler's job id), else start fresh: what a requeued SLURM job or a restarted Kubernetes pod
    wants, without picking up another run's checkpoint on its first start.

    A path -> that checkpoint (or the newest complete one inside a run dir); missing or
    incomplete is an error.
    """
    if resume == THIS_RUN and run_dir is None:
        raise CheckpointError(
            "--resume this-run needs a named run: pass --run-name NAME, or run under a "
            "scheduler job id (SLURM_JOB_ID, a Kubernetes Job name)"
        )
    if resume in (THIS_RUN, "auto") and run_dir is not None:
        found, skipped = newest_complete(run_dir, verify=True) if run_dir.is_dir() else (None, [])
        if found is None:
            skipped.append(
                f"--resume {resume}: no complete checkpoint in {run_dir} yet; starting from scratch "
                f"(a named run resumes only its own checkpoints)"
            )
        return found, skipped
    if resume == "auto":
        notes: list[str] = []
        seen: set[Path] = set()
        for candidate in [latest_run(output_dir), *runs_newest_first(output_dir)]:
            if candidate is None or candidate.resolve() in seen:
                continue
            seen.add(candidate.resolve())
            found, skipped = newest_complete(candidate, verify=True)
            notes += skipped
            if found is not None:
                return found, notes + [
                    f"--resume auto: continuing run {found.parent.name} from {found.name} (in {found.parent})"
                ]
        return None, notes + ["--resume auto: no complete checkpoint found; starting from scratch"]
    path = Path(resume).expanduser()
    if not path.exists():
        raise CheckpointError(
            f"resume checkpoint {str(path)!r} does not exist: pass a checkpoint-<step> "
            f"folder, a run folder, or --resume auto"
        )
    if not path.is_dir():
        raise CheckpointError(
            f"--resume {str(path)!r} is a file, not a checkpoint: pass a checkpoint-<step> "
            f"folder, a run folder, or --resume auto"
        )
    if checkpoint_step(path) is None and path.is_dir():  # a run directory
        found, skipped = newest_complete(path, verify=True)
        if found is None:
            raise CheckpointError(
                f"run folder {path} has no complete checkpoint"
                + (f" ({'; '.join(skipped)})" if skipped else "")
                + ": pass another folder or start without --resume"
            )
        return found, skipped
    why = incomplete_reason(path)
    if why is not None:
        raise CheckpointError(
            f"checkpoint {path} is incomplete ({why}): pass an older checkpoint or "
            f"--resume auto to take the newest complete one"
        )
    why, note = checksum_problem(path)
    if why is not None:
        raise CheckpointError(
            f"checkpoint {path} is damaged: {why}; pass an older checkpoint or "
            f"--resume auto to take the newest intact one"
        )
    return path, [note] if note else []


def point_latest(output_dir: Path, run_dir: Path) -> None:
    """Atomically repoint <output_dir>/latest at run_dir (relative link)."""
    link = output_dir / "latest"
    tmp = output_dir / f".latest.{os.getpid()}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(os.path.relpath(run_dir, output_dir), tmp)
    os.replace(tmp, link)
