"""The reproducibility manifest's facts, collected at launch (rundir/manifest.py has the format).

Cheap by design, and nothing heavy is imported: package versions come from their installed metadata
(importlib.metadata), torch's CUDA from its version.py read as text, NCCL from the nvidia-nccl wheel's
metadata, the GPU model, driver and the driver's CUDA from one `nvidia-smi` call when there is one,
the commit from `git` when taehv_launch runs from a checkout. The data index's fingerprint is the key
of its cache file (dataindex/index.py): one stat() of data_root or of the annotation file, never a
listing of the videos.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import socket
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import UserError, one_line
from ..files import RECORD_LIMIT
from ..plan.resolve import Plan
from ..rundir.manifest import (
    ManifestRead,
    FORMAT,
    append_manifest,
    manifest_notes,
    manifest_path,
    manifest_size,
    plan_hash,
    read_manifest_file,
    strategy_name,
)
from .render import Rendered, render

PACKAGES = (
    "torch",
    "accelerate",
    "deepspeed",
    "diffusers",
    "transformers",
    "numpy",
    "safetensors",
    "opencv-python-headless",  # the CPU video decoder (cv2)
    "av",  # PyAV: the field order of each stream (interlaced files are skipped under OpenCV >= 4.13)
    "PyNvVideoCodec",  # the GPU video decoder (the [nvdec] extra)
)
NCCL_PACKAGES = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")
PACKAGE_DIR = Path(__file__).resolve().parent.parent  # src/taehv_launch
TOOL_TIMEOUT_S = 10.0


def package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def torch_cuda() -> str | None:
    """The CUDA torch was built with (torch.version.cuda), read from torch/version.py without importing torch."""
    try:
        spec = importlib.util.find_spec("torch")
        locations = list(spec.submodule_search_locations or []) if spec else []
        text = (Path(locations[0]) / "version.py").read_text() if locations else ""
    except (ImportError, ValueError, OSError):
        return None
    m = re.search(r"^cuda\s*(?::[^=]+)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return m.group(1) if m else None


def _tool(*argv: str, cwd: Path | None = None) -> str | None:
    """A tool's stdout, or None when it is missing, fails or takes longer than TOOL_TIMEOUT_S."""
    try:
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=TOOL_TIMEOUT_S,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},  # git status never takes .git/index.lock
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _git(*args: str) -> str | None:
    """`git --no-optional-locks ARGS`: reads only, so a `diff` or a launch never writes .git/index.lock
    in the tool's checkout (nor blocks a git command the user runs there meanwhile)."""
    return _tool("git", "--no-optional-locks", *args)


def gpu_facts() -> tuple[dict | None, str | None]:
    """({"model", "count", "driver", "memory_mib"} of this machine's GPUs, the driver's CUDA version), or
    (None, None) without nvidia-smi. Several models: the first one's name and the count of all."""
    out = _tool("nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader,nounits")
    if not out or not out.strip():
        return None, None
    rows = [[c.strip() for c in line.split(",")] for line in out.strip().splitlines()]
    models = sorted({r[0] for r in rows})
    try:
        memory = int(float(rows[0][2]))
    except (IndexError, ValueError):
        memory = None
    gpu = {
        "model": " + ".join(models),
        "count": len(rows),
        "driver": rows[0][1] if len(rows[0]) > 1 else None,
        "memory_mib": memory,
    }
    header = _tool("nvidia-smi") or ""
    m = re.search(r"CUDA Version:\s*([\d.]+)", header)
    return gpu, (m.group(1) if m else None)


def git_facts(package_dir: Path = PACKAGE_DIR) -> dict | None:
    """{"commit", "dirty", "checkout"} when taehv_launch runs from a git checkout (its files tracked
    there, not a copy in a site-packages that happens to sit inside some repository); else None.
    dirty: tracked files changed (untracked files do not count)."""
    if not (package_dir / "__init__.py").is_file():
        return None
    top = _git("-C", str(package_dir), "rev-parse", "--show-toplevel")
    if top is None or _git("-C", str(package_dir), "ls-files", "--error-unmatch", "__init__.py") is None:
        return None
    commit = (_git("-C", str(package_dir), "rev-parse", "--verify", "--quiet", "HEAD") or "").strip()
    status = _git("-C", top.strip(), "status", "--porcelain", "--untracked-files=no")
    return {
        "commit": commit or None,
        "dirty": bool(status.strip()) if status is not None else None,
        "checkout": top.strip(),
    }


@lru_cache(maxsize=1)
def machine_facts() -> dict[str, Any]:
    """What this machine runs: host, GPUs, versions. The same for every plan of one process."""
    gpu, cuda_driver = gpu_facts()
    from .. import __version__

    nccl = next((v for v in map(package_version, NCCL_PACKAGES) if v), None)
    return {
        "environment": {"host": socket.gethostname(), "gpu": gpu, "cuda_driver": cuda_driver},
        "versions": {
            "taehv-launch": __version__,
            "git": git_facts(),
            "python": platform.python_version(),
            "torch_cuda": torch_cuda(),
            "nccl": nccl,
            "packages": {name: package_version(name) for name in PACKAGES},
        },
    }


def data_fingerprint(plan: Plan) -> dict[str, Any]:
    """{"index", "key", "cache_file", "note"}: the fingerprint of the dataset index the run reads (the key
    that names its cache file, dataindex/index.py), from one stat(). The cpu demo's synthetic set is
    named by its folder (the trainer makes it on the first run)."""
    from ..dataindex.index import index_name

    c = plan.config
    if c["latent_cache"] and c["latent_cache_encode"] == "never":
        return {"index": None, "key": None, "cache_file": None, "note": "videos are not read: latent_cache"}
    if plan.demo_assets[0] and c["data_root"] == plan.demo_assets[0] and not c["annotation_file"]:
        key: dict[str, Any] = {"demo": c["data_root"]}
        return {"index": index_name(key), "key": key, "cache_file": None, "note": "the cpu demo's synthetic videos"}
    from types import SimpleNamespace

    from ..dataindex.index import check_root, index_dir, index_key

    try:
        key = index_key(check_root(c["data_root"], c["annotation_file"]), c["annotation_file"], False)
    except (OSError, UserError) as exc:  # the launch checked data_root; a plan for elsewhere may not see it
        return {"index": None, "key": None, "cache_file": None, "note": f"not read here: {one_line(str(exc))}"}
    fp = index_name(key)
    cache = Path(index_dir(SimpleNamespace(**c))) / f"index-{fp}.npz"
    return {"index": fp, "key": key, "cache_file": str(cache), "note": None}


def build_record(plan: Plan, rendered: Rendered, run_dir: Path, *, launch: int = 1, argv: list[str] | None = None):
    """This launch's manifest record (rundir/manifest.py), machine facts included."""
    topo, c = plan.topology, plan.config
    strategy = strategy_name(c["zero_stage"], plan.world_size)
    topology = {
        "num_machines": topo.num_machines,
        "gpus_per_machine": topo.gpus_per_machine,
        "world_size": topo.world_size,
    }
    config = json.loads(json.dumps(c, default=str))  # tuples as lists: as it reads back
    facts = machine_facts()
    return {
        "format": FORMAT,
        "time": time.time(),
        "node": topo.machine_rank,
        "launch": launch,
        "run_dir": str(run_dir),
        "run_id": Path(run_dir).name,
        "run_id_source": plan.run_id_source,
        "task": plan.options.task,
        "resume": plan.options.resume,
        "command": {"argv": ["taehv-launch", *(sys.argv[1:] if argv is None else argv)], "cwd": os.getcwd()},
        "plan": {
            "gpus": plan.gpus,
            "profile": plan.profile.name,
            "row_source": plan.row_source,
            **topology,
            "strategy": strategy,
            "global_batch": plan.global_batch_size,
            "hash": plan_hash(config, topology, strategy),
        },
        "config": config,
        "data": data_fingerprint(plan),
        "environment": {
            **facts["environment"],
            "exported": rendered.exported(),
            "kept": {k: v.value for k, v in rendered.env.items() if v.kept},
        },
        "versions": facts["versions"],
    }


def plan_record(fields: dict[str, Any], argv: list[str]) -> dict[str, Any]:
    """The manifest record a launch of this plan would write here and now (Request fields as
    `taehv-launch diff` parses a plan side; argv as typed): resolved, rendered in memory, nothing written."""
    from .request import Request, build_plan

    plan = build_plan(Request(**fields))
    return build_record(plan, render(plan, plan.run_dir), plan.run_dir, argv=argv)


def record_launch(plan: Plan, rendered: Rendered, run_dir: Path) -> list[str]:
    """Append this launch's record to the run's manifest (this node's file) and return the notes: on
    a later launch of the run, what changed since the previous one. A manifest that cannot be read,
    written or compared (unwritable, hand-edited, damaged) is a note, never a failed launch."""
    node = plan.topology.machine_rank
    path = manifest_path(run_dir, node)
    previous, skipped, problem = read_manifest_file(run_dir, node)
    notes = [f"manifest: {one_line(problem)}; this launch's record is not written"] if problem else []
    if skipped:
        notes.append(f"manifest: {skipped} unreadable line(s) of {path} left out")
    if problem:
        return notes
    try:
        size = manifest_size(run_dir, node)  # over RECORD_LIMIT: `previous` is its tail, counted on from its newest
        done = ManifestRead(previous, skipped, None, size is None or size <= RECORD_LIMIT).launches or 0
        record = build_record(plan, rendered, run_dir, launch=done + 1)
        append_manifest(run_dir, record, node)
    except OSError as exc:
        return [*notes, f"manifest: could not write {path}: {exc.strerror or exc}"]
    except Exception as exc:  # noqa: BLE001 - the record is bookkeeping: the launch goes on without it
        return [*notes, f"manifest: no record written ({type(exc).__name__}: {one_line(str(exc))})"]
    try:
        return notes + manifest_notes(previous[-1] if previous else None, record)
    except Exception as exc:  # noqa: BLE001 - a hand-edited previous record must not stop the launch
        return [*notes, f"manifest: could not compare with the previous launch's record ({type(exc).__name__})"]
