"""Run directories: the run id, `latest`, and which checkpoint `--resume` continues. Stdlib only:
used by the CLI. The names the trainer shares (REQUEUE, exit status, exports) are in rundir/, the
checkpoint format (names, COMPLETE marker, checksums, layouts) is rundir/checkpoint.py.

Layout: <output_dir>/<run id>/checkpoint-<step>/ ... ; <output_dir>/latest -> newest run.
"""

from __future__ import annotations

import errno
import os
import re
import time
from pathlib import Path

from ..errors import CheckpointError, ConfigError, LaunchError
from ..rundir.checkpoint import checkpoint_step, checksum_problem, incomplete_reason, newest_complete
from ..rundir.layout import BEST_MODEL, EXPORT_SAFETENSORS, FINAL_MODEL, LATEST, RESERVED_NAMES, runs_newest_first

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def run_id_for(run_name: str | None, job_id: str | None, now: float | None = None) -> tuple[str, str]:
    """(run id, where it came from): --run-name, else the scheduler's job id, else a timestamp."""
    if run_name:
        if not RUN_ID_RE.match(run_name):
            raise ConfigError(
                f"--run-name {run_name!r} must be letters, digits, '.', '_' or '-' "
                f"(at most 128, not starting with a symbol)"
            )
        if run_name.lower() in RESERVED_NAMES:
            raise ConfigError(
                f"--run-name {run_name!r} is reserved: taehv-launch keeps <output_dir>/{run_name.lower()} "
                f"itself ({' and '.join(RESERVED_NAMES)} are taken); pick another name"
            )
        return run_name, "--run-name"
    if job_id:
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", job_id)[:120]
        return f"job-{safe}", "scheduler job id"
    return time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(now)), "timestamp"


def latest_target(output_dir: Path) -> tuple[Path | None, str]:
    """Where <output_dir>/latest points: (the run directory, "") or (None, why it cannot be followed:
    missing, a link loop, dangling, not a link to a folder). Never raises."""
    link = output_dir / LATEST
    if not link.is_symlink():
        if not os.path.lexists(link):
            return None, ""
        return None, f"{link} is not the link taehv-launch keeps (it is a {'folder' if link.is_dir() else 'file'})"
    try:
        target = link.resolve(strict=True)
    except (OSError, RuntimeError) as exc:  # RuntimeError: a loop on Python < 3.13
        why = "a symlink loop" if "loop" in str(exc).lower() or "many levels" in str(exc).lower() else "dangling"
        return None, f"{link} is {why} ({os.readlink(link)!r})"
    if not target.is_dir():
        return None, f"{link} points at {target}, not a run folder"
    return target, ""


def latest_run(output_dir: Path) -> Path | None:
    target, _ = latest_target(output_dir)
    if target is not None:
        return target
    runs = runs_newest_first(output_dir)
    return runs[0] if runs else None


def check_latest_link(output_dir: Path) -> None:
    """Refuse before writing when <output_dir>/latest is a real folder or file: the launch repoints it
    and must not replace what someone put there. A loop or dangling link is repaired by the launch."""
    link = output_dir / LATEST
    if os.path.lexists(link) and not link.is_symlink():
        kind = "folder" if link.is_dir() else "file"
        raise ConfigError(
            f"{link} is a {kind}, but taehv-launch keeps a link to the newest run there: rename or move it "
            f"(or choose another --set output_dir)"
        )


THIS_RUN = "this-run"


def resolve_resume(resume: str, output_dir: Path, run_dir: Path | None) -> tuple[Path | None, list[str]]:
    """`auto` with a named run (run_dir: --run-name or the scheduler's job id) -> newest complete
    checkpoint of that run only, else start fresh: naming the run is how a user says which one.
    A named run whose checkpoints are all damaged or incomplete is refused (CheckpointError naming
    them), never started over; one with exports but no checkpoint is refused by check_rerun.
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
        if found is None and skipped:  # checkpoints, none of them usable: never start over them (#35)
            raise CheckpointError(damaged_line(resume, run_dir, skipped))
        if found is None:
            skipped.append(
                f"--resume {resume}: no complete checkpoint in {run_dir} yet; starting from scratch "
                f"(a named run resumes only its own checkpoints)"
            )
        return found, skipped
    if resume == "auto":
        latest, why = latest_target(output_dir)
        notes: list[str] = [f"--resume auto: {why}; looking at the runs in {output_dir}"] if why else []
        seen: set[Path] = set()
        for candidate in [latest, *runs_newest_first(output_dir)]:
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


def trained_contents(run_dir: Path) -> tuple[list[str], list[str]]:
    """What a launch from scratch would train over in a run folder: its checkpoint-<step> folders,
    complete or not (newest first), and its exports (best_model, final_model). The launch files,
    logs and a `.tmp-checkpoint-*` of a run that failed before its first checkpoint are not in it:
    such a folder may be launched again."""
    try:
        entries = list(run_dir.iterdir()) if run_dir.is_dir() else []
    except OSError:
        entries = []
    steps = sorted(((s, p.name) for p in entries if (s := checkpoint_step(p)) is not None and p.is_dir()), reverse=True)
    exports = [name for name in (BEST_MODEL, FINAL_MODEL) if os.path.lexists(run_dir / name)]
    return [name for _, name in steps], exports


def weights_hint(run_dir: Path, exports: list[str]) -> str:
    """How to start a new run from a run's exported weights ("" when it has none)."""
    if not exports:
        return ""
    folder = run_dir / (FINAL_MODEL if FINAL_MODEL in exports else exports[0])
    try:  # the export's own weight file, whatever its name (taehv.safetensors, or the family's)
        weights = min(folder.glob("*.safetensors"), default=folder / EXPORT_SAFETENSORS)
    except OSError:
        weights = folder / EXPORT_SAFETENSORS
    return f" (add --set pretrained_model_path={weights} to start from its weights)"


def check_rerun(run_dir: Path, resume: str | None) -> None:
    """A run folder that holds checkpoints or exports is never trained over from scratch (a rerun
    of a finished run's name replaced its final_model, and rotation deleted its checkpoints, #35):
    ConfigError in one line naming the folder and the ways out, before anything is written."""
    checkpoints, exports = trained_contents(run_dir)
    if not (checkpoints or exports):
        return
    shown = checkpoints[:3] + ([f"{len(checkpoints) - 3} older checkpoint(s)"] if len(checkpoints) > 3 else [])
    if resume in ("auto", THIS_RUN):
        how = f"--resume {resume} finds no checkpoint there to continue, so it"
    else:
        how = "a launch " + ("without --resume" if resume is None else f"with --resume {resume!r}")
    if checkpoints:
        ways = "continue it with --resume auto, or pick a new --run-name to start another run"
    else:
        ways = f"pick a new --run-name{weights_hint(run_dir, exports)}"
    raise ConfigError(
        f"run folder {run_dir} already holds a run ({', '.join(shown + exports)}): {how} would train from "
        f"scratch over it; {ways}"
    )


def damaged_line(resume: str, run_dir: Path, skipped: list[str]) -> str:
    """--resume auto/this-run of a named run whose every checkpoint is damaged or incomplete."""
    damaged = "; ".join(s.removeprefix("skipping ") for s in skipped)
    _, exports = trained_contents(run_dir)
    return (
        f"--resume {resume}: no checkpoint of run {run_dir} can be resumed, each is damaged or incomplete "
        f"({damaged}); continue from an intact copy with --resume PATH, or start over under a new "
        f"--run-name{weights_hint(run_dir, exports)}; the damaged checkpoints are left as they are"
    )


def point_latest(output_dir: Path, run_dir: Path) -> None:
    """Atomically repoint <output_dir>/latest at run_dir (relative link); a loop or dangling link is
    replaced, a real folder or file there is refused (LaunchError) and the temporary link removed."""
    link = output_dir / LATEST
    if run_dir.name in RESERVED_NAMES or run_dir.parent != output_dir:
        raise LaunchError(f"cannot point {link} at {run_dir}: not a run folder of {output_dir}")
    tmp = output_dir / f".latest.{os.getpid()}"
    try:
        if os.path.lexists(tmp):
            tmp.unlink()
        os.symlink(os.path.relpath(run_dir, output_dir), tmp)
        if os.path.lexists(link) and not link.is_symlink():
            raise IsADirectoryError(errno.EISDIR, "not a link", str(link))
        os.replace(tmp, link)
    except OSError as exc:
        try:
            if os.path.lexists(tmp):
                tmp.unlink()
        except OSError:
            pass
        raise LaunchError(
            f"cannot point {link} at {run_dir.name}: {exc.strerror or exc}; rename or remove {link} "
            f"(taehv-launch keeps a link to the newest run there)"
        ) from None
