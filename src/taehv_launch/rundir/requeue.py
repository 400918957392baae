"""<run>/requeue.json: how often a scheduler (sbatch, k8s) requeued this run and whether each
requeue made progress. Written by the requeue check the rendered job files run, read by
`taehv-launch status`.

{"count": requeues so far, "without_progress": requeues in a row that saved no new checkpoint,
 "last_checkpoint": the newest complete checkpoint's name at the last requeue (or null),
 "stopped": null, or the one line saying why requeueing stopped}
"""

from __future__ import annotations

import json
from pathlib import Path

REQUEUE_FILE = "requeue.json"


def read_requeues(run_dir: Path) -> dict | None:
    try:
        rec = json.loads((Path(run_dir) / REQUEUE_FILE).read_text())
        return rec if isinstance(rec, dict) else None
    except (OSError, ValueError):
        return None
