"""The CLI as users run it: a subprocess, real argv, real exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from conftest import assert_one_line_error, clean_env, overrides, run_cli


def dry_json(*args, env=None):
    proc = run_cli(*args, "--dry-run", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # the whole of stdout is one JSON object


def test_16_h100_dry_run_json():
    d = dry_json("16", "h100")
    t, c = d["topology"], d["config"]
    assert (t["num_machines"], t["gpus_per_machine"], t["gpu_ids"]) == (2, 8, "0,1,2,3,4,5,6,7")
    assert (c["micro_batch_size"], c["gradient_accumulation_steps"], d["global_batch_size"]) == (8, 1, 128)
    assert d["deepspeed"] is None and c["zero_stage"] == 0 and c["nccl_timeout"] == 7200  # plain DDP (measured)
    for key in ("gpus", "profile", "config", "accelerate", "deepspeed", "env", "command", "strategy"):
        assert key in d
    assert d["accelerate"]["distributed_type"] == "MULTI_GPU"
    z3 = dry_json("16", "h100", "--set", "zero_stage=3")
    assert z3["deepspeed"]["zero_optimization"]["stage"] == 3 and z3["accelerate"]["distributed_type"] == "DEEPSPEED"
    assert d["command"][1] == "launch"


@pytest.mark.parametrize("gpus,micro,glob,lr,timeout", [("48", 5, 240, 1.8e-4, 10800), ("64", 4, 256, 2e-4, 14400)])
def test_large_rows_dry_run(gpus, micro, glob, lr, timeout):
    d = dry_json(gpus, "h100")
    assert (d["config"]["micro_batch_size"], d["global_batch_size"], d["config"]["nccl_timeout"]) == (
        micro,
        glob,
        timeout,
    )
    assert d["config"]["learning_rate"] == pytest.approx(lr)


def test_cloud_platform_node_rank_and_master():
    env = clean_env(WORLD_SIZE="2", RANK="1", MASTER_ADDR="10.1.2.3")
    d = dry_json("16", "h100", "--run-name", "r", env=env)  # no job id: the run name is the user's to give
    assert d["topology"]["machine_rank"] == 1 and d["topology"]["main_process_ip"] == "10.1.2.3"
    assert "WORLD_SIZE" in d["topology"]["source"]


def test_slurm_source():
    env = clean_env(SLURM_NNODES="2", SLURM_NODEID="1", SLURM_JOB_NODELIST="gpu[07-08]", SLURM_JOB_ID="4242")
    d = dry_json("16", "h100", env=env)
    assert (d["topology"]["machine_rank"], d["topology"]["main_process_ip"], d["topology"]["source"]) == (
        1,
        "gpu07",
        "slurm",
    )
    assert d["run_dir"].endswith("job-4242")


def test_human_dry_run_spells_out_the_batch_arithmetic():
    proc = run_cli("8", "a800", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "global batch 128 = micro 2 x 8 GPUs x accumulation 8" in proc.stdout
    assert "nothing was written or started" in proc.stdout


def test_set_and_config_reach_the_plan(tmp_path):
    cfg = tmp_path / "mine.py"
    cfg.write_text(
        "from easydict import EasyDict\nargs = EasyDict()\nargs.n_frames = 24\nargs.learning_rate = 1e-3\n"
        "args.train_batch_size = 4\nargs.gradient_accumulation_steps = 4\n"
    )  # the seeds' name for the micro-batch
    d = dry_json("8", "h100", "--config", str(cfg), "--set", "learning_rate=2e-4")
    assert d["config"]["n_frames"] == 24 and d["config"]["learning_rate"] == 2e-4
    assert d["config"]["micro_batch_size"] == 4 and d["global_batch_size"] == 128


def test_dry_run_is_fast_and_imports_nothing_heavy():
    code = (
        "import sys, time; t=time.perf_counter(); from taehv_launch import cli; "
        "from taehv_launch.run import dryrun, request; "
        "dryrun.dry_run(request.Request(gpus='16', profile='h100'), True); "
        "heavy=[m for m in ('torch','accelerate','deepspeed','diffusers','cv2') if m in sys.modules]; "
        "print(heavy, time.perf_counter()-t, file=sys.stderr)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env())
    assert proc.returncode == 0, proc.stderr
    heavy = proc.stderr.strip().splitlines()[-1]
    assert heavy.startswith("[]"), heavy
    t0 = time.perf_counter()
    assert run_cli("16", "h100", "--dry-run", "--json").returncode == 0
    assert time.perf_counter() - t0 < 3.0  # generous for a loaded CI machine; ~0.5 s here


def test_validate_env_is_a_subcommand_beside_the_default():
    proc = run_cli("validate-env", "--help")
    assert proc.returncode == 0 and "Preflight" in proc.stdout
    proc = run_cli("--help")
    assert proc.returncode == 0 and "validate-env" in proc.stdout


@pytest.mark.parametrize(
    "args,match",
    [
        (["12", "h100"], "12 GPUs"),
        (["0", "h100"], "at least 1"),
        (["abc", "h100"], "whole number"),
        (["8", "h900"], "unknown profile 'h900'"),
        (["8", "h100", "--set", "learnig_rate=1"], "did you mean learning_rate"),
        (["8", "h100", "--set", "n_frames=13"], "n_frames=13 does not fit ref_vae_type=cogvideox"),
        (["8", "h100", "--set", "height='480'"], "height must be int"),
        (["8", "h100", "--config", "/nonexistent/cfg.py"], "not found"),
        (["3", "cpu"], "at most 2"),
        (["16", "h100", "--gpus-per-node", "5"], "16"),
        (["8", "h100", "--run-name", "../escape"], "run-name"),
        (["8", "h100", "--master-port", "abc"], "--master-port"),
        (["8", "h100", "--bogus"], "No such option: --bogus"),
        (["8"], "Missing argument"),
    ],
)
def test_bad_invocations_give_one_clear_line(args, match):
    assert_one_line_error(run_cli(*args, "--dry-run"), match)


def test_8_h100_on_two_nodes_suggests_16():
    proc = run_cli("8", "h100", "--dry-run", env=clean_env(WORLD_SIZE="2", RANK="0", MASTER_ADDR="m"))
    assert_one_line_error(proc, r"taehv-launch 16 h100.*--gpus-per-node 4")


def test_json_needs_dry_run():
    assert_one_line_error(run_cli("8", "h100", "--json"), "--json goes with --dry-run")


def test_keys_lists_the_schema():
    proc = run_cli("keys")
    assert proc.returncode == 0 and "learning_rate" in proc.stdout and "n_frames" in proc.stdout


def test_a_bad_config_file_is_one_line(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("args = {'learning_rate': 1e-4, 'bogus': 1}\n")
    assert_one_line_error(run_cli("8", "h100", "--config", str(bad), "--dry-run"), "unknown config key 'bogus'")
    crash = tmp_path / "crash.py"
    crash.write_text("raise RuntimeError('boom')\n")
    assert_one_line_error(run_cli("8", "h100", "--config", str(crash), "--dry-run"), "failed to run.*boom")


def test_dry_run_of_a_plan_the_launch_refuses_exits_non_zero():
    proc = run_cli("8", "h100", "--set", "n_frames=24", "--dry-run")
    assert proc.returncode == 2 and "DOES NOT FIT" in proc.stdout
    assert (
        proc.stderr.strip().startswith("error: this plan will not fit in GPU memory")
        and "\n" not in proc.stderr.strip()
    )
    assert (
        run_cli(
            "8",
            "h100",
            *overrides("n_frames=24 micro_batch_size=4 gradient_accumulation_steps=4"),
            "--dry-run",
        ).returncode
        == 0
    )  # the README's example


def test_dry_run_names_the_demo_assets_and_the_resume_checkpoint(tmp_path):
    env = clean_env(TAEHV_CACHE=str(tmp_path / "cache"))
    plan = json.loads(run_cli("1", "cpu", "--dry-run", "--json", env=env).stdout)
    assert plan["config"]["data_root"] == str(tmp_path / "cache" / "demo" / "videos" / "n16_96x128_t48")
    assert plan["config"]["ref_vae_path"] == str(tmp_path / "cache" / "demo" / "ref_vae" / "cogvideox_c4")
    proc = run_cli("1", "cpu", "--dry-run", "--json", "--resume", "auto", "--set", f"output_dir='{tmp_path}'", env=env)
    plan = json.loads(proc.stdout)
    assert plan["resume"] is None and any("fresh" in n or "no complete checkpoint" in n for n in plan["notes"]), plan[
        "notes"
    ]


def test_config_that_is_a_folder_says_so(tmp_path):
    assert_one_line_error(
        run_cli("1", "cpu", "--config", str(tmp_path), "--dry-run"), r"config file .* is a folder: pass a \.py"
    )


def test_help_as_a_word_is_the_help():
    top = run_cli("help")
    assert top.returncode == 0 and "Usage:" in top.stdout and "COMMAND" in top.stdout, top.stderr
    sub = run_cli("help", "render")
    assert sub.returncode == 0 and "render [OPTIONS]" in sub.stdout, sub.stderr
