"""`taehv-launch diff A B` (#26): runs, plans ("GPUS PROFILE ...") and config files, only what differs;
exit 0 identical, 1 different, 2 bad input. Plans resolve as the dry run does (fast); the runs are
real launches on the cpu profile (slow)."""

from __future__ import annotations

import json

import pytest

from conftest import REPO, assert_one_line_error, clean_env, run_cli, run_cli_here
from trainrun import launch, ok

H100_16 = str(REPO / "configs" / "taehv_config_h100_16gpu.py")


def diff(*args: str, cwd=None):
    return run_cli_here("diff", *args, env=clean_env(), cwd=cwd)


def rows(proc) -> dict[str, list[str]]:
    """`diff --json` -> {group: [row, ...]}."""
    out: dict[str, list[str]] = {}
    for d in json.loads(proc.stdout)["differences"]:
        out.setdefault(d["group"], []).append(d["row"])
    return out


def test_two_plans(tmp_path):
    proc = diff("1 cpu", "2 cpu", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "A: plan `1 cpu` resolved here now (environment, versions: this machine)"
    assert "plan (6 differ)" in lines and "same: versions" in lines, proc.stdout
    assert any(line.split() == ["world_size", "1", "2"] for line in lines), proc.stdout
    assert any(line.split() == ["strategy", "single", "process", "DDP"] for line in lines), proc.stdout
    doc = json.loads(diff("1 cpu", "2 cpu", "--json", cwd=tmp_path).stdout)
    assert doc["identical"] is False and doc["a"]["kind"] == "plan" and doc["b"]["label"] == "2 cpu"
    assert {"group": "plan", "row": "world_size", "a": 1, "b": 2} in doc["differences"]
    assert {"group": "environment", "row": "ACCELERATE_USE_CPU", "b": "1"} in doc["differences"]  # unset in A
    same = diff("2 cpu --set learning_rate=5e-4", "2 cpu", cwd=tmp_path)  # 5e-4 is the cpu default
    assert same.returncode == 0 and "identical: config, plan, environment, versions" in same.stdout, same.stdout
    nodes = diff("2 cpu --num-nodes 2 --gpus-per-node 1", "2 cpu", "--json", "--only", "plan", cwd=tmp_path)
    assert nodes.returncode == 1 and rows(nodes) == {"plan": ["num_machines", "gpus_per_machine"]}, nodes.stdout
    only = diff("1 cpu", "2 cpu", "--only", "config", "--json", cwd=tmp_path)
    assert only.returncode == 1 and rows(only) == {"config": ["nccl_timeout"]}, only.stdout


def test_config_files(tmp_path):
    proc = diff(H100_16, "16 h100", cwd=tmp_path)  # its header says `16 h100`: the same plan
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = diff(H100_16, "64 h100", "--json", "--only", "config,plan", cwd=tmp_path)
    assert proc.returncode == 1
    assert rows(proc)["plan"][:3] == ["gpus", "world_size", "num_machines"], proc.stdout
    mine = tmp_path / "mine.py"
    mine.write_text("learning_rate = 3e-4\n")  # no header: resolved with the other side's GPUS PROFILE
    proc = diff("16 h100", str(mine), "--json", cwd=tmp_path)
    assert proc.returncode == 1 and rows(proc) == {"config": ["learning_rate"]}, proc.stdout
    assert json.loads(proc.stdout)["b"]["kind"] == "config file"
    proc = diff("16 h100", f"16 h100 --config {mine}", cwd=tmp_path)
    assert proc.returncode == 1 and "learning_rate" in proc.stdout


def test_bad_input_is_one_line(tmp_path):
    (tmp_path / "notarun").mkdir()
    (tmp_path / "x.txt").write_text("x")
    (tmp_path / "bare.py").write_text("learning_rate = 3e-4\n")
    cases = [
        (("nope", "1 cpu"), r"no run, config file or plan 'nope'"),
        (("notarun", "1 cpu"), r"notarun is not a run directory"),
        (("x.txt", "1 cpu"), r"x.txt is a file but not a config file"),
        (
            ("bare.py", "bare.py"),
            r'bare.py does not say which GPUS PROFILE it is for: .*"GPUS PROFILE --config bare.py"',
        ),
        (("2 cpu --resume auto", "1 cpu"), r"'--resume' in the plan '2 cpu --resume auto': a plan takes --set"),
        (("2 cpu --set", "1 cpu"), r"--set needs a value"),
        (("1 cpux", "1 cpu"), r"unknown profile 'cpux'"),
        (("1 cpu", "2 cpu", "--only", "plans"), r"--only 'plans': groups are config, plan, environment, versions"),
    ]
    for args, match in cases:
        assert_one_line_error(diff(*args, cwd=tmp_path), match)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three real one-step runs: a; b = a with another learning rate; c = a again under another name."""
    tmp = tmp_path_factory.mktemp("diff")
    one = ("--set", "max_train_steps=1")
    for name, extra in (("a", ()), ("b", ("--set", "learning_rate=4e-4")), ("c", ())):
        proc, _ = launch(tmp, 1, *one, *extra, run_name=name)
        ok(proc)
    return tmp


@pytest.mark.slow
def test_two_runs_differing_in_one_key(runs):
    proc = run_cli("diff", "output/a", "output/b", cwd=runs)
    assert proc.returncode == 1, proc.stderr
    assert "config (1 differs)" in proc.stdout and "same: plan, environment, versions" in proc.stdout, proc.stdout
    assert any(line.split() == ["learning_rate", "0.0005", "0.0004"] for line in proc.stdout.splitlines())
    proc = run_cli("diff", "a", "c", cwd=runs)  # run ids under ./output; only the name differs
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == "identical: config, plan, environment, versions", proc.stdout


@pytest.mark.slow
def test_a_run_against_a_plan(runs):
    out = f"output_dir='{runs / 'output'}'"
    fast = "--set log_every=1 --set validation_steps=2 --set checkpointing_steps=2 --set dataloader_num_workers=0"
    plan = f"1 cpu --set {out} {fast} --set max_validation_batches=1 --set max_restarts=0 --set max_train_steps=1"
    env = clean_env(TAEHV_CACHE=str(runs.parent / "taehv-cache"), OMP_NUM_THREADS="1")  # as trainrun launched it
    proc = run_cli("diff", "output/a", plan, "--json", cwd=runs, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # the plan it was launched with, resolved again
    proc = run_cli("diff", "output/a", plan.replace("1 cpu", "2 cpu", 1), "--json", cwd=runs, env=env)
    assert proc.returncode == 1, proc.stderr
    found = rows(proc)
    assert found["plan"][:2] == ["gpus", "world_size"] and found["config"] == ["nccl_timeout"], proc.stdout
    assert (
        "hosts and GPUs: compared between runs only (a plan runs where it is launched)"
        in json.loads(proc.stdout)["not_compared"]
    )
    proc = run_cli("diff", str(runs / "output" / "a" / "config.py"), "output/a", cwd=runs, env=env)  # its config.py
    assert proc.returncode == 0, proc.stdout + proc.stderr
