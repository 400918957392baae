"""The run directory's names that the launcher and the trainer both use.

Layout: <output_dir>/<run id>/checkpoint-<step>/ (checkpoint.py), best_model/ and final_model/
(exports of the EMA TAEHV under upstream's name for the family and decoder: `<stem>.safetensors`,
`<stem>.pth` (e.g. taecvx, taew2_2_super), export.json listing them with their SHA-256; exports before
#36 hold taehv.safetensors and taehv.pth whatever the family), exit_status[.node<k>].json (exitstatus.py),
REQUEUE; <output_dir>/latest -> the newest run (run/runs.py repoints it), and the run directories
newest first (runs_newest_first: the launcher's --resume auto and `taehv-launch status` list them).
"""

from __future__ import annotations

import json
from pathlib import Path

REQUEUE = "REQUEUE"  # marker in the run dir: stopped by a signal after saving
BEST_MODEL = "best_model"  # export at the best validation PSNR
FINAL_MODEL = "final_model"  # export at the end of training
EXPORT_META = "export.json"  # step, val PSNR, family, decoder, model settings, files and SHA-256 of an export
# Every export before #36 was named so, whatever the family (upstream reads "taehv" as Hunyuan Video 1):
LEGACY_SAFETENSORS, LEGACY_PTH = "taehv.safetensors", "taehv.pth"
EXPORT_SAFETENSORS = LEGACY_SAFETENSORS  # old name of the constant: use export_weights(folder)
LATEST = "latest"
# Names the tool itself keeps in output_dir beside the run directories: `latest` (the link to the
# newest run) and `mlruns` (the MLflow file store, train/loop/trackers.py). The dot-names
# (.index, .compile-cache, .latest.<pid>) cannot be run names: run/runs.py's RUN_ID_RE refuses a leading dot.
RESERVED_NAMES = (LATEST, "mlruns")


def node_suffix(node: int) -> str:
    """ "" on node 0, ".node<k>" on the others: per-node files (launch log, env, exit status)."""
    return "" if node == 0 else f".node{node}"


def launcher_lock_path(run_dir: Path, node: int) -> Path:
    """.lock[.node<k>]: node k's launcher holds an exclusive flock on it for as long as it runs, and
    records who it is in it (host, pid, start time; run/lock.py): one launch per run directory and node."""
    return Path(run_dir) / f".lock{node_suffix(node)}"


def trainer_lock_path(run_dir: Path, node: int) -> Path:
    """.lock[.node<k>].trainer: every trainer process of node k's launch holds a shared flock on it while
    it runs (train/durability/stop.py); a launch of the run is refused while one does (run/lock.py)."""
    return Path(run_dir) / f".lock{node_suffix(node)}.trainer"


def exported_step(folder: Path) -> int | None:
    """The step an export (best_model, final_model) was written at, from its export.json."""
    try:
        return int(json.loads((folder / EXPORT_META).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def export_weights(folder: Path, suffix: str = ".safetensors") -> Path:
    """An export's weight file: the one its export.json lists (`taecvx.safetensors` ...), else the name of
    exports before #36 (taehv.safetensors). suffix: ".safetensors" or ".pth"."""
    try:
        files = json.loads((folder / EXPORT_META).read_text()).get("files")
        listed = [name for name in files if isinstance(name, str) and name.endswith(suffix)]
    except (OSError, ValueError, AttributeError, TypeError):
        listed = []
    return folder / (listed[0] if listed else ("taehv" + suffix))


def runs_newest_first(output_dir: Path) -> list[Path]:
    if not output_dir.is_dir():
        return []
    runs = []
    for p in output_dir.iterdir():
        if p.name.startswith(".") or p.name in RESERVED_NAMES or p.is_symlink() or not p.is_dir():
            continue
        try:
            runs.append((p.stat().st_mtime, p))
        except OSError:
            continue
    return [p for _, p in sorted(runs, key=lambda t: t[0], reverse=True)]
