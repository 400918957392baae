"""The edge: write the run directory, check the machine, start `accelerate launch`, relay signals.

The child runs in its own session (process group), so a Ctrl-C in the terminal reaches only
us; we decide what the trainer sees: the first SIGINT/SIGTERM/SIGUSR1/SIGHUP is relayed as SIGUSR2
(rundir/signals.RELAY_SIGNAL) to the rank processes only, the agent's direct children, never their
DataLoader workers; the ranks checkpoint and exit with EXIT_RESUMABLE. A rank that also got the
signal directly (SLURM signals every process) stops once: the relay never counts as a second
signal. A second signal to us SIGKILLs every process of the launch (torchrun puts each rank in a
session of its own, so the child's process group alone is not enough).
The child is `accelerate launch` run through agent.py, which keeps torchrun's agent from tearing
the ranks down when a scheduler signals it too.
accelerate's wrappers turn a trainer failure into their own traceback and exit code 1; the
trainer records its real exit code in the run directory and we exit with that one, keeping
accelerate's traceback in launch.log only. A second signal once the trainer has recorded its exit
(say 75, the checkpoint saved) ends what is left of the launch and keeps that code; a stop before the
trainer started, or the abort, is recorded by us (exit 130 and why) when the trainer recorded nothing.
SIGHUP (a closed terminal) is a stop signal like SIGTERM; once the console cannot be written (EIO, EPIPE)
fds 1 and 2 point at launch.log, so the run ends as it would have and its last lines are kept there.
The ranks watch our pid (LAUNCHER_ENV, train/durability/stop.py): if we die, they checkpoint and stop.
Hangs, and ranks that stopped answering: run/freeze.py (a thread beside the launch).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import psutil  # accelerate depends on it; imported here, never inside a signal handler

from ..errors import EXIT_ABORTED, LaunchError
from ..files import write_atomic
from .dryrun import MIN_FREE_BYTES
from .console import Console, start_time
from .freeze import NodeWatch, recorded_code
from .host import port_free
from .lock import RunLock
from .render import TRAINER_SCRIPT, Rendered
from ..plan.resolve import Plan
from .runs import point_latest
from ..rundir.checkpoint import WRITING_PREFIX
from ..rundir.launchid import ATTEMPT_ENV
from ..rundir.layout import REQUEUE
from ..rundir.signals import REPEAT_WINDOW_S, RELAY_SIGNAL, STOP_SIGNALS, counts_once
from ..rundir.exitstatus import read_exit_status, exit_status_path, write_exit_status

LAUNCHER_ENV = "TAEHV_LAUNCHER"  # train/durability/stop.py's: "<our pid> <our start time> <launch log>"


def write_files(run_dir: Path, files: dict[str, str]) -> list[str]:
    """Write files; an existing file with other content is kept as <name>.prev-<n>. Returns notes."""
    notes = []
    for name, text in files.items():
        path = run_dir / name
        if path.exists():
            if path.read_text() == text:
                continue
            n = 1
            while (backup := path.with_name(f"{path.name}.prev-{n}")).exists():
                n += 1
            path.rename(backup)
            notes.append(f"{name} changed since the last launch of this run; the old one is {backup.name}")
        write_atomic(path, text)
    return notes


def prepare_run_dir(plan: Plan, run_dir: Path, lock: RunLock) -> None:
    """Create the run dir, take this node's lock on it (a second launch of the run is refused), remove
    the half-written .tmp-checkpoint-* a killed launch left, and point `latest` at it on node 0; fail
    clearly when the disk is unusable."""
    output_dir = run_dir.parent
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise LaunchError(
            f"cannot write to {run_dir}: {exc.strerror or exc}; pass a writable --set output_dir=..."
        ) from None
    free = shutil.disk_usage(run_dir).free
    if free < MIN_FREE_BYTES:
        raise LaunchError(
            f"only {free / 2**30:.1f} GiB free under {run_dir}: checkpoints need more; "
            f"free space or choose another --set output_dir"
        )
    lock.acquire()
    if plan.topology.machine_rank == 0:
        for tmp in run_dir.glob(f"{WRITING_PREFIX}checkpoint-*"):  # a checkpoint a killed run never finished
            shutil.rmtree(tmp, ignore_errors=True)
    if plan.topology.machine_rank == 0 and plan.options.task == "train":  # `latest` is the newest training run
        point_latest(output_dir, run_dir)


def check_port_free(plan: Plan) -> None:
    """On the master node the rendezvous port must be free before we start."""
    topo = plan.topology
    if topo.machine_rank != 0 or topo.world_size == 1:
        return
    if not port_free(topo.main_process_port):
        raise LaunchError(
            f"port {topo.main_process_port} is in use on this node: pass --master-port "
            f"with a free port (or stop the process holding it)"
        )


def env_record(plan: Plan, rendered: Rendered) -> str:
    topo = plan.topology
    return (
        json.dumps(
            {
                "exported": rendered.exported(),
                "kept_from_environment": {k: v.value for k, v in rendered.env.items() if v.kept},
                "reasons": {k: v.reason for k, v in rendered.env.items()},
                "command": rendered.argv,
                "topology": {
                    "num_machines": topo.num_machines,
                    "machine_rank": topo.machine_rank,
                    "gpus_per_machine": topo.gpus_per_machine,
                    "source": topo.source,
                },
                "python": sys.executable,
            },
            indent=2,
        )
        + "\n"
    )


def node_exit_status(run_dir: Path, node: int) -> dict | None:
    return read_exit_status(exit_status_path(run_dir, node))


def trainer_pids(root_pid: int) -> list[int]:
    """PIDs of the trainer's rank processes under `root_pid`: the direct children of the agent
    (accelerate's simple launcher or torchrun's agent, running in `root_pid`) that run main.py.
    Not their DataLoader workers, which are forked from a rank and share its command line."""
    try:
        children = psutil.Process(root_pid).children(recursive=False)
    except psutil.NoSuchProcess:
        return []
    script = str(TRAINER_SCRIPT)
    pids = []
    for child in children:
        try:
            if script in child.cmdline():
                pids.append(child.pid)
        except psutil.Error:
            continue
    return pids


def launch_pids(root_pid: int) -> list[int]:
    """`root_pid` and every process under it, in whatever process group or session."""
    try:
        root = psutil.Process(root_pid)
        return [root_pid, *(p.pid for p in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def kill_launch(root_pid: int, pids: list[int] | None = None) -> None:
    """SIGKILL the launch: its process group and each process under it (ranks run in sessions
    of their own under torchrun)."""
    pids = launch_pids(root_pid) if pids is None else pids
    _kill_group(root_pid, signal.SIGKILL)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class SignalRelay:
    """The launcher's stop signals. The handler only records the signal and wakes a thread (no
    import, no lock, no process listing: a signal can arrive while the handler runs for the one
    before, as GNU `timeout` delivers its signal twice); the thread acts on it:
    the first stop signal is relayed to the ranks as RELAY_SIGNAL (they save and exit 75), the same
    signal again within REPEAT_WINDOW_S counts once, and any later or different one kills the launch (once
    the trainer has recorded its exit code, that only ends what is left of the launch: the code stands)."""

    def __init__(self, child_pid: int, console: Console, task: str, exit_file: Path) -> None:
        self.child_pid, self.console, self.task, self.exit_file = child_pid, console, task, exit_file
        self.events: list[tuple[int, float]] = []
        self.aborted: str | None = None  # why we killed the launch: the second signal's name
        self.not_started: str | None = None  # the signal that came before the trainer started
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._thread = threading.Thread(target=self._serve, name="signal-relay", daemon=True)
        self._thread.start()

    def handler(self, signum, _frame) -> None:
        self.events.append((signum, time.monotonic()))
        try:
            os.write(self._write, b"s")
        except OSError:  # the pipe is full: the thread has wake-ups enough queued
            pass

    def close(self) -> None:
        os.close(self._write)  # the thread reads EOF and ends
        self._thread.join(timeout=5)
        os.close(self._read)

    def _serve(self) -> None:
        done = 0
        while os.read(self._read, 64):
            while done < len(self.events):
                self._act(done)
                done += 1

    def _say(self, msg: str) -> None:
        self.console.say(msg)

    def _act(self, i: int) -> None:
        signum, at = self.events[i]
        name = signal.Signals(signum).name
        if i == 0:
            pids = trainer_pids(self.child_pid)
            what = self.what()
            if pids:
                save = "finish its shard" if self.task == "cache" else "save a checkpoint"
                self._say(
                    f"taehv-launch: got {name}: asking the {what} to {save} and stop (signal again to "
                    f"abort at once; a repeat within {REPEAT_WINDOW_S:g} s counts as this one)\n"
                )
                for pid in pids:
                    try:
                        os.kill(pid, RELAY_SIGNAL)
                    except ProcessLookupError:
                        pass
            else:
                self._say(f"taehv-launch: got {name} before the {what} started: stopping, nothing to save\n")
                self.not_started = name
                kill_launch(self.child_pid)
        elif counts_once(self.events[0], signum, at):
            if i == 1:
                self._say(f"taehv-launch: {name} again within moments: the same stop, counted once\n")
        elif self.aborted or self.not_started:
            return
        elif (code := recorded_code(self.exit_file)) is not None:  # the trainer has ended: nothing to lose
            self._say(f"taehv-launch: {name}: the {self.what()} already exited ({code}); ending what is left\n")
            kill_launch(self.child_pid)
        else:
            self.aborted = name
            self._say(f"taehv-launch: second signal ({name}): stopping now, without a checkpoint\n")
            kill_launch(self.child_pid)

    def what(self) -> str:
        return "cache job" if self.task == "cache" else "trainer"


def run(
    plan: Plan,
    rendered: Rendered,
    run_dir: Path,
    argv: list[str] | None = None,
    outcome: dict | None = None,
    on_start: Callable[[int, Callable[[str], None]], None] | None = None,
    held: list[int] | None = None,
    attempt: int | None = None,
) -> int:
    """Start the launch (`argv`: rendered.argv, or a restart's, run/supervise.py), tee its output into
    launch.log, return the trainer's exit code; outcome["stop_requested"]: we were signalled to stop,
    outcome["not_started"]: by this signal (its name) before the trainer started.
    on_start(pid, say): called once the launch runs, with its pid (for kill_launch) and the console's line
    writer (run/together.py's PeerWatch stops this node's ranks when another node's failed).
    held: where the caller's stop handler (run/supervise.py's catching_stops) notes signals: one noted before
    the start starts nothing (EXIT_ABORTED, "not_started"; the caller says why); one noted after that last
    look, before the relay's handler is in, is handed to the relay at once: no stop meets a default handler.
    attempt: the restart attempt this is in the launch (0, 1, ...), put in the trainer's environment: its records
    carry it (rundir/launchid.py)."""
    argv = list(rendered.argv if argv is None else argv)
    log_path = run_dir / f"launch{rendered.node_suffix}.log"
    exit_file = exit_status_path(run_dir, plan.topology.machine_rank)
    exit_file.unlink(missing_ok=True)
    env = {**os.environ, **rendered.exported(), LAUNCHER_ENV: f"{os.getpid()} {start_time()} {log_path.resolve()}"}
    if attempt is not None:
        env[ATTEMPT_ENV] = str(attempt)
    if sys.stdout.isatty():
        env["TAEHV_TTY"] = "1"  # the trainer shows a progress bar only for a person at a terminal
    with open(log_path, "ab") as log:
        log.write(f"\n=== taehv-launch {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(argv)}\n".encode())
        log.flush()
        try:
            if not shutil.which(argv[0]):
                raise FileNotFoundError(errno.ENOENT, "not found")
            child_argv = [sys.executable, "-m", "taehv_launch.run.agent", *argv]
            if seen := len(held or []):  # the last look at the caller's stops: nothing started, nothing to kill
                if outcome is not None:
                    outcome |= {"stop_requested": True, "not_started": signal.Signals(held[0]).name}
                return EXIT_ABORTED
            child = subprocess.Popen(
                child_argv,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            raise LaunchError(
                f"cannot start {rendered.argv[0]}: {exc.strerror or exc}; is accelerate installed in this environment?"
            ) from None
        console = Console(log)
        if on_start is not None:
            on_start(child.pid, console.say)
        relay = SignalRelay(child.pid, console, plan.options.task, exit_file)
        previous = {s: signal.signal(s, relay.handler) for s in STOP_SIGNALS}  # the caller's, restored at the end
        for signum in (held or [])[seen:]:  # noted by the caller's handler after the look above: the relay's now
            relay.handler(signum, None)
        c = plan.config
        watch = NodeWatch(
            run_dir,
            plan.topology.machine_rank,
            plan.world_size,
            exit_file,
            kill=lambda: kill_launch(child.pid),
            note=console.note,
            hang_timeout=c.get("hang_timeout", 0) if plan.options.task == "train" else 0,
            hang_timeout_slow=c.get("hang_timeout_slow", 0),
            attempt=attempt,  # its records are told by it and the launch ids, not by their files' times
        ).start()
        try:
            _tee(child, console, exit_file)
            code = child.wait()
        finally:
            watch.end()
            for s, handler in previous.items():
                signal.signal(s, handler)
            relay.close()
    if outcome is not None:
        outcome |= {"stop_requested": bool(relay.events), "not_started": relay.not_started}
    recorded = node_exit_status(run_dir, plan.topology.machine_rank)
    if recorded is None and (relay.aborted or relay.not_started):
        if relay.aborted:
            why = "stopped at once by a second signal, nothing more was saved"  # which one: the line above it
        else:
            why = f"stopped by {relay.not_started} before the {relay.what()} started, nothing to save"
        try:
            write_exit_status(exit_file, EXIT_ABORTED, why)
        except OSError:
            pass
        return EXIT_ABORTED
    code = int(recorded.get("code", code)) if recorded is not None else (code if code >= 0 else 128 - code)
    if code == 0 and plan.topology.machine_rank == 0:
        (run_dir / REQUEUE).unlink(missing_ok=True)  # the requeued run has finished
    return code


# torch.profiler's Kineto prints "USDT:... profiler_start/profiler_stop" under --profile whatever
# its log level: notices for tracing tools, not for people.
KINETO_NOTICE = b"USDT:"


def final_state(line: bytes) -> bytes:
    """What a terminal shows of `line` in the end: the progress bar's carriage-return updates are
    dropped, so launch.log holds the last state of each line, not every redraw."""
    body = line.rstrip(b"\r\n")
    if b"\r" not in body:
        return line
    return body.rsplit(b"\r", 1)[-1] + line[len(body) :].replace(b"\r", b"")


# torchrun's agent logs a rank's non-zero exit as an error ("E1124 ... torch/distributed/elastic/...
# failed (exitcode: 75)"), also for the clean requeue stop.
ELASTIC_LOG = re.compile(rb"^[EWI]\d{4} [\d:.]+ +\d+ .*torch/distributed/elastic/")


def _tee(child: subprocess.Popen, console: Console, exit_file: Path) -> None:
    """Copy the child's output to the console and the log. Once the trainer has recorded a
    non-zero exit status, the wrappers' tracebacks and torchrun's error lines that follow go to the
    log only (the launcher prints the one error line, or the requeue line for exit 75)."""
    quiet = False
    assert child.stdout is not None
    for line in iter(child.stdout.readline, b""):
        if line.startswith(KINETO_NOTICE):
            continue
        console.log.write(final_state(line))
        console.log.flush()
        if not quiet and (line.startswith(b"Traceback (most recent call last)") or ELASTIC_LOG.match(line)):
            quiet = recorded_code(exit_file) not in (None, 0)
        if not quiet:
            console.out(line)


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(os.getpgid(pid), sig)
    except (ProcessLookupError, PermissionError):
        pass
