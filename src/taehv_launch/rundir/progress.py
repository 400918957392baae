"""<run>/progress.json: where training stands, rewritten by the trainer's rank 0 at each log line and
read by `taehv-launch status` (which never writes).

{"step", "total", "samples_per_s" (this log window), "samples_per_s_avg" (since this launch started),
 "global_batch", "eta_s", "time" (the writer's clock, seconds since the epoch), "started" (this launch)}
"""

from __future__ import annotations

import json
from pathlib import Path

from ..files import write_atomic

PROGRESS_FILE = "progress.json"


def write_progress(run_dir: Path, record: dict) -> None:
    write_atomic(Path(run_dir) / PROGRESS_FILE, json.dumps(record))


def read_progress(run_dir: Path) -> dict | None:
    try:
        rec = json.loads((Path(run_dir) / PROGRESS_FILE).read_text())
        return rec if isinstance(rec, dict) else None
    except (OSError, ValueError):
        return None
