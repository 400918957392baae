"""<run>/manifest.jsonl: the reproducibility manifest, one JSON record per launch of the run (appended,
never rewritten). Written by the launcher (run/), read by `taehv-launch status`/`diff` and attached
to the trackers as the run's config.
"""

from __future__ import annotations

import json
from pathlib import Path

MANIFEST_FILE = "manifest.jsonl"


def read_manifest(run_dir: Path) -> list[dict]:
    """Every launch's record, oldest first; [] when there is none. Unreadable lines are skipped."""
    try:
        lines = (Path(run_dir) / MANIFEST_FILE).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out
