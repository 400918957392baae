"""`taehv-launch status` and `diff` against hostile and damaged run directories (the #26 audit): valid
JSON of the wrong type, non-finite numbers, deep nesting, FIFOs and devices in place of records,
unreadable folders, an earlier launch's files during a resume's start-up, odd names and paths. Every
case reads hand-written run directories; status stays a pure read."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import CLI, assert_one_line_error, clean_env, run_cli_here
from taehv_launch.watch.status import collect
from test_status import files_of

HEADER = '"""Resolved by taehv-launch for `1 cpu`: a hand-written run."""\n\n'
CONFIG = (
    HEADER
    + "from easydict import EasyDict\n\nargs = EasyDict()\nargs.max_train_steps = 20\nargs.learning_rate = 0.0005\n"
)
STEP = "step {s}/20 | loss 1.0 | 1.50 samples/s | mem 0.0 GiB | ETA 0:00:10\n"
DEEP = "[" * 100_000 + "]" * 100_000


def base_run(root: Path, name: str = "r", now: float | None = None, manifest: bool = True) -> Path:
    """A run directory as a one-node run leaves it once ended: every record the status reads."""
    now = time.time() if now is None else now
    run = root / "output" / name
    (run / "heartbeat").mkdir(parents=True)
    (run / "config.py").write_text(CONFIG)
    topo = {"num_machines": 1, "machine_rank": 0, "gpus_per_machine": 1}
    (run / "env.json").write_text(json.dumps({"topology": topo, "exported": {"OMP_NUM_THREADS": "2"}}))
    (run / "launch.log").write_text("\n=== taehv-launch 2026-01-01 00:00:00: accelerate launch\n" + STEP.format(s=20))
    rec = {"step": 20, "total": 20, "samples_per_s": 1.5, "samples_per_s_avg": 1.2, "global_batch": 1}
    (run / "progress.json").write_text(json.dumps({**rec, "eta_s": 0.0, "time": now - 5, "started": now - 60}))
    hb = {"rank": 0, "node": 0, "host": "h", "step": 20, "phase": "done", "progress_age_s": 1.0, "time": now}
    (run / "heartbeat" / "rank0").write_text(json.dumps(hb))
    (run / "exit_status.json").write_text(json.dumps({"code": 0, "message": "ok"}))
    (run / "requeue.json").write_text(json.dumps({"count": 1, "without_progress": 0}))
    if manifest:
        record = {
            "time": now - 70,
            "launch": 1,
            "run_dir": str(run),
            "plan": {"gpus": 1, "profile": "cpu", "num_machines": 1, "world_size": 1, "hash": "abc"},
            "config": {"max_train_steps": 20, "learning_rate": 0.0005},
            "environment": {"host": "h", "exported": {"OMP_NUM_THREADS": "2"}, "kept": {}},
            "versions": {"taehv-launch": "0.1", "git": {"commit": "0123456789abcdef", "dirty": False}},
        }
        (run / "manifest.jsonl").write_text(json.dumps(record) + "\n")
    for p in (run / "heartbeat" / "rank0", run / "exit_status.json"):
        os.utime(p, (now - 5, now - 5))
    return run


def status(*args: str, cwd: Path):
    return run_cli_here("status", *args, env=clean_env(), cwd=cwd)


def diff(*args: str, cwd: Path):
    return run_cli_here("diff", *args, env=clean_env(), cwd=cwd)


def manifest_with(run: Path, **changes) -> None:
    rec = json.loads((run / "manifest.jsonl").read_text())
    for dotted, value in changes.items():
        *parents, key = dotted.split("__")
        d = rec
        for p in parents:
            d = d[p]
        d[key] = value
    (run / "manifest.jsonl").write_text(json.dumps(rec) + "\n")


WRONG = [  # (file, text): valid JSON (or nearly) of the wrong type or value
    ("exit_status.json", "[0]"),
    ("exit_status.json", '"ok"'),
    ("exit_status.json", '{"code": "0"}'),
    ("exit_status.json", '{"code": true, "message": ["x"]}'),
    ("heartbeat/rank0", "[1, 2]"),
    ("heartbeat/rank0", "null"),
    ("heartbeat/rank0", '"x"'),
    ("heartbeat/rank0", '{"node": [0], "host": 3, "step": "7", "phase": {}, "progress_age_s": "x"}'),
    ("heartbeat/rank0", DEEP),
    ("progress.json", '{"step": 3, "total": "20", "eta_s": "5", "time": "now", "samples_per_s": "fast"}'),
    ("progress.json", '{"step": 3, "total": 20, "eta_s": Infinity, "time": NaN, "samples_per_s": -Infinity}'),
    ("progress.json", '{"step": 3, "total": 20, "eta_s": 1e300, "time": 1e300, "started": 1e20}'),
    ("progress.json", '{"step": "3"}'),
    ("progress.json", DEEP),
    ("requeue.json", '{"count": "2", "without_progress": [1], "stopped": 5}'),
    ("env.json", "[1]"),
    ("env.json", '{"topology": {"num_machines": "2", "gpus_per_machine": 2}}'),
    ("events.jsonl", '{"event": "rollback", "time": "yesterday", "step": [1], "reason": {"x": 1}}\n[1]\n'),
    (".lock", '{"host": "x", "pid": "1"}'),
    ("heartbeat/rank0.dead", ""),
    ("heartbeat/rank0.hang", '{"line": null, "time": "x"}'),
    ("launch.log", "step 999999999999999999999/1 | x | 1e999 samples/s | ETA 99999 days, 0:00:00\n"),
]


@pytest.mark.parametrize("name, text", WRONG, ids=[f"{n}:{t[:24]}" for n, t in WRONG])
def test_wrong_types_and_values_in_the_records(tmp_path, name, text):
    run = base_run(tmp_path)
    (run / name).write_text(text)
    before = files_of(tmp_path)
    for args in (("output/r",), ("output/r", "--json"), ("output",)):
        proc = status(*args, cwd=tmp_path)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stdout.strip(), proc.stderr
    assert files_of(tmp_path) == before  # pure read
    if name != "exit_status.json":  # live: the ETA and the heartbeat lines are shown too
        (run / "exit_status.json").unlink()
        for args in (("output/r",), ("output/r", "--json")):
            proc = status(*args, cwd=tmp_path)
            assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


MANIFESTS = [
    {"versions__git__commit": None},  # what the launcher records from a checkout without commits
    {"versions__git": "abc"},
    {"plan": [1, 2]},
    {"time": "yesterday"},
    {"time": 1e20},
    {"environment__exported": ["A=1"]},
    {"environment__gpu": [1]},
    {"versions__packages": [1]},
    {"config": None},
]


@pytest.mark.parametrize(
    "changes", MANIFESTS, ids=[next(iter(c)) + "=" + repr(next(iter(c.values()))) for c in MANIFESTS]
)
def test_a_damaged_manifest_record(tmp_path, changes):
    run = base_run(tmp_path)
    manifest_with(run, **changes)
    (run / "heartbeat" / "rank0.hang").write_text('{"line": "hang: rank 0", "time": 1}')
    for proc in (status("output/r", cwd=tmp_path), status("output/r", "--json", cwd=tmp_path)):
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    proc = diff("output/r", "output/r", cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "identical" in proc.stdout, proc.stdout


def test_a_null_commit_reads_as_no_commit(tmp_path):
    a = base_run(tmp_path, "a")
    base_run(tmp_path, "b")
    manifest_with(a, versions__git__commit=None)
    proc = diff("output/a", "output/b", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert any(line.split()[:4] == ["git", "commit", "(no", "commit)"] for line in proc.stdout.splitlines()), (
        proc.stdout
    )


def test_fifos_devices_and_huge_files_never_block(tmp_path):
    """A FIFO, /dev/zero and a file past the record limit in place of every record: status answers."""
    run = base_run(tmp_path)
    for name in ("progress.json", "heartbeat/rank0", "exit_status.json", "launch.log", "requeue.json", ".lock"):
        (run / name).unlink(missing_ok=True)
        os.mkfifo(run / name)
    for name in ("manifest.jsonl", "env.json", "events.jsonl"):
        (run / name).unlink(missing_ok=True)
        (run / name).symlink_to("/dev/zero")
    (run / "heartbeat" / "rank1").write_bytes(b" " * (17 << 20))
    os.mkfifo(run / "heartbeat" / "rank0.dead")
    for args in (["output/r"], ["output/r", "--json"]):
        proc = subprocess.run([*CLI, "status", *args], capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    proc = subprocess.run([*CLI, "diff", "output/r", "1 cpu"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert "Traceback" not in proc.stderr and proc.returncode in (0, 1), proc.stderr
    assert "manifest.jsonl unreadable" in proc.stdout, proc.stdout


def test_a_huge_manifest_is_read_from_its_tail(tmp_path):
    run = base_run(tmp_path)
    line = (run / "manifest.jsonl").read_text()
    with open(run / "manifest.jsonl", "w") as f:
        f.write(json.dumps({"pad": "x" * (17 << 20)}) + "\n" + line)
    doc = json.loads(status("output/r", "--json", cwd=tmp_path).stdout)
    assert doc["runs"][0]["launches"] == 1 and doc["runs"][0]["plan_hash"] == "abc"


def test_a_huge_manifest_counts_its_launches_from_the_newest_record_of_its_tail(tmp_path):
    """#35 item 8: over 16 MiB only the tail is read; launches is its newest record's number, the first
    launch's time is not claimed, and diff says the tail was read."""
    run = base_run(tmp_path)
    rec = json.loads((run / "manifest.jsonl").read_text())
    with open(run / "manifest.jsonl", "w") as f:
        for n in (1, 2, 3, 4):
            f.write(json.dumps({**rec, "launch": n, **({"pad": "x" * (17 << 20)} if n == 2 else {})}) + "\n")
    doc = json.loads(status("output/r", "--json", cwd=tmp_path).stdout)["runs"][0]
    assert (doc["launches"], doc["first_launch"], doc["unreadable"]) == (4, None, [])
    assert "  launches   4 (manifest.jsonl; plan abc)" in status("output/r", cwd=tmp_path).stdout.splitlines()
    title = diff("output/r", "output/r", cwd=tmp_path).stdout.splitlines()[0]
    assert "(launch 4 of 4, " in title and "; manifest.jsonl over 16 MiB: its tail read)" in title, title


def test_a_huge_manifest_with_no_record_in_its_tail_says_so(tmp_path):
    """#35 item 8: the tail of a manifest over 16 MiB holds no whole record: the launches line says it
    could not be read (it was left out, silently), and diff says unreadable, not 'before manifest.jsonl'."""
    run = base_run(tmp_path)
    with open(run / "manifest.jsonl", "a") as f:
        f.write(json.dumps({"pad": "x" * (17 << 20)}) + "\n")
    why = "manifest.jsonl unreadable (17 MiB, no whole record in its last 16 MiB)"
    lines = status("output/r", cwd=tmp_path).stdout.splitlines()
    assert f"  launches   unknown: {why}" in lines and not any(l.startswith("  unreadable") for l in lines), lines
    doc = json.loads(status("output/r", "--json", cwd=tmp_path).stdout)["runs"][0]
    assert doc["launches"] is None and doc["unreadable"] == [
        "manifest.jsonl: 17 MiB, no whole record in its last 16 MiB"
    ]
    assert f"({why}: its config.py and env.json only)" in diff("output/r", "output/r", cwd=tmp_path).stdout


@pytest.mark.parametrize(
    "make, why",
    [
        (lambda p: p.write_text(""), "empty: no record"),
        (lambda p: p.symlink_to("nowhere.jsonl"), "a link to nowhere.jsonl, which does not exist"),
        (lambda p: p.symlink_to(p.name), "Too many levels of symbolic links"),
        (lambda p: p.mkdir(), "Is a directory"),
    ],
    ids=["empty", "dangling link", "link loop", "folder"],
)
def test_a_manifest_that_is_there_but_gives_no_record_is_unreadable_not_absent(tmp_path, make, why):
    """#35 item 8: diff called these 'before manifest.jsonl' (a run older than manifests); status left
    the launches line out."""
    run = base_run(tmp_path)
    (run / "manifest.jsonl").unlink()
    make(run / "manifest.jsonl")
    proc = diff("output/r", "1 cpu", cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"(manifest.jsonl unreadable ({why}): its config.py and env.json only)" in proc.stdout, proc.stdout
    assert "before manifest.jsonl" not in proc.stdout, proc.stdout
    assert f"  launches   unknown: manifest.jsonl unreadable ({why})" in status("output/r", cwd=tmp_path).stdout


def test_heartbeat_and_event_fields_of_the_wrong_type_read_as_unknown_never_none(tmp_path):
    """#35 item 8: a heartbeat whose node, host, step and phase are of another type (or missing) printed
    'node None  None' and 'node None (None): ;'; a rollback without step or reason 'at step None (None)'."""
    run = base_run(tmp_path)
    (run / "exit_status.json").unlink()  # live: the node and rank lines are shown
    hb = {"rank": 0, "node": [0], "host": 3, "step": "7", "phase": {}, "progress_age_s": "x"}
    (run / "heartbeat" / "rank0").write_text(json.dumps(hb))
    (run / "events.jsonl").write_text('{"event": "rollback"}\n{"event": "stop", "step": 9}\n')
    lines = status("output/r", cwd=tmp_path).stdout.splitlines()
    assert not [line for line in lines if "None" in line], lines
    assert any(line.startswith("  node ?     ?: rank 0, heartbeat ") for line in lines), lines
    assert any(line.startswith("  rank 0     node ? (?): step and phase unknown; heartbeat ") for line in lines)
    assert "  rollbacks  1; last at step ? (events.jsonl); stopped: diverged again at step 9" in lines, lines
    node = json.loads(status("output/r", "--json", cwd=tmp_path).stdout)["runs"][0]["heartbeat_nodes"][0]
    assert node["host"] is None and node["node"] is None  # unknown in the JSON too (was the text "None")


# ----------------------------------------------------------------- unreadable folders (EACCES)


def without_override(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`taehv-launch ARGS` as a process that file permissions apply to: root drops the capabilities that
    bypass them (setpriv); another user runs it as is."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: permissions cannot be tested")
        caps = "-dac_override,-dac_read_search"
        prefix = ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"]
    return subprocess.run([*prefix, *CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.fixture
def locked(tmp_path):
    """output/ with runs a (readable), b (mode 000) and c (a checkpoint folder of mode 000)."""
    base_run(tmp_path, "a")
    b, c = base_run(tmp_path, "b"), base_run(tmp_path, "c")
    (c / "checkpoint-20").mkdir()
    modes = [(b, 0o000), (c / "checkpoint-20", 0o000)]
    for path, mode in modes:
        path.chmod(mode)
    yield tmp_path
    for path, _mode in modes:
        path.chmod(0o755)


def test_an_unreadable_run_does_not_hide_the_others(locked):
    proc = without_override("status", "output", cwd=locked)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[1:] if line.strip() and line[0] != "("}
    assert set(rows) == {"a", "b", "c"}, proc.stdout
    assert rows["b"].split()[1] == "unreadable" and rows["a"].split()[1] == "ended", proc.stdout
    proc = without_override("status", "output/c", cwd=locked)
    assert proc.returncode == 0, proc.stderr
    assert "  unreadable checkpoint-20: Permission denied" in proc.stdout.splitlines(), proc.stdout
    assert_one_line_error(without_override("status", "output/b", cwd=locked), r"cannot read the run directory .*/b")
    assert_one_line_error(without_override("diff", "output/b", "output/a", cwd=locked), r"cannot read output/b")


def test_an_unreadable_output_dir(tmp_path):
    base_run(tmp_path, "a")
    (tmp_path / "output").chmod(0)
    try:
        assert_one_line_error(without_override("status", "output", cwd=tmp_path), r"cannot read")
        assert_one_line_error(without_override("status", "output/a", cwd=tmp_path), r"output/a")
    finally:
        (tmp_path / "output").chmod(0o755)


# ----------------------------------------------------------------- a resume's start-up


def test_a_resume_starting_shows_where_the_previous_launch_got_to(tmp_path):
    now = time.time()
    run = base_run(tmp_path, now=now - 30)  # the first launch ended 30 s ago
    (run / "exit_status.json").unlink()  # the new launch removes it before starting the trainer
    with open(run / "launch.log", "a") as f:
        f.write("\n=== taehv-launch 2026-01-01 00:10:00: accelerate launch --resume\n")
    (run / ".lock").write_text(json.dumps({"host": "elsewhere", "pid": 1, "since": "now"}))
    os.utime(run / ".lock", (now - 3, now - 3))
    first = json.loads((run / "manifest.jsonl").read_text())
    second = {**first, "time": now - 3, "launch": 2, "resume": str(run / "checkpoint-20")}
    with open(run / "manifest.jsonl", "a") as f:
        f.write(json.dumps(second) + "\n")
    facts = collect(run, now)
    assert facts["state"] == "starting", facts
    assert facts["step"] == 20 and facts["progress_of"] == "previous launch", facts
    assert facts["eta_s"] is None and facts["clips_per_s"] is None and facts["launch_started"] is None
    assert facts["heartbeat_ranks"] == []  # the earlier launch's heartbeat is not this launch's
    text = status("output/r", cwd=tmp_path).stdout
    assert "starting (launch log written" in text, text
    assert "step       20/20 (100%) where the previous launch got to" in text, text
    assert "resumes from checkpoint-20" in text and "ETA" not in text and "speed" not in text, text
    (run / "manifest.jsonl").write_text(json.dumps(first) + "\n")  # the new launch could not write its record:
    (run / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))  # its launcher runs
    os.utime(run / ".lock", (now - 3, now - 3))
    facts = collect(run, now)
    assert facts["state"] == "starting" and facts["progress_of"] == "previous launch", facts
    (run / "progress.json").unlink()  # a run from before progress.json: the log's step line, above the banner
    facts = collect(run, now)
    assert facts["step"] == 20 and facts["progress_of"] == "previous launch" and facts["eta_s"] is None
    # once this launch logs, its own numbers count again
    (run / "progress.json").write_text(
        json.dumps({"step": 21, "total": 30, "samples_per_s": 2.0, "eta_s": 9.0, "time": now - 1, "started": now - 2})
    )
    facts = collect(run, now)
    assert facts["progress_of"] == "this launch" and facts["eta_s"] is not None and facts["total"] == 30


def test_before_the_first_log_line_the_total_comes_from_config_py(tmp_path):
    run = base_run(tmp_path)
    for name in ("progress.json", "exit_status.json", "heartbeat/rank0"):
        (run / name).unlink()
    (run / "launch.log").write_text("\n=== taehv-launch 2026-01-01 00:00:00: accelerate launch\n")
    facts = collect(run)
    assert facts["step"] is None and facts["total"] == 20
    assert "  step       none logged yet, of 20 (config.py)" in status("output/r", cwd=tmp_path).stdout


# ----------------------------------------------------------------- names, paths and arguments


def test_odd_names_and_paths(tmp_path):
    base_run(tmp_path, "a\nb")
    base_run(tmp_path, "c")
    text = status("output", cwd=tmp_path).stdout
    assert any(line.startswith("a\\nb ") for line in text.splitlines()), text
    assert text.splitlines()[0].startswith("RUN"), text
    assert status("output/a\nb", cwd=tmp_path).stdout.startswith("run a\\nb  "), text
    assert_one_line_error(status("", cwd=tmp_path), r"an empty path ''")
    assert_one_line_error(diff("output/c", "", cwd=tmp_path), r"an empty path ''")
    (tmp_path / "output" / "latest").symlink_to("gone")
    assert_one_line_error(status(cwd=tmp_path), r"output/latest points to gone, which does not exist")
    assert_one_line_error(diff("latest", "output/c", cwd=tmp_path), r"latest points to gone, which does not exist")
    (tmp_path / "output" / "loop").symlink_to("loop")  # #35 item 8: was "points to loop, which does not exist"
    (tmp_path / "output" / "a").symlink_to("b")
    (tmp_path / "output" / "b").symlink_to("a")
    loop = r"is a loop of symbolic links \(it points to {}, which leads back to it\): .* or remove or repoint the link$"
    for name, to in (("loop", "loop"), ("a", "b")):
        assert_one_line_error(status(f"output/{name}", cwd=tmp_path), f"output/{name} " + loop.format(to))
        assert_one_line_error(diff(f"output/{name}", "output/c", cwd=tmp_path), f"output/{name} " + loop.format(to))
    inside = r"output/loop/r goes through a loop of symbolic links \(a folder on its way\)"
    assert_one_line_error(status("output/loop/r", cwd=tmp_path), inside)
    assert_one_line_error(diff("output/c", "output/loop/r", cwd=tmp_path), inside)
    (tmp_path / "empty").mkdir()
    message = r"empty is not a run directory \(no config.py, env.json, launch.log, manifest.jsonl or exit_status.json\)"
    assert_one_line_error(status("empty", cwd=tmp_path), message)
    assert_one_line_error(diff("empty", "output/c", cwd=tmp_path), message)


def test_plans_with_unicode_spaces(tmp_path):
    proc = diff("1\u00a0cpu", "1 cpu", cwd=tmp_path)
    assert proc.returncode == 0 and "identical" in proc.stdout, proc.stdout + proc.stderr
    assert_one_line_error(diff("1\u2003", "1 cpu", cwd=tmp_path), r"no run, config file or plan")


def test_only_needs_a_group_and_something_to_compare(tmp_path):
    base_run(tmp_path, "old", manifest=False)
    for only in ("", ",", " , "):
        assert_one_line_error(diff("1 cpu", "2 cpu", "--only", only, cwd=tmp_path), r"--only .*: groups are")
    assert_one_line_error(
        diff("output/old", "1 cpu", "--only", "versions", cwd=tmp_path),
        r"nothing to compare: versions: not compared, not recorded \(before manifest.jsonl\) for A",
    )


# ----------------------------------------------------------------- diff runs no code of the run's


def test_diff_reads_config_py_without_running_it(tmp_path):
    mark = tmp_path / "PWNED"
    run = base_run(tmp_path, "old", manifest=False)
    (run / "config.py").write_text(CONFIG + f"open({str(mark)!r}, 'w').write('x')\nargs.seed = 7\n")
    proc = diff("output/old", "output/old", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not mark.exists()
    assert "(before manifest.jsonl: its config.py and env.json only)" in proc.stdout.splitlines()[0], proc.stdout
    assert "note: versions: not compared, not recorded (before manifest.jsonl) for A" in proc.stdout, proc.stdout
    (run / "manifest.jsonl").write_text("not json\n{torn\n")  # corrupt: told apart from absent
    proc = diff("output/old", "1 cpu", "--json", cwd=tmp_path)
    assert not mark.exists() and proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert "manifest.jsonl unreadable (2 line(s) left out, none readable)" in doc["a"]["title"], doc
    assert any(
        n.startswith("versions: not compared, not recorded (manifest.jsonl unreadable") for n in doc["not_compared"]
    )
    (run / "env.json").write_text("[1]")
    assert diff("output/old", "output/old", cwd=tmp_path).returncode == 0


def test_status_imports_no_training_library(tmp_path):
    base_run(tmp_path)
    code = (
        "import sys; from taehv_launch.cli import main; sys.argv = ['taehv-launch', 'status', 'output/r'];\n"
        "try: main()\nexcept SystemExit: pass\n"
        "print('HEAVY', sorted(m for m in ('torch', 'accelerate', 'deepspeed', 'diffusers') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert "HEAVY []" in proc.stdout, proc.stdout + proc.stderr
