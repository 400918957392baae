"""The launcher's loop over attempts (issue #39): run the launch (launch.run); after a restartable failure run
it again from the newest complete checkpoint, up to max_restarts. restart.py decides; on several nodes,
together.py makes every node's launcher stop and start its ranks together, node 0 deciding once for the job.

Only node 0 (the only node of a one-node job) writes the restart records in events.jsonl, so `status`
counts each restart of the job once.

A stop signal (SIGTERM, SIGINT, SIGUSR1, SIGHUP) is never fatal to the launcher once the first attempt starts:
- inside launch.run, from its SignalRelay's install to the restore: the relay (to the ranks: they save and exit
  75; a second signal aborts);
- everywhere else in Supervisor.run's loop: after an attempt's relay is restored (reading how it ended, the
  verified newest checkpoint, the verdict, the wait for the old ranks, the nodes' agreement, begin) and in the
  next launch.run up to its relay's install: catching_stops, held across the whole loop, notes it in
  Supervisor.stops;
- the hand-off: launch.run(held=stops) starts nothing when a stop is noted; one noted after its last look and
  before its relay is installed is handed to that relay.
A stop noted between two attempts (or one before a restarted attempt's trainer started) ends the job as a
stopped job ends: no new attempt, exit 75, the REQUEUE marker, the exit status saying why (stopped()); the
newest complete checkpoint is what --resume auto continues from.
"""

from __future__ import annotations

import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import EXIT_ABORTED, EXIT_OK, EXIT_RESUMABLE, LaunchError
from .restart import (
    LOCK_WAIT_S,
    NOT_RESTARTED,
    FirstStepWatch,
    Verdict,
    decide,
    fs_now,
    reason_of,
    record,
    restart_argv,
    wait_lock_free,
)
from .together import Nodes, PeerWatch, root_failure


@dataclass
class Ended:
    """How an attempt ended on this node."""

    code: int
    recorded: dict  # the exit status this node's trainer (or launcher) recorded, {} when none
    failed_at: float  # the filesystem's clock (restart.fs_now)
    stepped: bool
    stop_requested: bool
    peer: dict | None = None  # the other node's report that made us kill our ranks (our ranks did not fail)
    not_started: str | None = None  # the stop signal that came before the attempt's trainer started


@contextmanager
def catching_stops(into: list[int]):
    """Between attempts a stop signal is noted in `into` (no restart follows), not fatal. The handler only
    appends: launch.run reads the list before it starts an attempt and hands later ones to its relay."""
    from ..rundir.signals import STOP_SIGNALS

    previous = {s: signal.signal(s, lambda n, _f: into.append(n)) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def say(line: str) -> None:
    print(f"taehv-launch: {line}", file=sys.stderr, flush=True)


class Supervisor:
    def __init__(self, plan, rendered, run_dir: Path) -> None:
        c = plan.config
        self.plan, self.rendered, self.run_dir = plan, rendered, Path(run_dir)
        self.node, self.nodes = plan.topology.machine_rank, plan.topology.num_machines
        self.max_restarts = int(c.get("max_restarts", 0) or 0) if plan.options.task == "train" else 0
        self.max_wp = int(c.get("max_restarts_without_progress", 0) or 0)
        self.argv, self.count, self.wp = list(rendered.argv), 0, 0
        self.started_from = Path(plan.options.resume).name if plan.options.resume else None
        self.watch: FirstStepWatch | None = None
        self.sync = Nodes(self.run_dir, self.node, self.nodes) if self.nodes > 1 and self.max_restarts > 0 else None
        self.stops: list[int] = []  # stop signals noted between attempts (catching_stops in run): the job ends

    def run(self) -> int:
        if self.sync is not None:
            try:
                self.sync.start()
            except OSError as exc:
                raise LaunchError(
                    f"cannot write {self.sync.dir}: {exc.strerror or exc}: the launchers of a job of several nodes "
                    f"agree on restarts there; fix the permissions or free space, or --set max_restarts=0"
                ) from None
        try:
            with catching_stops(self.stops):  # the whole loop; launch.run's relay takes over inside each attempt
                while True:
                    ended = self.attempt()
                    code = self.after_one_node(ended) if self.sync is None else self.after_nodes(ended)
                    if code is not None:
                        return code
        finally:
            if self.watch is not None:
                self.watch.end()
            if self.sync is not None:
                self.sync.close()

    def attempt(self) -> Ended:
        from . import launch as edge
        from ..rundir.checkpoint import checkpoint_step
        from ..rundir.exitstatus import exit_status_path, write_exit_status
        from .restart import progress_at

        outcome: dict = {}
        peer = PeerWatch(self.sync, self.count) if self.sync is not None else None
        try:
            code = edge.run(
                self.plan, self.rendered, self.run_dir, argv=self.argv, outcome=outcome,
                on_start=peer.attach if peer is not None else None, held=self.stops, attempt=self.count,
            )  # fmt: skip
        finally:
            if peer is not None:
                peer.end()
        ended_at = fs_now(self.run_dir, self.node)  # every time of a restart is on the filesystem's clock: fs_now
        if self.watch is not None:
            self.watch.end()
            self.watch = None
        try:  # the trainer's exit status, written when it failed (a SIGKILLed rank writes none): its mtime
            failed_at = min(ended_at, exit_status_path(self.run_dir, self.node).stat().st_mtime)
        except OSError:
            failed_at = ended_at
        prog = progress_at(self.run_dir, self.count)  # this attempt's progress.json (its attempt number), or None
        start_step = checkpoint_step(Path(self.started_from)) if self.started_from else 0
        stepped = bool(prog and prog[0] > (start_step or 0))
        recorded = edge.node_exit_status(self.run_dir, self.node) or {}
        if outcome.get("not_started") and not recorded:  # launch.run started nothing: recorded as its relay would
            what = "trainer" if self.plan.options.task == "train" else "cache job"
            recorded = {"code": code, "message": f"stopped by {outcome['not_started']} before the {what} started, "}
            recorded["message"] += "nothing to save"
            try:
                write_exit_status(exit_status_path(self.run_dir, self.node), code, recorded["message"])
            except OSError:
                pass
        fired = peer.fired if peer is not None and not recorded else None  # our trainer recorded nothing itself
        stop = bool(outcome.get("stop_requested"))
        return Ended(code, recorded, failed_at, stepped, stop, fired, outcome.get("not_started"))

    def verdict(self, code: int, recorded: dict, stepped: bool, stop: bool, newest: str | None) -> Verdict:
        return decide(
            code,
            recorded.get("message"),
            started_from=self.started_from,
            newest=newest,
            stepped=stepped,
            count=self.count,
            without_progress=self.wp,
            max_restarts=self.max_restarts,
            max_without_progress=self.max_wp,
            stop_requested=stop,
            repeats=bool(recorded.get("repeats")),
        )

    def end(self, code: int, line: str, quiet: bool = False) -> int:
        """No restart: the job ends with `code`; `line` says why (printed unless the code says it already)."""
        if self.count and code != EXIT_OK and self.node == 0:
            record(self.run_dir, {"event": "restart_stop", "time": time.time(), "code": code, "reason": line})
        if code not in NOT_RESTARTED and self.max_restarts > 0 and not quiet:
            say(f"not restarting: {line}")
        return code

    def wait_old_ranks(self) -> bool:
        """Wait for every process of the failed attempt to exit (the trainer lock is free); False: they did
        not within LOCK_WAIT_S, or a stop signal came meanwhile (the wait ends at once)."""
        from ..rundir.layout import trainer_lock_path

        lock = trainer_lock_path(self.run_dir, self.node)
        free = wait_lock_free(lock, stopped=lambda: bool(self.stops))
        if not free and not self.stops:
            say(f"not restarting: processes of the failed attempt still hold {lock} after {LOCK_WAIT_S:g} s")
        return free and not self.stops

    def stopped(self, name: str | None = None) -> int:
        """A stop signal came between two attempts (self.stops), or before a restarted attempt's trainer started
        (`name`): no attempt follows, and the job ends as a stopped job ends: exit 75 (the scheduler requeues
        it), the REQUEUE marker at the newest complete checkpoint's step, this node's exit status saying why."""
        import json

        from ..files import write_atomic
        from ..rundir.checkpoint import checkpoint_step, newest_complete
        from ..rundir.exitstatus import exit_status_path, write_exit_status
        from ..rundir.layout import REQUEUE

        name = signal.Signals(self.stops[0]).name if self.stops else name
        newest, _ = newest_complete(self.run_dir)  # sizes only: a stop leaves little time; a resume verifies
        ckpt = f"{newest.name} is the newest complete checkpoint" if newest else "there is no complete checkpoint yet"
        line = f"stopped by {name} between restart attempts, none started after it; {ckpt}: --resume auto continues"
        say(f"{line} (exit {EXIT_RESUMABLE}: requeue it)")
        try:
            write_atomic(self.run_dir / REQUEUE, json.dumps({"step": (checkpoint_step(newest) or 0) if newest else 0}))
            write_exit_status(exit_status_path(self.run_dir, self.node), EXIT_RESUMABLE, line)
        except OSError as exc:
            say(f"warning: cannot record the stop in {self.run_dir}: {exc.strerror or exc}")
        return self.end(EXIT_RESUMABLE, line)

    def begin(self, line: str, newest: Path | None, e: dict, node: int | None = None) -> None:
        """Restart number self.count (already counted) from `newest`: node 0 records it and watches for the
        first new step; `e`: the failure's code, failed_at, and the no-progress count."""
        if self.node == 0:
            rec = {"event": "restart", "time": time.time(), "restart": self.count, "code": e["code"], "reason": line}
            rec |= {"failed_at": e["failed_at"], "checkpoint": newest.name if newest else None}
            rec |= {"without_progress": self.wp} | ({"node": node, "nodes": self.nodes} if node is not None else {})
            record(self.run_dir, rec)
        from ..rundir.checkpoint import checkpoint_step

        self.argv = restart_argv(self.rendered.argv, newest)
        self.started_from = newest.name if newest else self.started_from
        after = (checkpoint_step(newest) or 0) if newest else 0
        if self.node == 0:  # the new attempt's records carry its number (self.count): the failed one's never count
            self.watch = FirstStepWatch(self.run_dir, self.count, after, e["failed_at"])

    def after_one_node(self, e: Ended) -> int | None:
        """One node: decide, wait for the old ranks, restart (None) or end (the exit code)."""
        from ..rundir.checkpoint import newest_complete

        if e.not_started and self.count:  # a stop before the restarted trainer started: the checkpoint stands
            return self.stopped(e.not_started)
        newest, _ = newest_complete(self.run_dir, verify=True)
        v = self.verdict(e.code, e.recorded, e.stepped, e.stop_requested, newest.name if newest else None)
        self.wp = v.without_progress
        if not v.restart:
            return self.end(e.code, v.line, quiet=bool(e.recorded.get("repeats")))
        if self.stops:  # came while this attempt's end was read or the checkpoint verified
            return self.stopped()
        self.count += 1
        frm = newest.name if newest else "the start (no complete checkpoint yet)"
        say(f"restart {self.count} of {self.max_restarts} after {v.line}: from {frm}")
        if not self.wait_old_ranks():
            return self.stopped() if self.stops else e.code
        self.begin(v.line, newest, {"code": e.code, "failed_at": e.failed_at})
        return None  # a stop from here on: the next launch.run starts nothing (held), and we come back here

    def after_nodes(self, e: Ended) -> int | None:
        """Several nodes: report, wait for our old ranks, agree with the others (node 0 decides), then all
        restart together (None) or every node ends (the exit code; 75 on every node when the job ends for a
        stop that came between attempts on any node: "stopped" in the reports and the decision)."""
        from ..rundir.checkpoint import newest_complete
        from ..rundir.exitstatus import exit_status_path, write_exit_status

        sync, gen = self.sync, self.count
        assert sync is not None
        if e.peer is not None:  # our ranks were stopped for a peer's failure: node 0 judges that one
            asked = e.stop_requested
            v = Verdict(not asked, "the launcher was asked to stop" if asked else "stopped for a peer", self.wp)
        else:  # the quick local verdict; node 0 decides on the verified newest checkpoint
            newest, _ = newest_complete(self.run_dir)
            v = self.verdict(e.code, e.recorded, e.stepped, e.stop_requested, newest.name if newest else None)
        rec = {"node": self.node, "code": e.code, "message": e.recorded.get("message"), "stepped": e.stepped}
        rec |= {"repeats": bool(e.recorded.get("repeats")), "stop_requested": e.stop_requested}
        rec |= {"failed_at": e.failed_at, "peer": e.peer.get("node") if e.peer else None, "time": time.time()}
        rec |= {"restartable": v.restart, "line": v.line, "ready": False, "stopped": False}
        if e.peer is not None and e.stop_requested:  # killed for a peer while our relay had caught a stop too
            rec["stopped"] = True
        if bool(e.not_started and self.count) or (v.restart and self.stops):  # a stop between attempts
            rec |= {"restartable": False, "line": "the launcher was asked to stop", "stopped": True}
        if not sync.report(gen, rec):
            say(f"warning: cannot write this node's report in {sync.dir}: the other nodes will not restart")
        if rec["restartable"]:
            rec["ready"] = self.wait_old_ranks()
            if not rec["ready"]:
                rec |= {"restartable": False, "stopped": bool(self.stops)}
                rec["line"] = (
                    "the launcher was asked to stop" if self.stops else "the failed attempt's processes did not exit"
                )
            sync.report(gen, rec)
        if not rec["restartable"]:
            if sync.leader:
                d = {"restart": False, "line": rec["line"], "code": e.code, "node": self.node}
                sync.decide(gen, d | {"stopped": rec["stopped"]})
            if rec["stopped"]:
                return self.stopped(e.not_started)
            return self.end(e.code, rec["line"], quiet=bool(e.recorded.get("repeats")))
        d = self.lead(gen) if sync.leader else sync.wait_decision(gen, lambda: bool(self.stops))
        if self.stops and not sync.leader and not d.get("restart"):
            asked = {**rec, "restartable": False, "line": "the launcher was asked to stop", "stopped": True}
            sync.report(gen, asked)
            # node 0 may have decided to restart already (its gather returned on our "ready"): our "no" on the
            # next attempt too, as a failure of it, so that node 0's PeerWatch stops that attempt and its lead
            # ends the job as stopped (75 everywhere), instead of its ranks waiting for ours until a timeout
            sync.report(gen + 1, asked | {"code": EXIT_ABORTED, "peer": None, "ready": False})
        if not d.get("restart"):
            # a stop between attempts, on another node (node 0's "stopped") or here (wait_decision's own "no",
            # which names no failed node): the job ends as a stopped job ends
            if d.get("stopped") or (self.stops and "node" not in d):
                return self.stopped(e.not_started)
            code = e.code
            if e.peer is not None:  # our own code is the kill's: end with the failure's
                code = d["code"] if isinstance(d.get("code"), int) and d.get("code") not in (EXIT_OK,) else 1
                why = reason_of(e.peer.get("code", 1), e.peer.get("message"))
                try:
                    write_exit_status(
                        exit_status_path(self.run_dir, self.node),
                        code,
                        f"this node's ranks were stopped when node {e.peer.get('node')}'s failed ({why}); "
                        f"not restarted: {d.get('line')}",
                    )
                except OSError:
                    pass
            return self.end(code, str(d.get("line")))
        self.count, self.wp = int(d["count"]), int(d.get("without_progress", 0))
        newest = self.run_dir / d["checkpoint"] if d.get("checkpoint") else None
        frm = newest.name if newest else "the start (no complete checkpoint yet)"
        say(
            f"restart {self.count} of {self.max_restarts} after {d['line']} on node {d.get('node')}: from {frm} "
            f"(all {self.nodes} nodes together)"
        )
        self.begin(str(d["line"]), newest, d, node=d.get("node"))
        return None

    def lead(self, gen: int) -> dict:
        """Node 0: gather every node's report on attempt `gen`, decide once for the job, write the decision.
        "stopped": the job ends for a stop that came between attempts (here, or every node that said no)."""
        from ..rundir.checkpoint import newest_complete

        assert self.sync is not None
        reports, why = self.sync.gather(gen, lambda: bool(self.stops))
        if why is not None:
            k, root = root_failure(reports) if reports else (0, {"code": 1})
            d = {"restart": False, "line": f"{why}: the job ends", "code": root.get("code"), "node": k}
            said_no = [r for r in reports.values() if r.get("restartable") is False]
            d["stopped"] = all(r.get("stopped") for r in said_no) if said_no else bool(self.stops)
        else:
            k, root = root_failure(reports)
            newest, _ = newest_complete(self.run_dir, verify=True)
            stepped, at = bool(root.get("stepped")), root.get("failed_at")
            v = self.verdict(
                int(root["code"]), root, stepped, bool(root.get("stop_requested")), newest.name if newest else None
            )
            self.wp = v.without_progress
            at = at if isinstance(at, (int, float)) and not isinstance(at, bool) else fs_now(self.run_dir, self.node)
            d = {"restart": v.restart, "line": v.line, "code": root["code"], "node": k, "failed_at": at}
            d |= {"checkpoint": newest.name if newest and v.restart else None, "without_progress": v.without_progress}
            d |= {"count": self.count + (1 if v.restart else 0)}
            if self.stops and v.restart:  # asked to stop while verifying the checkpoint: no restart, never swallowed
                d |= {
                    "restart": False,
                    "line": "node 0's launcher was asked to stop: the job ends",
                    "count": self.count,
                    "stopped": True,
                }
        self.sync.decide(gen, d)
        return d


def supervise(plan, rendered, run_dir: Path) -> int:
    """Run the launch, and after a restartable failure run it again from the newest complete checkpoint (on
    every node together), up to max_restarts; returns the exit code of the last attempt."""
    return Supervisor(plan, rendered, run_dir).run()
