"""The requeue limit (#25): after max_requeues_without_progress requeues in a row that found no newer
complete checkpoint, the rendered jobs stop requeueing, say why in one line and record it in the
run's requeue.json.

What is real: the decision (rundir/requeue.py), `taehv-launch requeue-check` as a process, the
rendered sbatch script run by bash (its exit-75 branch, the check, `scontrol requeue` or the stop)
and the Kubernetes init container's command under the environment the Job gives a pod. Stood in:
`srun` (a script that exits 75 after the run's checkpoints are set up, as the launchers of a
stopped attempt leave them), `scontrol` (records its arguments), the checkpoints (a folder with a
COMPLETE marker: what the check reads). Hostile values reach the check's command line quoted."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import assert_one_line_error, clean_env, overrides, run_cli_here

from taehv_launch.rundir.checkpoint import COMPLETE
from taehv_launch.rundir.requeue import REQUEUE_FILE, decide, read_requeues, after_stop, at_start

RENDER = ["16", "h100", *overrides("data_root=/d ref_vae_path=/v")]
STAND_IN_SRUN = """#!/bin/bash
# stand-in srun: the step's launchers stopped with a checkpoint (exit 75); FAKE_NEW_STEP, when set,
# is the checkpoint this attempt saved (a complete checkpoint-<step> in the run directory)
if [ -n "${FAKE_NEW_STEP:-}" ]; then
  mkdir -p "$FAKE_RUN/checkpoint-$FAKE_NEW_STEP"
  echo '{"step": '"$FAKE_NEW_STEP"', "files": []}' > "$FAKE_RUN/checkpoint-$FAKE_NEW_STEP/COMPLETE"
fi
exit 75
"""
RECORD_SCONTROL = '#!/bin/bash\necho "$@" >> "$FAKE_OUT/scontrol"\n'
RECORD_ARGV = """#!/bin/bash
# stand-in taehv-launch: its argv, NUL-separated (no argv can hold a NUL); exits as told
printf '%s\\0' "$@" > "$FAKE_OUT/check_argv"
exit "${FAKE_CHECK_EXIT:-0}"
"""


def _ckpt(run: Path, step: int, complete: bool = True) -> None:
    folder = run / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    if complete:
        (folder / COMPLETE).write_text(json.dumps({"step": step, "files": []}))


def _exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


# --- the decision: pure ------------------------------------------------------------------------


def test_requeues_without_a_newer_checkpoint_stop_at_the_limit():
    prev = None
    for n in (1, 2):
        d = decide(prev, None, 3)
        assert (d.go, d.count, d.without_progress, d.progress) == (True, n, n, False)
        prev = d.record(None, "7")
    d = decide(prev, None, 3)
    assert (d.go, d.count, d.without_progress) == (False, 3, 3)


def test_a_newer_checkpoint_resets_the_count():
    prev = {"count": 5, "without_progress": 2, "last_checkpoint": "checkpoint-99", "stopped": None}
    d = decide(prev, "checkpoint-100", 3)  # steps compare as numbers, not as names
    assert (d.go, d.count, d.without_progress, d.progress, d.newest, d.previous) == (
        True,
        6,
        0,
        True,
        "checkpoint-100",
        "checkpoint-99",
    )
    assert d.record(None, "j")["last_checkpoint"] == "checkpoint-100"
    same = decide(d.record(None, "j"), "checkpoint-100", 3)
    assert (same.progress, same.without_progress) == (False, 1)


def test_the_first_requeue_counts_any_complete_checkpoint_as_progress():
    assert decide(None, "checkpoint-2", 3).progress
    assert not decide(None, None, 3).progress


def test_an_older_checkpoint_is_no_progress():
    """After a rollback (or a checkpoint deleted by hand) the newest can be older than the recorded one."""
    d = decide({"count": 1, "without_progress": 0, "last_checkpoint": "checkpoint-500"}, "checkpoint-400", 3)
    assert (d.progress, d.without_progress, d.newest) == (False, 1, "checkpoint-400")


def test_limit_zero_never_stops():
    prev = None
    for _ in range(10):
        d = decide(prev, None, 0)
        assert d.go
        prev = d.record(None, "j")
    assert prev["without_progress"] == 10


@pytest.mark.parametrize(
    "prev",
    [
        {"count": "3", "without_progress": -1, "last_checkpoint": "best_model"},
        {"count": True, "without_progress": None, "last_checkpoint": 7},
        {},
    ],
)
def test_a_damaged_record_counts_from_zero(prev):
    d = decide(prev, None, 3)
    assert (d.count, d.without_progress, d.previous) == (1, 1, None)


# --- the check on a run directory ----------------------------------------------------------------


def test_after_stop_writes_the_record_and_stops_with_one_line(tmp_path):
    run = tmp_path / "job-7"
    _ckpt(run, 40)
    _ckpt(run, 60, complete=False)  # an interrupted save is no progress
    go, line = after_stop(run, 3, job="7", again="do X")
    assert go and line.startswith("taehv-launch: requeueing job 7 (requeue 1 of this run)"), line
    assert read_requeues(run) == {
        "count": 1,
        "without_progress": 0,
        "last_checkpoint": "checkpoint-40",
        "stopped": None,
        "job": "7",
    }
    for n in (1, 2):
        go, line = after_stop(run, 3, job="7", again="do X")
        assert go and f"no checkpoint newer than checkpoint-40 (step 40) since the last requeue ({n} in a row" in line
    go, line = after_stop(run, 3, job="7", again="do X")
    assert not go and "\n" not in line
    assert line.startswith(
        "taehv-launch: not requeueing job 7: 3 attempts in a row ended (exit 75) without a checkpoint newer than "
        "checkpoint-40 (step 40) (max_requeues_without_progress=3; the newest is checkpoint-40 (step 40); "
        "requeue 4 of this run)"
    ), line
    assert f"{run / 'launch.log'}" in line and "do X" in line and f"delete {run / REQUEUE_FILE}" in line
    rec = read_requeues(run)
    assert rec["stopped"] == line and (rec["count"], rec["without_progress"]) == (4, 3)


def test_after_stop_without_a_run_directory_requeues_and_writes_nothing(tmp_path):
    go, line = after_stop(tmp_path / "nowhere", 1, job="7", again="x")
    assert go and "no run directory" in line and not (tmp_path / "nowhere").exists()


def test_a_folder_where_the_record_goes_is_moved_aside_not_a_reason_to_stop(tmp_path):
    # A record that cannot be written (ulimit -f) and other corrupt ones: tests/test_survive_hostile.py
    run = tmp_path / "job-7"
    (run / REQUEUE_FILE).mkdir(parents=True)
    go, lines = after_stop(run, 3, job="7", again="x")
    assert go and "kept as requeue.json.corrupt-1" in lines and (run / "requeue.json.corrupt-1").is_dir()
    assert read_requeues(run)["count"] == 1


def test_at_start_records_the_first_start_counts_restarts_and_not_a_new_job(tmp_path):
    run = tmp_path / "runs" / "long-run"
    go, line = at_start(run, 2, job="j-uid-a", again="x")
    assert go and "first start of this run" in line
    assert read_requeues(run) == {
        "count": 0,
        "without_progress": 0,
        "last_checkpoint": None,
        "stopped": None,
        "job": "j-uid-a",
    }
    _ckpt(run, 10)
    go, line = at_start(run, 2, job="j-uid-a", again="x")
    assert go and "restart 1 of this run (pod 0): newest checkpoint checkpoint-10 (step 10)" in line
    go, line = at_start(run, 2, job="j-uid-a", again="x")
    assert go and "no checkpoint newer than checkpoint-10 (step 10) since the last start (1 in a row" in line
    go, line = at_start(run, 2, job="j-uid-b", again="x")  # --run-name: another Job continues the run
    assert go and "a new Job (j-uid-b) continues this run: not a restart" in line
    assert read_requeues(run)["count"] == 2 and read_requeues(run)["without_progress"] == 1
    go, line = at_start(run, 2, job="j-uid-b", again="apply it again")
    assert not go and line.startswith("taehv-launch: not restarting: the Job fails here (podFailurePolicy FailJob)")
    assert "pod 0 restarted 2 times in a row without a checkpoint newer than checkpoint-10" in line
    assert read_requeues(run)["stopped"] == line


# --- the command ---------------------------------------------------------------------------------


def test_the_command_names_the_run_as_the_launcher_does(tmp_path):
    out = tmp_path / "out"
    (out / "job-4_2").mkdir(parents=True)
    proc = run_cli_here("requeue-check", "--output-dir", str(out), "--job-id", "4/2", "--limit", "3", env=clean_env())
    assert proc.returncode == 0 and proc.stdout.startswith("taehv-launch: requeueing job 4/2"), proc.stdout
    assert read_requeues(out / "job-4_2")["count"] == 1  # the launcher's run id: job-<id>, unsafe characters as _
    proc = run_cli_here(
        "requeue-check", "--output-dir", str(out), "--job-id", "4", "--run-name", "job-4_2", "--limit", "1"
    )
    assert proc.returncode == 1 and "not requeueing job 4:" in proc.stdout
    assert "submit the same job file again to continue run job-4_2" in proc.stdout


@pytest.mark.parametrize(
    "args,match",
    [
        (["--limit", "-1", "--job-id", "1"], r"--limit -1: use 0 \(no limit\) or more"),
        (["--limit", "3"], "needs --job-id"),
        (["--limit", "3", "--run-name", "a b"], "--run-name 'a b' must be letters"),
    ],
)
def test_bad_check_inputs_are_one_line(tmp_path, args, match):
    assert_one_line_error(run_cli_here("requeue-check", "--output-dir", str(tmp_path), *args), match)


def test_a_negative_limit_is_refused_at_render():
    proc = run_cli_here("render", "slurm", *RENDER, "--output-dir", "/s", "--set", "max_requeues_without_progress=-2")
    assert_one_line_error(proc, "max_requeues_without_progress=-2: use 0")


# --- the rendered sbatch, run by bash --------------------------------------------------------------


def _bin(tmp: Path, check: str | None = None) -> Path:
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    _exe(bin_dir / "srun", STAND_IN_SRUN)
    _exe(bin_dir / "scontrol", RECORD_SCONTROL)
    real = f'#!/bin/bash\nexec {shlex.quote(sys.executable)} -m taehv_launch.cli "$@"\n'
    _exe(bin_dir / "taehv-launch", check or real)
    return bin_dir


def _sbatch(tmp: Path, output_dir: str, *args: str) -> Path:
    proc = run_cli_here("render", "slurm", *RENDER, "--output-dir", output_dir, *args)
    assert proc.returncode == 0, proc.stderr
    script = tmp / "job.sbatch"
    script.write_text(proc.stdout)
    subprocess.run(["bash", "-n", str(script)], check=True)
    return script


def _attempt(script: Path, bin_dir: Path, out: Path, run: Path, restart: int, new_step: int | None = None):
    env = clean_env(
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        FAKE_OUT=str(out),
        FAKE_RUN=str(run),
        SLURM_JOB_ID="4242",
        SLURM_JOB_NUM_NODES="2",
        SLURM_NNODES="2",
        SLURM_JOB_NODELIST="gpu[1-2]",
        SLURM_CPUS_ON_NODE="8",
        SLURM_RESTART_COUNT=str(restart),
        LC_ALL="C",
        **({"FAKE_NEW_STEP": str(new_step)} if new_step is not None else {}),
    )
    return subprocess.run(["bash", str(script)], cwd=out, env=env, capture_output=True, text=True, timeout=120)


def _requeues(out: Path) -> int:
    return len((out / "scontrol").read_text().splitlines()) if (out / "scontrol").exists() else 0


def test_sbatch_stops_requeueing_after_three_exits_without_a_new_checkpoint(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    script = _sbatch(tmp_path, str(tmp_path / "runs"))
    assert '--job-id "$SLURM_JOB_ID"' in script.read_text() and "--limit 3" in script.read_text()
    run = tmp_path / "runs" / "job-4242"
    run.mkdir(parents=True)  # the launchers made it
    bin_dir = _bin(tmp_path)
    for restart in (0, 1):
        proc = _attempt(script, bin_dir, out, run, restart)
        assert proc.returncode == 75 and proc.stderr == "", proc.stderr  # requeued: the step's own code
        assert f"taehv-launch: requeueing job 4242 (requeue {restart + 1} of this run)" in proc.stdout
        assert _requeues(out) == restart + 1
    proc = _attempt(script, bin_dir, out, run, 2)
    assert proc.returncode == 1 and proc.stderr == "", proc.stderr
    assert _requeues(out) == 2  # not requeued a third time
    last = proc.stdout.splitlines()[-1]
    assert last.startswith(
        "taehv-launch: not requeueing job 4242: 3 attempts in a row ended (exit 75) without a complete checkpoint "
        "(max_requeues_without_progress=3; the run has none; requeue 3 of this run)"
    ), proc.stdout
    assert "continue this run with a job rendered with --run-name job-4242" in last
    rec = read_requeues(run)
    assert rec["stopped"] == last and (rec["count"], rec["without_progress"], rec["job"]) == (3, 3, "4242")


@pytest.mark.slow
def test_sbatch_a_new_checkpoint_between_requeues_resets_the_count(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    script = _sbatch(tmp_path, str(tmp_path / "runs"), "--set", "max_requeues_without_progress=2", "--run-name", "r")
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    bin_dir = _bin(tmp_path)
    steps = [None, 10, None, 20, None]  # the checkpoint each attempt saved
    for restart, step in enumerate(steps):
        proc = _attempt(script, bin_dir, out, run, restart, step)
        assert proc.returncode == 75, proc.stdout + proc.stderr
        assert _requeues(out) == restart + 1
        assert read_requeues(run)["without_progress"] == (0 if step else 1), proc.stdout
    line = _attempt(script, bin_dir, out, run, 9, 30).stdout
    assert "checkpoint-30 (step 30) is newer than checkpoint-20 (step 20), the newest at the last requeue" in line
    proc = _attempt(script, bin_dir, out, run, 10)
    assert proc.returncode == 75 and "(1 in a row; requeueing stops at 2" in proc.stdout
    proc = _attempt(script, bin_dir, out, run, 11)
    assert proc.returncode == 1 and "submit the same job file again to continue run r" in proc.stdout
    rec = read_requeues(run)
    assert (rec["count"], rec["without_progress"], rec["last_checkpoint"]) == (8, 2, "checkpoint-30")


@pytest.mark.slow
def test_sbatch_limit_zero_requeues_every_time(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    script = _sbatch(tmp_path, str(tmp_path / "runs"), "--set", "max_requeues_without_progress=0")
    run = tmp_path / "runs" / "job-4242"
    run.mkdir(parents=True)
    bin_dir = _bin(tmp_path)
    for restart in range(4):
        assert _attempt(script, bin_dir, out, run, restart).returncode == 75
    assert _requeues(out) == 4 and read_requeues(run)["without_progress"] == 4


# hostile values in the two words of the check that come from the user: output_dir, --run-name
HOSTILE_DIRS = {
    "newline": "\ntouch PWNED #",
    "single quote": "'; touch PWNED; '",
    "double quote": '"; touch PWNED; "',
    "command substitution": "$(touch PWNED)",
    "backticks": "`touch PWNED`",
    "semicolon": ";touch PWNED",
    "sbatch directive": "\n#SBATCH --partition=evil",
    "unicode": "é中😀",
    "unicode line breaks": "\u2028\x85\u2029x",
    "controls": "\x7f\x1b[31m\t\x9b",
    "backslash": "\\\n\\",
    "spaces": "  padded  ",
    "dash": " --limit 0",
}


@pytest.mark.parametrize("name", sorted(HOSTILE_DIRS))
def test_a_hostile_output_dir_reaches_the_check_exactly(tmp_path, name):
    output_dir = "/shared/o" + HOSTILE_DIRS[name]
    out = tmp_path / "out"
    out.mkdir()
    script = _sbatch(tmp_path, output_dir, "--run-name", "r.1")
    proc = _attempt(script, _bin(tmp_path, RECORD_ARGV), out, tmp_path / "unused", 0)
    assert proc.returncode == 75 and proc.stderr == "", proc.stderr
    argv = [os.fsdecode(a) for a in (out / "check_argv").read_bytes().split(b"\0")[:-1]]
    assert argv == [
        "requeue-check",
        "--limit",
        "3",
        "--job-id",
        "4242",
        "--output-dir",
        output_dir,
        "--run-name",
        "r.1",
    ]
    assert sorted(p.name for p in out.iterdir()) == ["check_argv", "scontrol"]  # nothing else ran
    assert (out / "scontrol").read_text() == "requeue 4242\n"


@pytest.mark.parametrize("name", ["newline", "single quote", "command substitution", "controls", "backslash"])
def test_a_hostile_output_dir_is_counted_and_named_on_one_line(tmp_path, name):
    """The real check on a real folder whose name is hostile: the stop line stays one line."""
    output_dir = tmp_path / ("o" + HOSTILE_DIRS[name])
    out = tmp_path / "out"
    out.mkdir()
    script = _sbatch(tmp_path, str(output_dir), "--set", "max_requeues_without_progress=1")
    run = output_dir / "job-4242"
    run.mkdir(parents=True)
    proc = _attempt(script, _bin(tmp_path), out, run, 0)
    assert proc.returncode == 1 and proc.stderr == "" and proc.stdout.count("\n") == 2, proc.stdout
    assert "not requeueing job 4242" in proc.stdout and not (out / "scontrol").exists()
    assert read_requeues(run)["stopped"] == proc.stdout.splitlines()[-1]
    assert sorted(p.name for p in out.iterdir()) == []  # nothing else ran


def test_the_run_name_is_checked_before_it_reaches_the_script():
    proc = run_cli_here("render", "slurm", *RENDER, "--output-dir", "/s", "--run-name", "$(touch PWNED)")
    assert_one_line_error(proc, "--run-name")


# --- the rendered Kubernetes Job -------------------------------------------------------------------


def _k8s(output_dir: str, mount: str, *args: str) -> tuple[dict, dict, dict]:
    proc = run_cli_here(
        "render", "k8s", *RENDER, "--output-dir", output_dir, "--mount", mount, "--image", "i:1", "--pvc", "c", *args
    )
    assert proc.returncode == 0, proc.stderr
    _, job = yaml.safe_load_all(proc.stdout)
    pod = job["spec"]["template"]["spec"]
    (check,) = pod["initContainers"]
    (trainer,) = pod["containers"]
    return job, check, trainer


def _pod_env(container: dict, uid: str, index: int) -> dict[str, str]:
    from test_cluster import _pod_env as pod_env

    return clean_env(**pod_env(container, uid, index))


def test_k8s_job_fails_when_the_check_refuses_a_restart(tmp_path):
    job, check, trainer = _k8s(str(tmp_path / "runs"), str(tmp_path))
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[0] == {
        "action": "FailJob",
        "onExitCodes": {"containerName": "requeue-check", "operator": "In", "values": [1]},
    }
    assert check["image"] == trainer["image"] and check["env"] == trainer["env"][-2:]  # JOB_UID, JOB_NAME
    assert check["volumeMounts"] == [{"name": "shared", "mountPath": str(tmp_path)}]
    assert check["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert check["command"] == [
        "taehv-launch",
        "requeue-check",
        "--limit",
        "3",
        "--job-id",
        "$(JOB_NAME)",
        "--output-dir",
        str(tmp_path / "runs"),
        "--at-start",
    ]
    try:
        import kubernetes_validate
    except ImportError:
        pass
    else:
        kubernetes_validate.validate(job, "1.37", strict=True)


def _init(check: dict, uid: str, index: int) -> subprocess.CompletedProcess:
    """The init container's command as the kubelet runs it: $(JOB_NAME) expanded from the pod's env."""
    from test_render_hostile import k8s_expand

    env = _pod_env(check, uid, index)
    argv = [k8s_expand(a, env) for a in check["command"]]
    return subprocess.run(
        [sys.executable, "-m", "taehv_launch.cli", *argv[1:]], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_k8s_init_container_counts_pod_0_restarts_and_stops_the_third_without_progress(tmp_path):
    _, check, trainer = _k8s(str(tmp_path / "runs"), str(tmp_path))
    run = tmp_path / "runs" / "job-taehv-16-h100-u1"
    plan = json.loads(
        run_cli_here(*trainer["command"][1:], "--dry-run", "--json", env=_pod_env(trainer, "u1", 0)).stdout
    )
    assert plan["run_dir"] == str(run)  # the check's run directory is the launcher's
    first = _init(check, "u1", 0)
    assert first.returncode == 0 and "first start of this run" in first.stdout, first.stdout + first.stderr
    other = _init(check, "u1", 1)
    assert other.returncode == 0 and "pod 1: pod 0 counts the restarts" in other.stdout
    assert read_requeues(run)["count"] == 0
    _ckpt(run, 8)
    assert "newest checkpoint checkpoint-8" in _init(check, "u1", 0).stdout
    for n in (1, 2):
        proc = _init(check, "u1", 0)
        assert proc.returncode == 0 and f"({n} in a row; restarting stops at 3" in proc.stdout, proc.stdout
        assert _init(check, "u1", 1).returncode == 0  # the other pods never count
    proc = _init(check, "u1", 0)
    assert proc.returncode == 1 and proc.stderr == "", proc.stderr
    line = proc.stdout.strip()
    assert "\n" not in line and line.startswith("taehv-launch: not restarting: the Job fails here")
    assert "pod 0 restarted 3 times in a row without a checkpoint newer than checkpoint-8 (step 8)" in line
    assert "continue this run with a Job rendered with --run-name job-taehv-16-h100-u1" in line
    assert read_requeues(run)["stopped"] == line and read_requeues(run)["count"] == 4


@pytest.mark.slow
def test_k8s_a_job_applied_again_with_run_name_starts_once_more(tmp_path):
    _, check, _ = _k8s(
        str(tmp_path / "runs"), str(tmp_path), "--run-name", "long", "--set", "max_requeues_without_progress=1"
    )
    assert check["command"][-3:] == ["--run-name", "long", "--at-start"]
    run = tmp_path / "runs" / "long"
    assert _init(check, "a", 0).returncode == 0
    proc = _init(check, "a", 0)
    assert (
        proc.returncode == 1
        and "delete the failed Job and apply the same file again to continue run long" in proc.stdout
    )
    again = _init(check, "b", 0)  # a new Job (new uid) is the user's resubmit: it starts
    assert again.returncode == 0 and "a new Job (taehv-16-h100-b) continues this run" in again.stdout
    assert read_requeues(run)["stopped"] is None
    assert _init(check, "b", 0).returncode == 1  # and its first restart without progress stops it again


@pytest.mark.parametrize("name", sorted(HOSTILE_DIRS))
def test_k8s_a_hostile_output_dir_is_the_checks_exactly(tmp_path, name):
    output_dir = "/shared/o" + HOSTILE_DIRS[name]
    from test_render_hostile import k8s_expand  # what the kubelet makes of $(VAR) and $$

    job, check, trainer = _k8s(output_dir, "/shared")
    env = _pod_env(trainer, "u", 0)
    argv = [k8s_expand(a, _pod_env(check, "u", 0)) for a in check["command"]]
    assert argv[argv.index("--output-dir") + 1] == output_dir
    plan = json.loads(
        run_cli_here(*(k8s_expand(a, env) for a in trainer["command"][1:]), "--dry-run", "--json", env=env).stdout
    )
    assert plan["config"]["output_dir"] == output_dir
