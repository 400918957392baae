"""`taehv-launch status` (#26): where runs stand, read from their run directories only. Real runs of the
launcher on the cpu profile (a two-node run followed live to its end, a failed run, a killed one) and,
for the fast cases, run directories written with the formats' own writers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import Proc, assert_one_line_error, clean_env, free_port, run_cli, run_cli_here, start_cli
from taehv_launch.rundir.checkpoint import checkpoint_dir, write_complete
from taehv_launch.rundir.events import EVENTS_FILE, append_event
from taehv_launch.rundir.heartbeat import heartbeat_dir
from taehv_launch.rundir.progress import write_progress
from taehv_launch.rundir.exitstatus import exit_status_path, write_exit_status
from taehv_launch.watch.status import LIVE_S, collect
from taehv_launch.watch.statustext import ago, duration, ranks_text
from trainrun import FAST

FIELDS = {  # `status --json`: stable names (docs/watching.md lists them)
    "run",
    "run_dir",
    "state",
    "exit_code",
    "now",
    "step",
    "logged_step",
    "total",
    "clips_per_s",
    "clips_per_s_avg",
    "global_batch",
    "eta_s",
    "ends_at",
    "progress_time",
    "progress_from",
    "progress_of",
    "launch_started",
    "flops",
    "checkpoint",
    "nodes",
    "processes",
    "heartbeat_nodes",
    "heartbeat_ranks",
    "heartbeat_age_s",
    "log_age_s",
    "exit",
    "last_error",
    "hang",
    "requeues",
    "requeue_marker",
    "rollbacks",
    "restarts",
    "launches",
    "first_launch",
    "resume_from",
    "plan_hash",
    "node_logs",
    "unreadable",
    "validation",
    "unstarted",
}


def files_of(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under root (links included, not followed) with its size and mtime: to see that nothing was written."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def live_run(tmp: Path, now: float) -> Path:
    """A run directory as a live two-node run leaves it: env files, four ranks' heartbeats (rank 3's
    last one 5 min old), progress.json 10 s old, one complete checkpoint, a launch log."""
    run = tmp / "output" / "live"
    run.mkdir(parents=True)
    for node in (0, 1):
        topo = {"num_machines": 2, "machine_rank": node, "gpus_per_machine": 2, "source": "test"}
        (run / f"env{'' if node == 0 else '.node1'}.json").write_text(json.dumps({"topology": topo}))
        (run / f"launch{'' if node == 0 else '.node1'}.log").write_text("step 1/100 | loss 1.0\n")
    heartbeat_dir(run).mkdir()
    for rank in range(4):
        node = rank // 2
        path = heartbeat_dir(run) / f"rank{rank}"
        step = 40 if rank == 3 else 42  # the live ranks are past the last log line (step 40)
        rec = {"rank": rank, "node": node, "host": f"host{node}", "step": step, "phase": "forward", "time": now}
        path.write_text(json.dumps(rec))
        if rank == 3:
            os.utime(path, (now - 300, now - 300))
    write_progress(
        run,
        {
            "step": 40,
            "total": 100,
            "samples_per_s": 12.5,
            "samples_per_s_avg": 11.0,
            "global_batch": 8,
            "eta_s": 3600.0,
            "time": now - 10,
            "started": now - 600,
        },
    )
    ckpt = checkpoint_dir(run, 40)
    ckpt.mkdir()
    (ckpt / "trainer_state.json").write_text('{"step": 40}')
    write_complete(ckpt, 40)
    (tmp / "output" / "latest").symlink_to("live")
    return run


def test_ages_read_as_people_say_them():
    assert [duration(s) for s in (5, 180, 7500, 7200, 90000)] == ["5 s", "3 min", "2 h 5 min", "2 h", "1 d 1 h"]
    assert ago(0.2) == "just now" and ago(180) == "3 min ago" and ago(None) == "-"
    assert ranks_text([0, 1, 2, 3, 6]) == "ranks 0-3, 6" and ranks_text([5]) == "rank 5"


def test_a_live_run_from_its_files(tmp_path):
    now = time.time()
    run = live_run(tmp_path, now)
    f = collect(run, now)
    assert set(f) == FIELDS
    assert f["state"] == "running" and f["step"] == 42 and f["logged_step"] == 40 and f["total"] == 100
    assert f["clips_per_s"] == 12.5 and f["clips_per_s_avg"] == 11.0 and f["progress_from"] == "progress.json"
    assert 3580 < f["eta_s"] <= 3590  # the ETA written 10 s ago, less those 10 s
    assert f["nodes"] == 2 and f["processes"] == 4
    assert [(n["node"], n["host"], n["ranks"]) for n in f["heartbeat_nodes"]] == [
        (0, "host0", [0, 1]),
        (1, "host1", [2, 3]),
    ]
    assert [r["rank"] for r in f["heartbeat_ranks"] if r["stale"]] == [3]
    assert f["checkpoint"]["name"] == "checkpoint-40" and f["checkpoint"]["age_s"] < LIVE_S
    proc = run_cli_here("status", cwd=tmp_path)  # default: output/latest
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "state      running (heartbeat" in out, out
    assert "step       42/100 (42%); last log line (step 40) 1" in out and "12.5 clips/s now, 11.0 average" in out, out
    assert "ETA        59 min, at " in out, out
    assert "node 1     host1: ranks 2-3, heartbeat just now (oldest 5 min ago)" in out, out
    assert "rank 3     node 1 (host1): step 40, forward; heartbeat 5 min ago" in out, out


def test_rollbacks_from_the_events_file(tmp_path):
    """The guard's events.jsonl (rundir/events.py): the count, the newest rollback, a stop; a torn or
    hostile line is skipped and a reason cannot add lines to the report."""
    now = time.time()
    run = live_run(tmp_path, now)
    assert collect(run, now)["rollbacks"] == {"count": 0, "last": None, "stopped": None}
    assert "  rollbacks  " not in run_cli_here("status", cwd=tmp_path).stdout
    rb = {"event": "rollback", "step": 130, "to_step": 100, "checkpoint": "checkpoint-100", "reason": "nan"}
    append_event(run, {**rb, "time": now - 7200})
    (run / EVENTS_FILE).open("a").write('{"event": "rollback", "step": \n[1, 2]\n\xff\n')
    append_event(run, {**rb, "time": now - 600, "step": 180, "reason": "loss spike\nerror: fake"})
    f = collect(run, now)["rollbacks"]
    assert f["count"] == 2 and f["last"]["step"] == 180 and f["stopped"] is None
    out = run_cli_here("status", cwd=tmp_path).stdout
    line = "  rollbacks  2; last at step 180 (loss spike error: fake), back to checkpoint-100, 10 min ago"
    assert line + " (events.jsonl)\n" in out, out
    append_event(run, {"event": "stop", "time": now, "step": 200, "reason": "non-finite loss"})
    out = run_cli_here("status", cwd=tmp_path).stdout
    assert "; stopped: diverged again at step 200 (non-finite loss)" in out, out


def test_json_and_several_runs(tmp_path):
    now = time.time()
    live = live_run(tmp_path, now)
    ended = tmp_path / "output" / "ended"
    ended.mkdir()
    (ended / "launch.log").write_text("[rank 0] error: something broke\n")
    write_exit_status(exit_status_path(ended, 0), 1, "something broke")
    before = files_of(tmp_path)
    doc = json.loads(run_cli_here("status", "--json", "output", cwd=tmp_path).stdout)
    assert {r["run"]: r["state"] for r in doc["runs"]} == {"live": "running", "ended": "failed"}
    assert all(set(r) == FIELDS for r in doc["runs"])
    failed = next(r for r in doc["runs"] if r["run"] == "ended")
    assert failed["exit"] == [{"node": 0, "code": 1, "message": "something broke"}]
    assert failed["last_error"] == "[rank 0] error: something broke"
    table = run_cli_here("status", str(tmp_path / "output" / "*"), cwd=tmp_path)  # a glob (latest is the same run)
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split()[:3] == ["RUN", "STATE", "STEP"]
    assert len([line for line in table.stdout.splitlines() if line.startswith(("live ", "ended "))]) == 2
    assert files_of(tmp_path) == before, "status wrote something"
    assert live.is_dir()


def test_bad_input_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("x")
    assert_one_line_error(run_cli_here("status", cwd=tmp_path), r"no run directory output/latest")
    assert_one_line_error(run_cli_here("status", "empty", cwd=tmp_path), r"empty is not a run directory")
    assert_one_line_error(run_cli_here("status", "file.txt", cwd=tmp_path), r"file.txt is not a run directory")
    assert_one_line_error(run_cli_here("status", "out*/x*", cwd=tmp_path), r"out\*/x\* matches nothing")
    assert_one_line_error(run_cli_here("status", "nope", cwd=tmp_path), r"no run directory nope \(nor output/nope\)")


def test_status_loads_nothing_heavy(tmp_path):
    live_run(tmp_path, time.time())
    code = (
        "import sys; sys.argv = ['taehv-launch', 'status', '--json']\n"
        "from taehv_launch.cli import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        "print('HEAVY', [m for m in ('torch', 'accelerate', 'deepspeed', 'diffusers', 'cv2') if m in sys.modules], "
        "code, file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), cwd=tmp_path)
    assert "HEAVY [] 0" in proc.stderr, proc.stderr


# --- real runs -----------------------------------------------------------------------------------


def start(tmp: Path, *args: str, name: str, nodes: int = 1) -> list[Proc]:
    """Launch `taehv-launch` in the background (one launcher per "node", loopback master)."""
    env = clean_env(TAEHV_CACHE=str(tmp.parent / "taehv-cache"), OMP_NUM_THREADS="1")
    port, procs = free_port(), []
    for rank in range(nodes):
        topo = ["--num-nodes", "2", "--node-rank", str(rank), "--gpus-per-node", "1", "--master-addr", "127.0.0.1"]
        argv = [str(nodes), "cpu", *(topo if nodes > 1 else []), "--master-port", str(port), "--run-name", name]
        argv += ["--set", f"output_dir='{tmp / 'output'}'", *FAST, *args]
        procs.append(start_cli(*argv, env=env, cwd=tmp))
        time.sleep(0.5)
    return procs


def wait_for(run: Path, test, timeout: float = 300) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        f = collect(run)
        if test(f):
            return f
        time.sleep(0.5)
    raise AssertionError(f"timed out; last status: {json.dumps(collect(run), default=str)[:3000]}")


@pytest.mark.slow
def test_status_follows_a_two_node_run_to_its_end(tmp_path):
    procs = start(tmp_path, "--set", "max_train_steps=6", name="mn", nodes=2)
    run = tmp_path / "output" / "mn"
    try:
        f = wait_for(
            run, lambda f: f["state"] == "running" and (f["step"] or 0) >= 1 and len(f["heartbeat_nodes"]) == 2
        )
    finally:
        outs = [p.communicate(timeout=600) for p in procs]
    assert f["nodes"] == 2 and f["processes"] == 2 and f["total"] == 6
    assert [n["ranks"] for n in f["heartbeat_nodes"]] == [[0], [1]]
    assert all(r["age_s"] < LIVE_S for r in f["heartbeat_ranks"])
    assert f["eta_s"] is not None and f["clips_per_s"] > 0
    assert [p.returncode for p in procs] == [0, 0], outs
    before = files_of(tmp_path)
    proc = run_cli("status", "output/mn", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "state      ended" in proc.stdout and "exit 0 (ok)" in proc.stdout, proc.stdout
    assert "step       6/6 (100%)" in proc.stdout and "checkpoint checkpoint-6, saved" in proc.stdout, proc.stdout
    assert "nodes      2 nodes, 2 processes" in proc.stdout, proc.stdout
    assert "exit       node 1: 0 (ok)" in proc.stdout, proc.stdout
    doc = json.loads(run_cli("status", "--json", str(run), cwd=tmp_path).stdout)["runs"][0]
    assert doc["state"] == "ended" and doc["exit_code"] == 0 and doc["launches"] == 1
    assert [e["node"] for e in doc["exit"]] == [0, 1]
    assert files_of(tmp_path) == before, "status wrote something"


@pytest.mark.slow
def test_status_of_a_failed_and_a_killed_run(tmp_path):
    import psutil

    # a weights file the launcher's header reader lets through (not a zip archive) and the trainer refuses
    # (a missing file is refused by the launcher now, before the run dir exists: #36)
    (tmp_path / "taecvx.pth").write_bytes(b"not a torch archive" * 50)
    (proc,) = start(tmp_path, "--set", f"pretrained_model_path='{tmp_path / 'taecvx.pth'}'", name="bad")
    proc.communicate(timeout=600)
    assert proc.returncode == 2
    f = collect(tmp_path / "output" / "bad")
    assert f["state"] == "failed" and f["exit_code"] == 2
    assert "taecvx.pth" in f["last_error"], f
    (proc,) = start(tmp_path, "--set", "max_train_steps=500", name="gone")
    run = tmp_path / "output" / "gone"
    try:
        wait_for(run, lambda f: f["state"] == "running" and (f["step"] or 0) >= 1)
    finally:
        victims = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
        for pid in victims:  # a lost node: every process killed at once, nothing recorded
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        proc.communicate(timeout=60)
    later = collect(run, time.time() + LIVE_S + 5)  # once its heartbeats have gone quiet
    assert later["state"] == "lost" and later["exit"] == [] and later["eta_s"] is None
    table = run_cli("status", "output", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    rows = {
        line.split()[0]: line for line in table.stdout.splitlines()[1:] if line.strip() and not line.startswith("(")
    }
    assert set(rows) == {"bad", "gone"} and "failed (2)" in rows["bad"], table.stdout


def test_the_docs_list_every_json_field():
    from conftest import REPO

    for doc in ("docs/watching.md", "docs/zh/watching.md"):
        text = (REPO / doc).read_text()
        assert not [f for f in sorted(FIELDS) if f"`{f}`" not in text], doc
