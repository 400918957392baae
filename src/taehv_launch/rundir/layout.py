"""The run directory's names that the launcher and the trainer both use.

Layout: <output_dir>/<run id>/checkpoint-<step>/ (checkpoint.py), best_model/ and final_model/
(exports of the EMA TAEHV: taehv.safetensors, taehv.pth, export.json), exit_status[.node<k>].json
(status.py), REQUEUE; <output_dir>/latest -> the newest run (run/runs.py).
"""

from __future__ import annotations

import json
from pathlib import Path

REQUEUE = "REQUEUE"  # marker in the run dir: stopped by a signal after saving
BEST_MODEL = "best_model"  # export at the best validation PSNR
FINAL_MODEL = "final_model"  # export at the end of training
EXPORT_SAFETENSORS = "taehv.safetensors"  # an export's EMA TAEHV weights (loads in public taehv.py)
EXPORT_PTH = "taehv.pth"  # the same weights as a torch state dict
EXPORT_META = "export.json"  # step, val PSNR, model settings of an export


def node_suffix(node: int) -> str:
    """ "" on node 0, ".node<k>" on the others: per-node files (launch log, env, exit status)."""
    return "" if node == 0 else f".node{node}"


def exported_step(folder: Path) -> int | None:
    """The step an export (best_model, final_model) was written at, from its export.json."""
    try:
        return int(json.loads((folder / EXPORT_META).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
