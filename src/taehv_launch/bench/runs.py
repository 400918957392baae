"""The real runs `bench compare` measures: the assets they train on and the launcher as a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from ..errors import LaunchError
from ..plan.families import get_family


# ----------------------------------------------------------------------------- the real trainer


def make_assets(
    cfg: dict[str, Any], device: torch.device, workdir: Path, data_root: str | None, log: Callable[[str], None]
) -> tuple[str, str]:
    """(data_root, ref_vae_path): video files at the profile's size and a reference VAE folder."""
    from ..train.data.synthetic import _build_once, make_tiny_ref_vae, write_demo_videos

    workdir.mkdir(parents=True, exist_ok=True)
    h, w, kind = cfg["height"], cfg["width"], cfg["ref_vae_type"]
    if not data_root:
        data_root = str(workdir / f"videos_{h}x{w}")
        n_frames = max(48, 2 * cfg["n_frames"] * cfg["max_frame_delta"])
        if not os.path.isdir(data_root):
            log(f"bench: writing 16 synthetic {w}x{h} videos to {data_root}")
        _build_once(data_root, lambda tmp: write_demo_videos(tmp, 16, h, w, n_frames))
    real_arch = device.type == "cuda"
    ref_path = str(workdir / f"ref_vae_{kind}_{'real' if real_arch else 'tiny'}_c{cfg['latent_channels']}")

    def build(tmp: str) -> None:
        if real_arch:  # the family's real architecture (class default + real_config), random weights
            import diffusers

            torch.manual_seed(0)
            family = get_family(kind)
            getattr(diffusers, family.class_name)(**family.real_config).to(torch.bfloat16).save_pretrained(
                os.path.join(tmp, "vae")
            )
        else:
            make_tiny_ref_vae(kind, os.path.join(tmp, "vae"), cfg["latent_channels"])

    if not os.path.isdir(ref_path):
        log(
            f"bench: saving a {'real-architecture' if real_arch else 'tiny'} {kind} VAE with random weights "
            f"to {ref_path}"
        )
    _build_once(ref_path, build)
    return data_root, ref_path


class RowNotMeasured(LaunchError):
    """A trainer run that failed, wrote no speed.json or ran past its time: bench compare makes it a row that
    says so (the from-cache rows) or stops with it (the online row)."""


def run_launcher(argv: list[str], log_file: Path, timeout: float | None) -> tuple[int | None, str]:
    """Run a `taehv-launch` command; (exit code, output), exit code None when it ran past `timeout` seconds and
    was stopped: the launcher first (no restart in place can follow), then every process it had started (the
    ranks run in sessions of their own, so a process group signal would miss them)."""
    import psutil

    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        try:
            launcher = psutil.Process(proc.pid)
            tree = [launcher, *launcher.children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        for p in tree:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(tree, timeout=30)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # a process started after the list above still holds the output
            out = "(the output could not be read: a process of the stopped run still holds it)\n"
        code = None
    log_file.write_text(out)
    return code, out


def trainer_row(
    gpus: str,
    profile: str,
    sets: list[str],
    workdir: Path,
    data_root: str,
    ref_path: str,
    steps: int,
    profile_phases: bool,
    log: Callable[[str], None],
    timeout: float | None = None,
    tag: str = "",
) -> dict[str, Any]:
    """Run the real trainer through the launcher and read its speed.json. A run that fails or outlasts
    `timeout` raises RowNotMeasured (a LaunchError) saying which and why."""
    run_name = f"bench-{time.strftime('%Y%m%d-%H%M%S')}{tag}{'-profile' if profile_phases else ''}"
    argv = [
        sys.executable,
        "-m",
        "taehv_launch.cli",
        gpus,
        profile,
        "--run-name",
        run_name,
        "--set",
        f"data_root={data_root!r}",
        "--set",
        f"ref_vae_path={ref_path!r}",
        "--set",
        f"max_train_steps={steps}",
        "--set",
        f"log_every={max(1, steps // 4)}",
        "--set",
        f"validation_steps={steps}",
        "--set",
        f"checkpointing_steps={steps}",
        "--set",
        "lr_warmup_steps=1",
        "--set",
        "max_restarts=0",  # a run that fails is measured as failed, not restarted within the bench's time
    ]
    for s in sets:
        argv += ["--set", s]
    argv += ["--set", f"output_dir={str(workdir / 'output')!r}"]  # after any --set output_dir: read back below
    if profile_phases:
        argv += ["--profile", "--set", "profile_steps=3"]
    log(
        f"bench: running the trainer: taehv-launch {gpus} {profile} ... ({steps} steps"
        f"{', --profile' if profile_phases else ''})"
    )
    t0 = time.perf_counter()
    code, out = run_launcher(argv, workdir / f"{run_name}.log", timeout)
    run_dir = workdir / "output" / run_name
    if code is None:
        raise RowNotMeasured(
            f"the trainer run ran past its {timeout:.0f} s and was stopped (log: {workdir / (run_name + '.log')})"
        )
    if code != 0:
        tail = " | ".join(out.strip().splitlines()[-3:])
        raise RowNotMeasured(
            f"the trainer run for the comparison failed (exit {code}): {tail} "
            f"(full log: {workdir / (run_name + '.log')})"
        )
    speed_file = run_dir / "speed.json"
    if not speed_file.is_file():
        raise RowNotMeasured(f"the trainer wrote no {speed_file}: run more steps (--trainer-steps)")
    out = json.loads(speed_file.read_text())
    out |= {"what": "ours (real trainer)", "wall_s": time.perf_counter() - t0, "run_dir": str(run_dir)}
    return out


def cache_row(
    gpus: str,
    profile: str,
    sets: list[str],
    workdir: Path,
    data_root: str,
    ref_path: str,
    views: int,
    log: Callable[[str], None],
    timeout: float | None = None,
) -> tuple[dict[str, Any], str]:
    """Run `taehv-launch cache` on the bench data (a fresh cache) and read its cache_speed.json;
    returns the row and the cache's path. Stopped after `timeout` seconds (a LaunchError)."""
    import shutil

    run_name = f"cache-{time.strftime('%Y%m%d-%H%M%S')}"
    cache = workdir / "latent-cache"
    shutil.rmtree(cache, ignore_errors=True)
    argv = [
        sys.executable,
        "-m",
        "taehv_launch.cli",
        "cache",
        gpus,
        profile,
        "--views",
        str(views),
        "--run-name",
        run_name,
        "--set",
        f"latent_cache={str(cache)!r}",
        "--set",
        f"data_root={data_root!r}",
        "--set",
        f"ref_vae_path={ref_path!r}",
    ]
    for s in sets:
        argv += ["--set", s]
    argv += ["--set", f"output_dir={str(workdir / 'output')!r}"]  # after any --set output_dir: read back below
    log(f"bench: writing the latent cache: taehv-launch cache {gpus} {profile} --views {views} ...")
    t0 = time.perf_counter()
    code, out = run_launcher(argv, workdir / f"{run_name}.log", timeout)
    if code != 0:
        tail = " | ".join(out.strip().splitlines()[-3:])
        why = f"ran past its {timeout:.0f} s and was stopped" if code is None else f"failed (exit {code}): {tail}"
        raise LaunchError(f"the cache job for the comparison {why} (full log: {workdir / (run_name + '.log')})")
    speed = json.loads((workdir / "output" / run_name / "cache_speed.json").read_text())
    manifest = json.loads((cache / "manifest.json").read_text())
    rate = speed["steady_clips_per_s"] or speed["clips_per_s"]
    row = {
        "what": "cache job (encode once)",
        "detail": f"{manifest['clips']} clips, {views} views/video",
        "clips_per_s": rate,
        "peak_allocated_gib": speed["peak_allocated_gib"],
        "wall_s": time.perf_counter() - t0,
        "cache_bytes": manifest["bytes"],
        "bytes_per_clip": manifest["bytes"] / max(1, manifest["clips"]),
        "not_training": True,
        **{k: speed[k] for k in ("steady_clips_per_s", "seconds")},
    }
    return row, str(cache)


MIN_ROW_S = 30  # a trainer run given less cannot start, compile and measure: not started


def cached_run(
    req, work: Path, data: str, ref_path: str, steps: int, sets: list[str], timeout, left, tag, label, log
) -> dict:
    """One trainer run from the latent cache for bench compare, stopped after `timeout` s; not started when
    `left` (of the --deadline) is under MIN_ROW_S. A run that fails, is stopped or is not started is a row whose
    `not_measured` says which (clips_per_s None)."""
    if left is not None and left < MIN_ROW_S:
        why = f"not started: {max(left, 0):.0f} s of the --deadline left"
        log(f"bench: from the cache {label}: {why}")
        return {"clips_per_s": None, "not_measured": why}
    try:
        return trainer_row(req.gpus, req.profile, sets, work, data, ref_path, steps, False, log, timeout, tag)
    except RowNotMeasured as err:
        log(f"bench: from the cache {label}: {err}")
        return {"clips_per_s": None, "not_measured": str(err)}
