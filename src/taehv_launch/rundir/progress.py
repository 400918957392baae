"""<run>/progress.json: where training stands, rewritten by the trainer's rank 0 at each log line and
read by `taehv-launch status` (which never writes); <run>/validation.json: the newest validation's
results, rewritten by rank 0 after each validation (format below, VALIDATION_FILE).

{"step", "total", "samples_per_s" (this log window), "samples_per_s_avg" (since this launch started),
 "global_batch", "eta_s", "time" (the writer's clock, seconds since the epoch), "started" (this launch),
 and where the trainer counted its FLOPs (plan/flops.py), over this log window: "tflops_per_gpu", "mfu"
 (0-1; null without a peak), "peak_tflops_per_gpu" (null: a CPU or a GPU not in the table), "mfu_note"
 (why there is no MFU), "launch_id" (the launch that wrote it, rundir/launchid.py: `status` tells this
launch's progress from an earlier one's by it), "attempt" (the restart attempt in that launch that wrote it), "launch_ids" (every rank's launch id, one per
node's launcher, gathered at the trainer's start: which nodes' records are this launch's, rundir/launches.py)}
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

from ..files import read_json_or_none, write_atomic
from .launches import ThisLaunch
from .launchid import ATTEMPT_FIELD, LAUNCH, stamped
from .records import LONGEST_S, TIME, Field, Number, Record, Text, Whole, number

PROGRESS_FILE = "progress.json"


def write_progress(run_dir: Path, record: dict) -> None:
    write_atomic(Path(run_dir) / PROGRESS_FILE, json.dumps(stamped(record)))


PROGRESS = Record(
    PROGRESS_FILE,
    (
        Field("step", Whole(), required=True),
        Field("total", Whole(1)),  # 0: unknown
        Field("samples_per_s", Number()),
        Field("samples_per_s_avg", Number()),
        Field("global_batch", Whole(1)),
        Field("eta_s", Number(high=LONGEST_S)),
        Field("time", TIME),
        Field("started", TIME),
        LAUNCH,
        ATTEMPT_FIELD,
    ),
)
# where the trainer counted its FLOPs, over the log window; none: an older trainer
FLOPS = Record(
    "flops",
    (
        Field("tflops_per_gpu", Number(high=1e6), required=True),
        Field("mfu", Number(high=10.0)),
        Field("peak_tflops_per_gpu", Number(high=1e6)),
        Field("mfu_note", Text(200)),
    ),
)


def read_progress(run_dir: Path) -> dict | None:
    """The record with every field checked (a field of another type, NaN or out of range is None), or
    None when there is none or it is unusable (not an object, no whole-number step)."""
    raw = read_json_or_none(Path(run_dir) / PROGRESS_FILE)
    rec = PROGRESS.parse(raw).record
    return None if rec is None else {**rec, "flops": FLOPS.parse(raw).record}


def read_text_part(path: Path, limit: int, tail: bool = True) -> str:
    """The last (or first) `limit` bytes of a regular file as text; "" for anything else (a FIFO, a device,
    a folder): never blocks. OSError: missing or unreadable."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return ""
        if tail:
            f.seek(max(0, st.st_size - limit))
        return f.read(limit).decode(errors="replace")


STEP_LINE = re.compile(  # the trainer's log line (train/loop/timing.py)
    r"^step (\d+)/(\d+) \|.*\| ([\d.]+) samples/s \|.*ETA (?:(\d+) days?, )?(\d+):(\d\d):(\d\d)", re.M
)
BANNER = "\n=== taehv-launch "  # run/launch.py starts each launch's part of a launch log with it


def this_launch(log: str) -> tuple[str, str]:
    """(the log text of the newest launch, that of the earlier ones) of a launch log's tail."""
    cut = log.rfind(BANNER)
    return (log[cut:], log[:cut]) if cut >= 0 else (log, "")


def progress_of(run_dir: Path, log: str, log_name: str, log_mtime: float | None, launch: ThisLaunch | None) -> dict:
    """step, total, clips/s now and average, ETA at the record's time: progress.json, else the last step
    line of the launch log's tail (`log`). What an earlier launch of the run wrote (progress.json of
    another launch than `launch`, rundir/launches.py; a step line above the log's last banner) gives its
    step and total only, with "of": "previous launch". {} when there is neither."""
    rec = read_progress(run_dir)
    if rec is not None:
        at = rec["started"] if rec["started"] is not None else rec["time"]  # without a launch id: by time
        out = {
            "step": rec["step"],
            "total": rec["total"],
            "clips_per_s": rec["samples_per_s"],
            "clips_per_s_avg": rec["samples_per_s_avg"],
            "global_batch": rec["global_batch"],
            "eta_s": rec["eta_s"],
            "progress_time": rec["time"],
            "launch_started": rec["started"],
            "progress_from": PROGRESS_FILE,
            "flops": rec["flops"],
        }
        return _previous(out) if launch is not None and not launch.holds(rec, started=at) else out
    current, earlier = this_launch(log)
    old = False
    found = list(STEP_LINE.finditer(current))
    if not found:
        found, old = list(STEP_LINE.finditer(earlier)), True
    if not found:
        return {}
    m = found[-1]
    days, h, mi, s = (int(x or 0) for x in m.group(4, 5, 6, 7))
    out = {
        "step": int(m.group(1)),
        "total": int(m.group(2)) or None,
        "clips_per_s": number(float(m.group(3))),
        "clips_per_s_avg": None,
        "global_batch": None,
        "eta_s": number(float(days * 86400 + h * 3600 + mi * 60 + s), LONGEST_S),
        "progress_time": log_mtime,
        "launch_started": None,
        "progress_from": log_name,
        "flops": None,
    }
    return _previous(out) if old else out


def _previous(progress: dict) -> dict:
    """An earlier launch's progress: where it got to, nothing about this launch's speed or end."""
    keep = ("step", "total", "global_batch", "progress_time", "progress_from")
    return {**{k: (v if k in keep else None) for k, v in progress.items()}, "of": "previous launch"}


VALIDATION_FILE = "validation.json"
# {"step", "time" (the writer's clock), "model": "ema", "clips" (clips measured over every rank),
#  "psnr" (dB), "ssim", "flicker", "lpips" (null: not measured, "lpips_note" says why), "lpips_note",
#  "best_step", "best_psnr" (the best validation PSNR so far, best_model/'s)}: train/loop/evaluate.py.
# A trainer from before flicker and LPIPS wrote no file: its log's validation lines give step, PSNR, SSIM.
VALIDATION_LINE = re.compile(  # train/loop/evaluate.py's log line; flicker and lpips since #37
    r"^(?:\[rank \d+\] )?validation at step (\d+): psnr ([-\d.]+|nan|inf) dB, ssim ([-\d.]+|nan)"
    r"(?:, flicker ([\d.]+|n/a))?(?:, lpips ([\d.]+|n/a))?",
    re.M,
)


def write_validation(run_dir: Path, record: dict) -> None:
    write_atomic(Path(run_dir) / VALIDATION_FILE, json.dumps(stamped(record)))


SCORES = (
    Field("psnr", Number(-1e3, 1e3)),
    Field("ssim", Number(-1.0, 1.0)),
    Field("flicker", Number(0.0, 1.0)),
    Field("lpips", Number(0.0, 10.0)),
)
VALIDATION = Record(
    VALIDATION_FILE,
    (
        Field("step", Whole(), required=True),
        Field("time", TIME),
        Field("model", Text(40)),
        Field("clips", Whole()),
        *SCORES,
        Field("lpips_note", Text(300)),
        Field("best_step", Whole()),
        Field("best_psnr", Number(-1e3, 1e3)),
    ),
)
LOG_SCORES = Record("validation line", SCORES)


def validation_of(run_dir: Path, log: str, log_name: str) -> dict | None:
    """The newest validation: validation.json with every field checked (a field of another type or out
    of range is None), else the last validation line of the launch log's tail (`log`; a run from before
    validation.json: step, PSNR and SSIM, flicker and LPIPS None). None when there is neither. "from"
    says which."""
    rec = VALIDATION.parse(read_json_or_none(Path(run_dir) / VALIDATION_FILE)).record
    if rec is not None:
        return {**rec, "from": VALIDATION_FILE}
    found = list(VALIDATION_LINE.finditer(log))
    if not found:
        return None
    m = found[-1]
    scores = {}
    for name, text in zip(("psnr", "ssim", "flicker", "lpips"), m.group(2, 3, 4, 5)):
        try:
            scores[name] = float(text)
        except (TypeError, ValueError):  # absent (an older trainer's line), n/a
            pass
    return {
        "step": int(m.group(1)),
        "time": None,
        "model": "ema",
        "clips": None,
        **LOG_SCORES.parse(scores).record,  # type: ignore[dict-item]
        "lpips_note": None,
        "best_step": None,
        "best_psnr": None,
        "from": log_name,
    }
