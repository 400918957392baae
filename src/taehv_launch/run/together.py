"""Restart in place on several nodes (issue #39): the launchers of a job stop and start their ranks together,
on one restart generation and one checkpoint, agreed through files in the shared run directory (the
filesystem every node already shares for checkpoints and heartbeats; no port, no torch in the launcher).

<run>/restart/ is the launchers' own (the trainer never reads it):
  node<k>.alive       node k's launcher rewrites it every BEACON_PERIOD_S while it runs the job (a counter, its
                      pid and host). Node 0 watches every node's, the others node 0's: one that has not changed
                      for BEACON_STALE_S (the reader's own clock: the nodes' clocks never meet) is a launcher
                      that is gone (its node lost, or the launcher killed)
  g<g>.failed         the first failure report of attempt g (g: restarts so far in the job) whose ranks are gone
                      for a failure: the one file every launcher polls while its ranks run. Created exclusively
                      (O_CREAT|O_EXCL): the first report stands; a later node's failure is said on its console
                      (its own report keeps it), never written over the first
  g<g>.node<k>.json   node k's report on attempt g: "code", "message", "repeats", "stop_requested", "stepped",
                      "failed_at", "peer" (the node whose failure made this launcher stop its ranks, or null),
                      its own verdict ("restartable", "line"), "ready" once its ranks have all exited, and
                      "stopped": its launcher got a stop signal between attempts (the job ends with 75)
  g<g>.decision.json  node 0's decision after attempt g: "restart", "line", "code", "node" (whose failure),
                      "checkpoint" (a name, or null: from the start), "count" (restarts in the job after it),
                      "without_progress", "stopped" (no restart for a stop between attempts: every node ends
                      as a stopped job ends, exit 75)
Records older than a launcher's start (the filesystem's clock) are an earlier job's of the run: ignored; each
launcher removes its own at start.

An attempt ends on a node: its launcher writes its report (and g<g>.failed for a failure). The others, seeing
g<g>.failed while their ranks run (PeerWatch), kill their ranks (which would otherwise wait in a collective
until the ranks' watchdog finds the dead peer, 30 s), then report. A node whose own verdict is "not
restarted" (75, 2, a stop it was asked for ...) ends at once, node 0 after writing that decision. The others
wait until their ranks have exited (the trainer lock is free), mark their report ready, and node 0 decides
once for the job (gather): the caps count restarts of the job, the checkpoint is the newest complete one.
A node that is gone, or not ready within JOIN_TIMEOUT_S, ends the job: no restart anywhere, each node exits
with its failure's code as before restarts (the scheduler requeues or fails the job as it did).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from ..errors import EXIT_HUNG, EXIT_OK, EXIT_RESUMABLE
from ..files import read_json_or_none, write_atomic
from .restart import LOCK_WAIT_S, reason_of

SYNC_DIR = "restart"
BEACON_PERIOD_S = 2.0
BEACON_STALE_S = 30.0  # as the ranks' watchdog's stale limit: a launcher is one light process
POLL_S = 0.5
JOIN_TIMEOUT_S = LOCK_WAIT_S + 120.0  # every node: its ranks stopped and exited, its report seen
DECISION_TIMEOUT_S = 600.0  # node 0 gathers (JOIN_TIMEOUT_S) and verifies the checkpoint's checksums
# A peer's ranks that ended so end ours by themselves: a finished job, a stop with a checkpoint (all ranks
# agreed on it), a hang report (every rank dumps its stacks first): never killed from here.
SELF_ENDING = (EXIT_OK, EXIT_RESUMABLE, EXIT_HUNG)


class Nodes:
    """Node `node`'s side of the agreement among `count` nodes. start() before the first attempt, close()
    at the end."""

    def __init__(
        self,
        run_dir: Path,
        node: int,
        count: int,
        period_s: float = BEACON_PERIOD_S,
        stale_s: float = BEACON_STALE_S,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.dir, self.node, self.count = Path(run_dir) / SYNC_DIR, node, count
        self.period_s, self.stale_s = period_s, stale_s
        self.say = say or (lambda line: print(f"taehv-launch: {line}", file=sys.stderr, flush=True))
        self.started = 0.0
        self._beats = 0
        self._seen: dict[int, tuple[str | None, float]] = {}  # node -> (its beacon's text, when it last changed)
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._run, name="taehv-node-beacon", daemon=True)

    @property
    def leader(self) -> bool:
        return self.node == 0

    def beacon(self, k: int) -> Path:
        return self.dir / f"node{k}.alive"

    def report_path(self, gen: int, k: int) -> Path:
        return self.dir / f"g{gen}.node{k}.json"

    def failed_path(self, gen: int) -> Path:
        return self.dir / f"g{gen}.failed"

    def decision_path(self, gen: int) -> Path:
        return self.dir / f"g{gen}.decision.json"

    def start(self) -> "Nodes":
        self.dir.mkdir(parents=True, exist_ok=True)
        old = [*self.dir.glob(f"g*.node{self.node}.json")]
        if self.leader:
            old += [*self.dir.glob("g*.decision.json"), *self.dir.glob("g*.failed")]
        for path in old:
            path.unlink(missing_ok=True)
        self._beat()
        try:
            self.started = self.beacon(self.node).stat().st_mtime  # the filesystem's clock
        except OSError:
            self.started = time.time()
        self._look()
        self._thread.start()
        return self

    def close(self) -> None:
        self._ended.set()
        self._thread.join(timeout=self.period_s + 5)

    def _beat(self) -> None:
        self._beats += 1
        write_atomic(self.beacon(self.node), f"{self._beats} {os.getpid()} {socket.gethostname()}\n")

    def _watched(self) -> list[int]:
        return [k for k in range(self.count) if k != self.node] if self.leader else [0]

    def _look(self) -> None:
        now = time.monotonic()
        for k in self._watched():
            try:
                text = self.beacon(k).read_text()
            except OSError:
                text = None
            with self._lock:
                if k not in self._seen or self._seen[k][0] != text:
                    self._seen[k] = (text, now)

    def _run(self) -> None:
        while not self._ended.wait(self.period_s):
            try:
                self._beat()
            except OSError:
                pass  # the next beat; peers judge us gone only after BEACON_STALE_S without one
            self._look()

    def silent_for(self, k: int) -> float | None:
        """How long node k's launcher has not beaten, when past stale_s (gone); None: alive."""
        with self._lock:
            seen = self._seen.get(k)
        if seen is None:
            return None  # not watched
        age = time.monotonic() - seen[1]
        return age if age > self.stale_s else None

    def _fresh(self, path: Path) -> dict | None:
        """The record at `path` when this job wrote it (not older than our start), else None."""
        try:
            if path.stat().st_mtime < self.started - 1:
                return None
        except OSError:
            return None
        return read_json_or_none(path)

    def report(self, gen: int, rec: dict) -> bool:
        """Write our report on attempt `gen` (and g<gen>.failed when our ranks failed); False: not written."""
        try:
            write_atomic(self.report_path(gen, self.node), json.dumps(rec))
        except OSError:
            return False
        if rec.get("peer") is None and rec.get("code") not in SELF_ENDING and not rec.get("ready"):
            self._first_failure(gen, rec)
        return True

    def _first_failure(self, gen: int, rec: dict) -> None:
        """Create g<gen>.failed with our report, exclusively (O_CREAT|O_EXCL): a second writer never replaces the
        first, and says so. Its readers poll and take an empty or half-written file for none yet. A file older
        than our start is an earlier job's (node 0 removes those at its start, which may come after ours)."""
        path = self.failed_path(gen)
        for _ in range(2):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            except FileExistsError:
                try:
                    if path.stat().st_mtime < self.started - 1:
                        path.unlink()  # an earlier job's: once
                        continue
                except OSError:
                    pass
                first = read_json_or_none(path) or {}
                if first.get("node") != self.node:
                    why = reason_of(rec.get("code", 1), rec.get("message"))
                    self.say(
                        f"node {self.node}'s ranks failed too ({why}), after node {first.get('node', '?')} reported "
                        f"its failure in {path}: that first report stands; this node's is in "
                        f"{self.report_path(gen, self.node)}"
                    )
                return
            except OSError as exc:
                self.say(
                    f"warning: cannot write {path}: {exc.strerror or exc}: the other nodes do not see this failure"
                )
                return
            try:
                os.write(fd, json.dumps(rec).encode())
            except OSError as exc:
                self.say(
                    f"warning: cannot write {path}: {exc.strerror or exc}: the other nodes do not see this failure"
                )
            finally:
                os.close(fd)
            return

    def peer_failure(self, gen: int) -> dict | None:
        """Another node's report of attempt `gen` whose ranks failed, or None."""
        rec = self._fresh(self.failed_path(gen))
        return rec if rec is not None and rec.get("node") != self.node else None

    def decide(self, gen: int, decision: dict) -> None:
        try:
            write_atomic(self.decision_path(gen), json.dumps({**decision, "time": time.time()}))
        except OSError:
            pass  # the others end when they see no decision: DECISION_TIMEOUT_S

    def gather(
        self, gen: int, stopped: Callable[[], bool], timeout_s: float = JOIN_TIMEOUT_S
    ) -> tuple[dict[int, dict], str | None]:
        """Node 0: every node's report on attempt `gen`, once all are ready; or (those read, why the job
        cannot restart): a node's own verdict, a node gone, the join timeout, a stop we were asked for."""
        deadline = time.monotonic() + timeout_s
        while True:
            reports = {k: r for k in range(self.count) if (r := self._fresh(self.report_path(gen, k))) is not None}
            for k, rec in sorted(reports.items()):
                if rec.get("restartable") is False:
                    return reports, f"node {k}: {rec.get('line')}"
            if stopped():  # before "all ready": a stop asked for ends the job, it is never swallowed
                return reports, "node 0's launcher was asked to stop"
            waiting = [k for k in range(self.count) if not reports.get(k, {}).get("ready")]
            if not waiting:
                return reports, None
            for k in waiting:
                if (age := self.silent_for(k)) is not None:
                    return reports, f"node {k} is gone: its launcher has not answered for {age:.0f} s"
            if time.monotonic() > deadline:
                return reports, f"node {', '.join(map(str, waiting))} did not report ready within {timeout_s:g} s"
            time.sleep(POLL_S)

    def wait_decision(self, gen: int, stopped: Callable[[], bool], timeout_s: float = DECISION_TIMEOUT_S) -> dict:
        """The others: node 0's decision on attempt `gen`, or a "no" of our own when it cannot come."""
        deadline = time.monotonic() + timeout_s
        while True:
            if stopped():  # first: a stop asked for ends this node even when a restart was decided
                return {"restart": False, "line": f"node {self.node}'s launcher was asked to stop"}
            rec = self._fresh(self.decision_path(gen))
            if rec is not None and isinstance(rec.get("restart"), bool):
                return rec
            if (age := self.silent_for(0)) is not None:
                return {"restart": False, "line": f"node 0 is gone: its launcher has not answered for {age:.0f} s"}
            if time.monotonic() > deadline:
                return {"restart": False, "line": f"no decision from node 0 within {timeout_s:g} s"}
            time.sleep(POLL_S)


def root_failure(reports: dict[int, dict]) -> tuple[int, dict]:
    """The failure the job restarts for: the earliest of the nodes whose own ranks failed (not stopped for a
    peer's failure)."""
    own = {k: r for k, r in reports.items() if r.get("peer") is None} or reports

    def when(k: int) -> tuple[float, int]:
        at = own[k].get("failed_at")
        return (at if isinstance(at, (int, float)) and not isinstance(at, bool) else float("inf"), k)

    k = min(own, key=when)
    return k, own[k]


class PeerWatch:
    """While attempt `gen` runs on this node: once another node reports that its ranks failed, kill this
    node's launch (launch.kill_launch): our ranks could only wait in a collective for the dead ones."""

    def __init__(self, nodes: Nodes, gen: int) -> None:
        self.nodes, self.gen = nodes, gen
        self.fired: dict | None = None  # the peer's report that made us stop
        self._pid: int | None = None
        self._say: Callable[[str], None] | None = None
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._run, name="taehv-peer-watch", daemon=True)
        self._thread.start()

    def attach(self, pid: int, say: Callable[[str], None]) -> None:
        """launch.run's on_start: the launch's pid and the console's line writer."""
        with self._lock:
            self._pid, self._say = pid, say
            fire = self.fired is not None
        if fire:
            self._kill()

    def _run(self) -> None:
        while not self._ended.wait(POLL_S):
            try:
                found = self.nodes.peer_failure(self.gen)
            except (OSError, ValueError, TypeError):
                continue
            if found is not None:
                with self._lock:
                    self.fired = found
                    ready = self._pid is not None
                if ready:
                    self._kill()
                return

    def _kill(self) -> None:
        from .launch import kill_launch

        rec, pid = self.fired or {}, self._pid
        code = rec.get("code") if isinstance(rec.get("code"), int) else 1
        if self._say is not None:
            self._say(
                f"taehv-launch: node {rec.get('node')}'s ranks failed ({reason_of(code, rec.get('message'))}): "
                f"stopping this node's ranks too\n"
            )
        if pid is not None:
            kill_launch(pid)

    def end(self) -> None:
        self._ended.set()
        self._thread.join(timeout=POLL_S + 5)
