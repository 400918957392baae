"""<run>/manifest.jsonl: the reproducibility manifest, one JSON record per launch of the run (appended,
never rewritten); node k > 0 of a multi-node run keeps its own, manifest.node<k>.jsonl, like its
launch log. Written by the launcher (run/manifest.py collects the facts), read by `taehv-launch
status`/`diff` and attached to the trackers as the run's config.

A record (format 1):
  time, node (this node's rank), launch (1, 2, ...: this node's launches of the run), launch_id (this
  node's launcher's, rundir/launchid.py), run_id, run_id_source, task ("train" or "cache"), resume (the
  checkpoint continued, or null)
  command      {"argv": the full command line, "cwd"}
  plan         {"gpus", "profile", "row_source", "world_size", "num_machines", "gpus_per_machine",
                "strategy" ("DDP", "ZeRO-2", "single process"), "global_batch", "hash"}
  config       every resolved config key
  data         {"index": the data index's fingerprint (the dataset index cache file's key hash:
                index-<index>.npz), "key": what it hashes, "cache_file", "note"}
  environment  {"host", "exported" (what the launch sets), "kept" (found already set),
                "gpu": {"model", "count", "driver", "memory_mib"} or null, "cuda_driver"}
  versions     {"taehv-launch", "git": {"commit", "dirty"} or null, "python", "torch_cuda", "nccl",
                "packages": {name: version or null}}

plan.hash = plan_hash(): a stable hash of the resolved config, the topology (nodes, processes per
node) and the strategy. flatten() turns a record into the rows `diff` compares (grouped config / plan
/ environment / versions); differences() compares two; manifest_notes() says in a few short lines
what changed since a run's previous launch.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..files import RECORD_LIMIT, BadRecord, read_json_lines
from .layout import node_suffix
from .launchid import stamped
from .records import timestamp

MANIFEST_FILE = "manifest.jsonl"
FORMAT = 1
GROUPS = ("config", "plan", "environment", "versions")
RUN_PLACEHOLDER = "<run>"  # the run directory inside recorded values (env vars name it): runs compare equal
NOTE_ITEMS = 4  # changes named per group in a resume note


def manifest_path(run_dir: Path, node: int = 0) -> Path:
    return Path(run_dir) / f"manifest{node_suffix(node)}.jsonl"


def read_manifest_file(run_dir: Path, node: int = 0) -> tuple[list[dict], int, str | None]:
    """(every launch's record, oldest first; how many lines were left out as unreadable; why the file
    itself could not be read, or None). A missing file: ([], 0, None). Never blocks or fills memory
    (files.read_json_lines: a FIFO, a device or a huge file; a large one is read from its tail)."""
    path = manifest_path(run_dir, node)
    try:
        records, skipped = read_json_lines(path)
    except BadRecord as exc:
        return [], 0, str(exc)
    except OSError as exc:
        return [], 0, f"{path}: {exc.strerror or exc}"
    return records, skipped, None


@dataclass
class ManifestRead:
    """A manifest as `status` and `diff` read it: its records (oldest first; only those in its last
    RECORD_LIMIT bytes when `whole` is False), the unreadable lines left out, and `why` a manifest that
    is there gave no record (None: it gave some, or there is none: a run from before manifest.jsonl)."""

    records: list[dict]
    skipped: int
    why: str | None
    whole: bool

    @property
    def launches(self) -> int | None:
        """This node's launches of the run: the records; from a tail, the newest record's `launch`
        number (the launcher counts on from its previous record), else at least the records read."""
        last = self.records[-1].get("launch") if self.records else None
        if not self.whole and isinstance(last, int) and not isinstance(last, bool) and last >= len(self.records):
            return last
        return len(self.records) or None


def manifest_size(run_dir: Path, node: int = 0) -> int | None:
    """The manifest's size in bytes (over RECORD_LIMIT: only its tail is read), None when it cannot be told."""
    try:
        return manifest_path(run_dir, node).stat().st_size
    except OSError:
        return None


def read_manifest_state(run_dir: Path, node: int = 0) -> ManifestRead:
    """read_manifest_file(), and why a manifest that is there gave no record: unreadable (a loop of
    links, a folder, no permission), a link to nothing, lines none of which is a record, a file over
    RECORD_LIMIT whose tail holds no whole record, or empty."""
    path = manifest_path(run_dir, node)
    records, skipped, problem = read_manifest_file(run_dir, node)
    size = manifest_size(run_dir, node)
    whole = size is None or size <= RECORD_LIMIT
    if records:
        return ManifestRead(records, skipped, None, whole)
    why = problem[len(str(path)) :].lstrip(": ") if problem and problem.startswith(str(path)) else problem
    if why is None and skipped:
        why = f"{skipped} line(s) left out, none readable"
    if why is None and size is None and path.is_symlink():
        try:
            why = f"a link to {os.readlink(path)}, which does not exist"
        except OSError as exc:
            why = exc.strerror or str(exc)
    if why is None and size is not None:
        big = f"{size / 2**20:.0f} MiB, no whole record in its last {RECORD_LIMIT >> 20} MiB"
        why = big if not whole else "empty: no record" if size == 0 else "no record"
    return ManifestRead([], skipped, why, whole)


def read_manifest(run_dir: Path, node: int = 0) -> list[dict]:
    """Every launch's record, oldest first; [] when there is none. Unreadable lines are skipped."""
    return read_manifest_file(run_dir, node)[0]


def record_time(record: dict) -> float | None:
    """The record's `time` when it is one a clock could show, else None."""
    return timestamp(record.get("time"))


def part(record: Any, name: str) -> dict:
    """record[name] when record and it are JSON objects, else {} (a hand-edited or damaged record)."""
    value = record.get(name) if isinstance(record, dict) else None
    return value if isinstance(value, dict) else {}


def manifest_nodes(run_dir: Path) -> list[int]:
    """The nodes that left a manifest in run_dir (0 first)."""
    try:
        nodes = [0] if manifest_path(run_dir).is_file() else []
        for path in Path(run_dir).glob("manifest.node*.jsonl"):
            k = path.name[len("manifest.node") : -len(".jsonl")]
            if k.isdigit():
                nodes.append(int(k))
    except OSError:
        pass
    return sorted(set(nodes))


def append_manifest(run_dir: Path, record: dict, node: int = 0) -> None:
    """Append one record as one line (one write); OSError is the caller's."""
    with open(manifest_path(run_dir, node), "a") as f:
        f.write(json.dumps(stamped(record), sort_keys=True, default=str) + "\n")


def canonical(value: Any) -> str:
    """JSON with sorted keys and tuples as lists: equal values give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def strategy_name(zero_stage: int, world_size: int) -> str:
    if zero_stage:
        return f"ZeRO-{zero_stage}"
    return "DDP" if world_size > 1 else "single process"


def plan_hash(config: dict, topology: dict, strategy: str) -> str:
    """A stable hash (16 hex digits) of what the run trains with: the resolved config, the topology
    ({"num_machines", "gpus_per_machine", "world_size"}) and the strategy. Paths in the config count
    (another dataset is another plan); the rendezvous address and port, the node's rank, the run's name
    and the time do not."""
    text = canonical({"config": config, "topology": topology, "strategy": strategy})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _norm(value: Any, run_dir: str | None) -> Any:
    if run_dir and isinstance(value, str) and run_dir in value:
        return value.replace(run_dir, RUN_PLACEHOLDER)
    return value


def flatten(record: dict, hosts: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """{group: {row name: value}} of a record, the rows `diff` compares. hosts: every node's host (a
    run's manifests), else the record's own. The run directory inside values becomes <run>. A part of
    the record of another type than written (a hand edit, a damage) reads as absent, never raises."""
    run_dir = record.get("run_dir") if isinstance(record.get("run_dir"), str) else None
    plan = dict(part(record, "plan"))
    plan.pop("hash", None)
    data = part(record, "data")
    if "index" in data:
        plan["data index"] = data.get("index")
    env = part(record, "environment")
    environment: dict[str, Any] = {}
    for name, value in part(env, "exported").items():
        environment[name] = _norm(value, run_dir)
    for name, value in part(env, "kept").items():
        environment[f"{name} (kept)"] = _norm(value, run_dir)
    if "host" in env or hosts:
        environment["hosts"] = ", ".join(str(h) for h in hosts or [env.get("host") or "?"])
    if "gpu" in env:
        gpu = part(env, "gpu")
        environment["gpu"] = f"{gpu.get('count')} x {gpu.get('model')}" if gpu else None
        environment["gpu driver"] = gpu.get("driver") if gpu else None
        environment["cuda (driver)"] = env.get("cuda_driver")
    ver = part(record, "versions")
    versions: dict[str, Any] = {}
    if ver:
        versions["taehv-launch"] = ver.get("taehv-launch")
        git = ver.get("git")
        if isinstance(git, dict):
            commit = git.get("commit")
            commit = commit[:12] if isinstance(commit, str) else "(no commit)" if commit is None else str(commit)
            versions["git commit"] = commit + (" (dirty)" if git.get("dirty") else "")
        else:
            versions["git commit"] = None if git is None else str(git)
        versions["python"] = ver.get("python")
        versions["cuda (torch)"] = ver.get("torch_cuda")
        versions["nccl"] = ver.get("nccl")
        for name, value in sorted(part(ver, "packages").items()):
            versions[name] = value
    out = {
        "config": {k: _norm(v, run_dir) for k, v in part(record, "config").items()},
        "plan": plan,
        "environment": environment,
        "versions": versions,
    }
    return {g: {k: (list(v) if isinstance(v, tuple) else v) for k, v in rows.items()} for g, rows in out.items()}


MISSING = object()  # a row one side does not have
FIRST_ROWS = ("gpus", "profile", "world_size", "num_machines", "gpus_per_machine", "strategy", "global_batch")
ROW_ORDER = {r: i for i, r in enumerate((*FIRST_ROWS, "hosts", "gpu"))}  # named first, the rest alphabetically


def differences(
    a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]], skip: tuple[str, ...] = ()
) -> list[tuple[str, str, Any, Any]]:
    """(group, row, value in a, value in b) for every row that differs between two flatten()ed records,
    in group order; MISSING where a side lacks the row. `skip`: rows ("group" or "group.row") not
    compared (what one side cannot know)."""
    out = []
    for group in GROUPS:
        if group in skip:
            continue
        ra, rb = a.get(group, {}), b.get(group, {})
        for row in sorted(set(ra) | set(rb), key=lambda r: (ROW_ORDER.get(r, len(ROW_ORDER)), r)):
            if f"{group}.{row}" in skip:
                continue
            va, vb = ra.get(row, MISSING), rb.get(row, MISSING)
            if (va is MISSING) != (vb is MISSING) or canonical(va) != canonical(vb):
                out.append((group, row, va, vb))
    return out


def short(value: Any, width: int = 40) -> str:
    """A value as a person reads it, cut at `width` characters."""
    if value is MISSING:
        text = "(none)"
    elif value is None:
        text = "-"
    elif isinstance(value, str):
        text = value if value else "''"
    elif isinstance(value, float):
        text = f"{value:g}"
    else:
        text = json.dumps(value, default=str) if isinstance(value, (list, dict)) else str(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def manifest_notes(previous: dict | None, record: dict) -> list[str]:
    """What changed since this node's previous launch of the run, in short lines (one per group that
    changed, a few changes named in each); one line when nothing did. [] on a first launch."""
    if previous is None:
        return []
    since = f"launch {previous.get('launch', '?')}"
    diffs = differences(flatten(previous), flatten(record))
    if not diffs:
        return [
            f"manifest: launch {record.get('launch')} of this run; config, plan, environment and versions as at {since}"
        ]
    lines = []
    for group in GROUPS:
        rows = [d for d in diffs if d[0] == group]
        if not rows:
            continue
        named = ", ".join(f"{row} {short(va, 24)} -> {short(vb, 24)}" for _g, row, va, vb in rows[:NOTE_ITEMS])
        more = f" and {len(rows) - NOTE_ITEMS} more (manifest.jsonl has both)" if len(rows) > NOTE_ITEMS else ""
        lines.append(f"manifest: {group} changed since {since}: {named}{more}")
    return lines
