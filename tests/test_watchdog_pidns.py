"""Review of #39: a peer's pid is looked up only in our own PID namespace (train/durability/watchdog.py).

Containers on one machine share its hostname (or pods are given the same one) but each has a PID namespace of
its own: a peer's pid names another process here, or none. Judged by the hostname, a live peer whose pid is none
here held every hang verdict back ("its process is gone: a dead peer"), and a dead peer whose pid is another
process here was never reported dead ("frozen, not dead"). Each heartbeat now carries "pidns" (the kernel's boot
id and the PID namespace); a peer of another is judged by its heartbeat alone, as one on another host. Real
watchdog threads, real heartbeat files, and (where this machine allows it) a real peer in a PID namespace of its
own (`unshare`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from conftest import start
from test_hang import stuck
from taehv_launch.files import write_atomic
from taehv_launch.rundir.heartbeat import read_hang_reports, stack_path
from taehv_launch.train.durability.watchdog import Watchdog, pid_namespace

ELSEWHERE = "0f0f0f0f-another-kernel/pid:[4026532999]"  # another machine's (or container's) PID namespace


def gone_pid() -> int:
    child = start([sys.executable, "-c", "pass"], capture=False)
    child.wait()  # reaped: its pid names no process here
    return child.pid


def reported_dead(run, progress, **kw) -> str:
    """Rank 0's watchdog over a 2-rank job until it reports rank 1 dead: that line."""
    deads: list[str] = []
    w0 = Watchdog(run, 0, 2, 0, deads.append, period_s=0.1, stale_s=0.5, hang_timeout=600.0,
                  on_hang=lambda r, d: None, progress=progress, **kw)  # fmt: skip
    w0.start()
    try:
        assert wait_until(lambda: deads, timeout=30)
        return deads[0]
    finally:
        w0.stop(clean=False)


def wait_until(what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not what() and time.monotonic() < deadline:
        time.sleep(0.05)
    return what()


def peer_beat(tmp_path, pid: int, pidns: str | None, **kw) -> None:
    info = {"rank": 1, "node": 0, "host": socket.gethostname(), "pid": pid, "pidns": pidns, "step": 5}
    info |= {"phase": "backward", "collectives": 8, "progress_age_s": 0.1, "warmup": False} | kw
    (tmp_path / "heartbeat").mkdir(exist_ok=True)
    write_atomic(tmp_path / "heartbeat" / "rank1", json.dumps(info))  # as a rank rewrites it


def test_pid_namespace_names_this_kernels_boot_and_our_pid_namespace():
    ns = pid_namespace()
    assert ns is not None and ns.endswith(f"/{os.readlink('/proc/self/ns/pid')}")
    assert ns.split("/")[0] == open("/proc/sys/kernel/random/boot_id").read().strip()


def test_a_live_peer_of_another_pid_namespace_on_our_hostname_is_still_judged_for_hangs(tmp_path):
    """Its heartbeat runs on (its threads live), its pid is no process here, it is behind rank 0: hung. Judged
    by the hostname, "its process is gone" held the verdict back for ever, and the job hung undetected."""
    hangs, deads = [], []
    w0 = Watchdog(tmp_path, 0, 2, 0, deads.append, period_s=0.1, stale_s=30.0, hang_timeout=1.0,
                  hang_timeout_slow=1.0, on_hang=lambda r, d: hangs.append(r),
                  progress=stuck(5, "collective", 9))  # fmt: skip
    pid, t0, done = gone_pid(), time.monotonic(), threading.Event()

    def beat():  # the peer's watchdog thread, in its own container: it beats, and dumps once it reads a report
        while not done.wait(0.1):
            peer_beat(tmp_path, pid, ELSEWHERE, progress_age_s=round(time.monotonic() - t0, 1))
            if read_hang_reports(tmp_path) and not stack_path(tmp_path, 1).exists():
                stack_path(tmp_path, 1).write_text("rank 1 of 2: its stacks")

    beat_thread = threading.Thread(target=beat, daemon=True)
    beat_thread.start()
    w0.start()
    try:
        assert wait_until(lambda: hangs, timeout=30), "no hang verdict"
        report = hangs[0]
        assert report["culprits"] == [1] and report["why"] == "behind", report["line"]
        assert report["ranks"]["1"]["pid_here"] is False and report["ranks"]["1"]["state"] is None
        assert report["line"].startswith("job hung: rank 1 stuck in backward at step 5") and deads == []
    finally:
        done.set()
        beat_thread.join()
        w0.stop(clean=False)


def test_a_dead_peer_of_another_pid_namespace_whose_pid_is_a_process_here_is_reported_dead(tmp_path):
    """Its heartbeat stopped; its pid number happens to be a live process of ours. Judged by the hostname it was
    "frozen, not dead" and waited for the hang limit (here 600 s); it is a silent rank elsewhere: dead after
    stale_s."""
    peer_beat(tmp_path, os.getpid(), ELSEWHERE)  # its last beat
    dead = reported_dead(tmp_path, stuck(5, "backward", 9), hang_timeout_slow=600.0)
    assert dead.startswith(f"rank 1 (node 0, host {socket.gethostname()}, pid {os.getpid()}) stopped ")


def test_in_our_own_pid_namespace_the_pid_still_tells_frozen_from_dead(tmp_path):
    """The rule of the same namespace stands: a stale peer whose process exists is frozen (the hang detector
    judges it), one whose process is gone is dead; a heartbeat without "pidns" (or another's) is not looked up."""
    w0 = Watchdog(tmp_path, 0, 2, 0, lambda why: None, stale_s=1.0, hang_timeout=600.0,
                  on_hang=lambda r, d: None, progress=stuck(5, "backward", 9))  # fmt: skip
    later = time.time() + 60  # the filesystem's "now", a minute after the beats below
    peer_beat(tmp_path, os.getpid(), pid_namespace())
    assert w0._problem(1, later) is None  # its process exists here: frozen, not dead
    peer_beat(tmp_path, gone_pid(), pid_namespace())
    assert "stopped responding" in w0._problem(1, later)  # gone: dead
    for pidns in (ELSEWHERE, None):
        peer_beat(tmp_path, os.getpid(), pidns)
        assert "stopped responding" in w0._problem(1, later)  # not ours to look up: silent, so dead


PEER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from taehv_launch.train.durability.progress import Progress
    from taehv_launch.train.durability.watchdog import Watchdog
    p = Progress()
    p.set_step(4)
    p.set_phase("backward")
    Watchdog(Path(sys.argv[1]), 1, 2, 0, lambda why: None, period_s=0.1, stale_s=30.0, hang_timeout=600.0,
             on_hang=lambda r, d: None, progress=p).start()
    print("beating", flush=True)
    time.sleep(120)
""")


def _unshare_works() -> bool:
    if not shutil.which("unshare"):
        return False
    try:
        return subprocess.run(["unshare", "-Urpf", "--mount-proc", "true"], timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_a_real_peer_in_a_pid_namespace_of_its_own_is_reported_dead_once_killed(tmp_path):
    """A real rank's watchdog in a new PID namespace (`unshare`: pid 1 there, our hostname). Killed, its pid 1 is
    still a process here (this namespace's init): looked up by hostname it was frozen for ever."""
    if not _unshare_works():
        pytest.skip("unshare -Urpf (a user and PID namespace) is not allowed on this machine")
    peer = start(
        ["unshare", "-Urpf", "--mount-proc", sys.executable, "-c", PEER, str(tmp_path)],
        capture=False,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert peer.stdout.readline() == "beating\n"
        beat = json.loads((tmp_path / "heartbeat" / "rank1").read_text())
        assert beat["host"] == socket.gethostname() and beat["pidns"] not in (None, pid_namespace())
        assert psutil.pid_exists(beat["pid"])  # its pid in its namespace is a live process in ours too
        for p in psutil.Process(peer.pid).children(recursive=True):
            p.send_signal(signal.SIGKILL)  # the rank, inside the namespace
        dead = reported_dead(tmp_path, stuck(4, "backward", 9))
        assert dead.startswith(f"rank 1 (node 0, host {socket.gethostname()}, pid {beat['pid']}) stopped")
    finally:
        peer.kill()
        peer.wait()


def test_status_and_the_freeze_watch_look_up_a_pid_only_in_its_own_namespace():
    """The watchdog's rule in the readers too (rundir/heartbeat.process_state, used by `status`'s rank rows and the
    launcher's freeze watch): a heartbeat of our hostname whose pidns is another's names no process of ours; one
    from before pidns was recorded is looked up by hostname as before."""
    from taehv_launch.rundir.heartbeat import process_state

    here, me = socket.gethostname(), os.getpid()
    assert process_state(here, me, pid_namespace()) in ("R", "S", "D")
    assert process_state(here, me) in ("R", "S", "D")  # an older heartbeat: no pidns
    assert process_state(here, me, ELSEWHERE) is None  # a container with our hostname: its pid is not ours
    assert process_state("another-host", me, pid_namespace()) is None
