"""Which launch of a run a reader looks at (`taehv-launch status`, `diff`), and whether a record is of it.

The current launch is the newest: on node 0 its id is the one in node 0's .lock (each launch rewrites it
as it starts, run/lock.py), else the one of node 0's newest manifest.jsonl record; node k's (a launch on
several nodes: each node's launcher is its own invocation with its own id, rundir/launchid.py) is in
.lock.node<k>, else manifest.node<k>.jsonl, for the nodes of the current launch (num_machines of node 0's
record; every node that left a lock or a manifest when that is not known). A record that carries a
launch id (every record written since #40) is this launch's when its id is one of these.

Fallback, for run directories written before #40 (a record without an id, or no current id known): a
record is this launch's when it was written at or after the launch began, by the writer's clock (a
record's own start time: progress.json's "started") against the newest manifest record's time (the
.lock's mtime while its launcher runs on this host), else by the filesystem's (the file's mtime)
against node 0's .lock mtime (else that record's time).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from .launchid import LAUNCH, LAUNCH_ID, valid
from .layout import launcher_lock_path
from .manifest import manifest_nodes, part, read_manifest, record_time
from .records import Field, Record, Text, Whole, count

# .lock[.node<k>]: who holds the launcher's lock (run/lock.py writes it)
LOCK = Record(".lock", (Field("host", Text()), Field("pid", Whole(1, below=2**22)), Field("since", Text()), LAUNCH))


def read_lock(run_dir: Path, node: int = 0) -> dict:
    """The lock's record, its fields checked (another type: None); every field None when unreadable."""
    return LOCK.read(launcher_lock_path(run_dir, node)).record or dict.fromkeys(f.name for f in LOCK.fields)


def launcher_alive(run_dir: Path) -> bool:
    """Node 0's launcher holds .lock; on this host its pid says whether it still runs."""
    holder = read_lock(run_dir)
    if holder["host"] != socket.gethostname() or holder["pid"] is None:
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process
    return True


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


@dataclass(frozen=True)
class ThisLaunch:
    """The current launch of a run: each node's launch id (those recorded), node 0's manifest record of
    it (None: not written, or none), and for the fallback when it began (writers' clock, filesystem's)."""

    ids: dict[int, str] = field(default_factory=dict)
    record: dict | None = None
    nodes: tuple[int, ...] = (0,)
    began: float | None = None
    began_fs: float | None = None

    @property
    def id(self) -> str | None:
        """Node 0's launch id."""
        return self.ids.get(0)

    def holds(self, record: object, mtime: float | None = None, started: float | None = None) -> bool:
        """Whether `record` (a record as read, with its "launch_id") is this launch's. Without an id: the
        fallback, by `started` (the record's own start time, the writer's clock) when given, else by
        `mtime` (its file's)."""
        got = valid(record.get(LAUNCH_ID)) if isinstance(record, dict) else None
        if got is not None and self.ids:
            return got in self.ids.values()
        if started is not None or mtime is None:
            return self.began is None or (started is not None and started >= self.began)
        return self.began_fs is None or mtime >= self.began_fs


def since_ok(since: ThisLaunch | float | None, record: object, mtime: float) -> bool:
    """A reader's test of a record of `mtime`: this launch's (ThisLaunch), written at or after `since`
    (a process's own start, the filesystem's clock: the trainer's watchdog, the launcher's freeze
    watch), or anything (None)."""
    if isinstance(since, ThisLaunch):
        return since.holds(record, mtime=mtime)
    if isinstance(since, bool) or not isinstance(since, (int, float)):
        return True
    return mtime >= since


def _current(run_dir: Path, node: int, records: list[dict]) -> tuple[str | None, dict | None]:
    """(node's current launch id, its manifest record of that launch) from its lock and manifest."""
    lid = read_lock(run_dir, node)[LAUNCH_ID]
    if lid is None:  # no lock, or one from before #40: the newest record's
        newest = records[-1] if records else None
        return (valid(newest.get(LAUNCH_ID)) if newest else None), newest
    return lid, next((r for r in reversed(records) if r.get(LAUNCH_ID) == lid), None)


def current_launch(run_dir: Path, manifest: list[dict], live: bool) -> ThisLaunch:
    """The current launch of `run_dir`; `manifest`: node 0's records as read (oldest first); `live`: its
    launcher runs on this host (launcher_alive)."""
    run_dir = Path(run_dir)
    lid, record = _current(run_dir, 0, manifest)
    ids = {0: lid} if lid else {}
    nodes = count(part(record, "plan").get("num_machines")) if record else None
    others = range(1, nodes) if nodes else [k for k in _lock_nodes(run_dir) | set(manifest_nodes(run_dir)) if k]
    for k in sorted(others):
        if (kid := _current(run_dir, k, read_manifest(run_dir, k))[0]) is not None:
            ids[k] = kid
    at, lock = (record_time(manifest[-1]) if manifest else None), _mtime(launcher_lock_path(run_dir, 0))
    began = lock if live and lock else at or lock
    return ThisLaunch(ids, record, (0, *sorted(others)), began, lock or at)


def _lock_nodes(run_dir: Path) -> set[int]:
    """The nodes k > 0 whose launcher left a .lock.node<k>."""
    try:
        names = [p.name[len(".lock.node") :] for p in Path(run_dir).glob(".lock.node*")]
    except OSError:
        return set()
    return {int(k) for k in names if k.isdigit()}


def node_record(run_dir: Path, launch: ThisLaunch, node: int) -> dict | None:
    """Node `node`'s manifest record of this launch: the one with its launch id, else (no id recorded)
    its newest."""
    if node == 0 and launch.record is not None:
        return launch.record
    records = read_manifest(run_dir, node)
    if node in launch.ids:
        return next((r for r in reversed(records) if r.get(LAUNCH_ID) == launch.ids[node]), None)
    return records[-1] if records else None
