"""A seed user's first hour (#15): their config files, environment and habits work, or get one line
saying what replaces them."""

from __future__ import annotations

import json

import pytest

from conftest import clean_env, run_cli_here

# The seed docs' taehv_config_16gpu_h100.py, as such a user has it (keys from ../shared/seeds/).
SEED_16GPU = '''from easydict import EasyDict
args = EasyDict()
args.world_size = 16
args.train_batch_size = 8
args.gradient_accumulation_steps = 1
args.learning_rate = 1e-4
args.dataloader_num_workers = 12
args.prefetch_factor = 3
args.gradient_checkpointing = False
args.max_grad_norm = 1.0
args.validation_batch_size = 1
args.master_port = "29501"
args.deepspeed_config_file = "configs/deepspeed_zero3.json"
args.zero3_save_16bit_model = True
args.communication_overlap = True
args.bucket_size_mb = 1000
args.use_flash_attention = True
'''


def dry(*args, env=None):
    proc = run_cli_here(*args, "--dry-run", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_seed_16gpu_config_loads_in_one_run(tmp_path):
    cfg = tmp_path / "taehv_config_16gpu_h100.py"
    cfg.write_text(SEED_16GPU)
    plan = dry("16", "h100", "--config", str(cfg))
    assert plan["config"]["micro_batch_size"] == 8 and plan["topology"]["main_process_port"] == 29501
    assert plan["deepspeed"]["zero_optimization"]["reduce_bucket_size"] == 1_000_000_000   # bucket_size_mb
    ignored = [n for n in plan["notes"] if "ignoring seed key" in n]
    assert {"'deepspeed_config_file'", "'zero3_save_16bit_model'", "'communication_overlap'",
            "'use_flash_attention'"} == {n.split()[4].rstrip(":") for n in ignored}, ignored


def test_the_ignore_notes_are_printed_once_at_launch(tmp_path):
    cfg = tmp_path / "c.py"
    cfg.write_text("args = dict(use_flash_attention=True)\n")
    proc = run_cli_here("1", "cpu", "--config", str(cfg), "--dry-run")
    assert proc.stdout.count("ignoring seed key 'use_flash_attention'") == 1


def test_world_size_is_checked_against_the_gpu_count(tmp_path):
    cfg = tmp_path / "c.py"
    cfg.write_text(SEED_16GPU)
    proc = run_cli_here("8", "h100", "--config", str(cfg), "--dry-run")
    assert proc.returncode == 2 and "says world_size=16 but the command asks for 8 GPUs" in proc.stderr
    assert "taehv-launch 16 h100" in proc.stderr


def test_every_problem_of_a_config_file_in_one_message(tmp_path):
    cfg = tmp_path / "c.py"
    cfg.write_text("args = dict(learnig_rate=1e-4, height='480', n_frame=12, use_seraena=True)\n")
    proc = run_cli_here("1", "cpu", "--config", str(cfg), "--dry-run")
    err = proc.stderr.strip()
    assert proc.returncode == 2 and "\n" not in err and "has 3 problems" in err, err
    assert "'learnig_rate'" in err and "height must be int" in err and "'n_frame'" in err


def test_master_port_flag_beats_the_config_file(tmp_path):
    cfg = tmp_path / "c.py"
    cfg.write_text("args = dict(master_port='29501')\n")
    assert dry("16", "h100", "--config", str(cfg), "--master-port", "29777")["topology"]["main_process_port"] == 29777


def test_nccl_timeout_from_the_environment():
    env = clean_env(NCCL_TIMEOUT="10800")
    plan = dry("16", "h100", env=env)
    assert plan["config"]["nccl_timeout"] == 10800 and any("NCCL_TIMEOUT=10800" in n for n in plan["notes"])
    assert dry("16", "h100", "--set", "nccl_timeout=600", env=env)["config"]["nccl_timeout"] == 600   # --set wins
    proc = run_cli_here("16", "h100", "--dry-run", env=clean_env(NCCL_TIMEOUT="3h"))
    assert proc.returncode == 2 and "NCCL_TIMEOUT='3h' is not a whole number of seconds" in proc.stderr


@pytest.mark.parametrize("name,hint", [("1gpu_h100", "taehv-launch 1 h100"), ("16gpu_h100", "taehv-launch 16 h100"),
                                       ("a800_8gpu", "taehv-launch 8 a800")])
def test_seed_profile_names_get_the_command(name, hint):
    proc = run_cli_here("8", name, "--dry-run")
    assert proc.returncode == 2 and proc.stderr.strip().endswith(hint), proc.stderr


def test_version_and_keys_json():
    from taehv_launch import __version__

    proc = run_cli_here("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"taehv-launch {__version__}"
    keys = json.loads(run_cli_here("keys", "--json").stdout)
    micro = next(k for k in keys if k["name"] == "micro_batch_size")
    assert micro["type"] == "int" and micro["aliases"] == ["train_batch_size"]
    assert next(k for k in keys if k["name"] == "ref_vae_type")["choices"] == ["cogvideox", "hunyuan", "wan"]


def test_shell_completion_is_offered():
    proc = run_cli_here("--help")
    assert "--install-completion" in proc.stdout and "--version" in proc.stdout


def test_launch_log_keeps_the_progress_bars_last_state():
    from taehv_launch.run.launch import final_state

    assert final_state(b"step 3/40 | loss 1.0\n") == b"step 3/40 | loss 1.0\n"
    assert final_state(b"\rtrain  10%|#  | 4/40\rtrain  12%|#  | 5/40\n") == b"train  12%|#  | 5/40\n"


def test_no_deepspeed_accelerator_warning_on_cpu():
    plan = dry("1", "cpu")
    assert plan["env"]["DS_ACCELERATOR"] == "cpu"       # DeepSpeed then does not probe, and does not warn
