"""Which launch of a run a reader looks at (`taehv-launch status`, `diff`), and whether a record is of it.

The current launch is the newest: on node 0 its id is the one in node 0's .lock (each launch rewrites it
as it starts, run/lock.py), else the one of node 0's newest manifest.jsonl record. A launch whose .lock
names it but that wrote no manifest record (it ended before it started: a refusal or an error between
taking the lock and writing its record, run/start.py) while its launcher is not running here is not the
current launch: the newest launch with a manifest record is, and ThisLaunch.unstarted names the one that
never got going (its id, host, start time: status says so).

On several nodes each node's launcher is its own invocation with its own id (rundir/launchid.py): node
k's is in .lock.node<k>, else manifest.node<k>.jsonl, for the nodes of the current launch (num_machines of
node 0's record; every node that left a lock or a manifest when that is not known). Node k's id counts
only when node 0's launch names it: its ranks meet node 0's in the trainer's first collective, which
gathers every rank's launch id, and rank 0 writes them in progress.json ("launch_ids"). A node k lock or
record of an earlier launch (node k of this one not started yet) is so never read as this launch's; until
the trainer's first log line no node k is. A record that carries a launch id (every record written since
#40) is this launch's when its id is one of these.

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

from ..files import read_json_or_none
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
    unstarted: dict | None = None  # a newer launch that never started: "launch_id", "host", "since", "ended"

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
    lock, unstarted = _mtime(launcher_lock_path(run_dir, 0)), None
    if lid is not None and record is None and not live:  # its .lock, no manifest record: it never started
        held = read_lock(run_dir)
        unstarted = {LAUNCH_ID: lid, "host": held["host"], "since": held["since"]}
        unstarted["ended"] = True if held["host"] == socket.gethostname() else None  # elsewhere: still starting?
        if manifest:  # the launch before it is the one whose records there are
            lid, record, lock = valid(manifest[-1].get(LAUNCH_ID)), manifest[-1], None
    ids = {0: lid} if lid else {}
    nodes = count(part(record, "plan").get("num_machines")) if record else None
    others = range(1, nodes) if nodes else [k for k in _lock_nodes(run_dir) | set(manifest_nodes(run_dir)) if k]
    linked = _linked(run_dir, lid) if lid else set()
    for k in sorted(others):
        kid = _current(run_dir, k, read_manifest(run_dir, k))[0]
        if kid is not None and (lid is None or kid in linked):  # no id on node 0: a run dir from before #40
            ids[k] = kid
    at = record_time(manifest[-1]) if manifest else None
    began = lock if live and lock else at or lock
    return ThisLaunch(ids, record, (0, *sorted(others)), began, lock or at, unstarted)


def _linked(run_dir: Path, lid: str) -> set[str]:
    """The launch ids that launch `lid`'s trainer gathered from every rank (progress.json's "launch_ids",
    written by rank 0 when its launch id is `lid`): its nodes' launchers'. Empty until then."""
    rec = read_json_or_none(Path(run_dir) / "progress.json")
    if rec is None or valid(rec.get(LAUNCH_ID)) != lid or not isinstance(rec.get("launch_ids"), list):
        return set()
    return {x for x in map(valid, rec["launch_ids"]) if x is not None}


def _lock_nodes(run_dir: Path) -> set[int]:
    """The nodes k > 0 whose launcher left a .lock.node<k>."""
    try:
        names = [p.name[len(".lock.node") :] for p in Path(run_dir).glob(".lock.node*")]
    except OSError:
        return set()
    return {int(k) for k in names if k.isdigit()}


def node_record(run_dir: Path, launch: ThisLaunch, node: int) -> dict | None:
    """Node `node`'s manifest record of this launch: the one with its launch id; None when node 0's launch
    does not name this node's (current_launch); its newest in a run directory from before #40."""
    if node == 0 and launch.record is not None:
        return launch.record
    records = read_manifest(run_dir, node)
    if node in launch.ids:
        return next((r for r in reversed(records) if r.get(LAUNCH_ID) == launch.ids[node]), None)
    return records[-1] if records and launch.id is None else None  # a launch id, but not this node's: none
