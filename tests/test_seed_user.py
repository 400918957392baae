"""A seed user's first hour (#15): their config files, environment and habits work, or get one line
saying what replaces them."""

from __future__ import annotations

import json
import re

import pytest

from conftest import clean_env, run_cli_here

# The seed docs' taehv_config_16gpu_h100.py, as such a user has it (keys from ../shared/seeds/).
SEED_16GPU = """from easydict import EasyDict
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
"""


def dry(*args, env=None):
    proc = run_cli_here(*args, "--dry-run", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_seed_16gpu_config_loads_in_one_run(tmp_path):
    cfg = tmp_path / "taehv_config_16gpu_h100.py"
    cfg.write_text(SEED_16GPU)
    plan = dry("16", "h100", "--config", str(cfg))
    assert plan["config"]["micro_batch_size"] == 8 and plan["topology"]["main_process_port"] == 29501
    assert plan["deepspeed"] is None and plan["config"]["zero_stage"] == 0  # the row's plain DDP
    assert any(
        n.startswith("bucket_size_mb sizes DeepSpeed's buckets: it has no effect on plain DDP") for n in plan["notes"]
    ), plan["notes"]
    with_zero = dry("16", "h100", "--config", str(cfg), "--set", "zero_stage=3")
    assert with_zero["deepspeed"]["zero_optimization"]["reduce_bucket_size"] == 1_000_000_000  # bucket_size_mb
    ignored = [n for n in plan["notes"] if "ignoring seed key" in n]
    assert {
        "'deepspeed_config_file'",
        "'zero3_save_16bit_model'",
        "'communication_overlap'",
        "'use_flash_attention'",
    } == {n.split()[4].rstrip(":") for n in ignored}, ignored


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


# The seed docs' config snippets (../shared/seeds/), in both file styles, pasted into a file as such a user would.
SEED_PLAIN = """train_batch_size = 1              # 减少batch size
gradient_accumulation_steps = 8   # 增加累积步数
n_frames = 12                     # 减少帧数
dataloader_num_workers = 32       # 根据CPU核心数
prefetch_factor = 8              # 增加预取
persistent_workers = True        # 保持worker存活
"""
SEED_ARGS = """from easydict import EasyDict
args = EasyDict()
args.train_batch_size = 6  # 降低到6
args.validation_batch_size = 1  # 降低到1
args.gradient_checkpointing = True  # 确保开启
args.dataloader_num_workers = 16  # 增加到16
args.prefetch_factor = 4  # 增加到4
args.max_grad_norm = 0.5  # 降低梯度裁剪阈值
args.learning_rate = 5e-5  # 降低学习率
args.gradient_accumulation_steps = 2  # 从1增到2
args.master_port = "29501"
"""


def test_the_seed_docs_config_snippets_load_in_both_styles(tmp_path):
    cfg = tmp_path / "plain.py"
    cfg.write_text(SEED_PLAIN)
    plan = dry("16", "h100", "--config", str(cfg))
    assert (plan["config"]["micro_batch_size"], plan["config"]["dataloader_num_workers"]) == (1, 32)
    assert any("ignoring seed key 'persistent_workers'" in n for n in plan["notes"])
    cfg.write_text(SEED_ARGS)
    plan = dry("16", "h100", "--config", str(cfg))
    assert (plan["config"]["micro_batch_size"], plan["config"]["learning_rate"]) == (6, 5e-5)


def test_a_plain_config_file_reports_every_unknown_key(tmp_path):
    """Plain assignments used to drop a misspelt key silently (#29): now every one is named at once,
    with the suggestion the args style has, and helpers (_name, UPPER, imports, functions) are no keys."""
    cfg = tmp_path / "c.py"
    cfg.write_text(
        "import os\nfrom math import sqrt\nfrom easydict import EasyDict\n_base = 8\nGPUS = 16\n"
        "def helper():\n    return 1\nclass Knob:\n    pass\nmicro_batch_size = _base\n"
        "learning_rat = 1e-4\nn_frame = 12\nheight = '480'\n"
    )
    proc = run_cli_here("1", "cpu", "--config", str(cfg), "--dry-run")
    err = proc.stderr.strip()
    assert proc.returncode == 2 and "\n" not in err and "Traceback" not in err and "has 3 problems" in err, err
    assert "unknown config key 'learning_rat' (did you mean learning_rate?)" in err, err
    assert "unknown config key 'n_frame' (did you mean n_frames" in err and "height must be int" in err, err
    assert "start the name of a helper variable of your own with _ (_learning_rat = ...)" in err, err
    assert "'_base'" not in err and "'helper'" not in err and "'os'" not in err and "GPUS" not in err, err


def test_a_plain_config_file_with_helpers_loads(tmp_path):
    cfg = tmp_path / "c.py"
    cfg.write_text(
        "import os\n_base = 8\nSTEPS = 10\nmicro_batch_size = _base // 4\nmax_train_steps = STEPS\n"
        "data_root = os.path.join('/data', 'videos')\n"
    )
    c = dry("8", "h100", "--config", str(cfg))["config"]
    assert (c["micro_batch_size"], c["max_train_steps"], c["data_root"]) == (2, 10, "/data/videos")


@pytest.mark.parametrize(
    "text,match",
    [
        ("base = 8\nmicro_batch_size = base\n", r"c\.py: unknown config key 'base'; .* \(_base = \.\.\.\)"),
        (
            "LEARNING_RATE = 1e-4\n",
            r"LEARNING_RATE is upper case, so it is read as a constant of your own: keys are "
            r"lower case \(learning_rate\)",
        ),
        (
            "from easydict import EasyDict\nargs = EasyDict()\nargs.n_frames = 24\nlearning_rate = 1e-4\n",
            r"learning_rate = 0\.0001 is a plain name but this file sets its keys on args: write args\.learning_rate",
        ),
        ("import argparse\nargs = argparse.Namespace(learning_rate=1e-4)\n", r"args is a Namespace: make it"),
    ],
)
def test_config_file_mistakes_that_used_to_be_ignored(tmp_path, text, match):
    cfg = tmp_path / "c.py"
    cfg.write_text(text)
    proc = run_cli_here("1", "cpu", "--config", str(cfg), "--dry-run")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert re.search(match, proc.stderr), proc.stderr


def test_master_port_flag_beats_the_config_file(tmp_path):
    cfg = tmp_path / "c.py"
    cfg.write_text("args = dict(master_port='29501')\n")
    assert dry("16", "h100", "--config", str(cfg), "--master-port", "29777")["topology"]["main_process_port"] == 29777


def test_nccl_timeout_from_the_environment():
    env = clean_env(NCCL_TIMEOUT="10800")
    plan = dry("16", "h100", env=env)
    assert plan["config"]["nccl_timeout"] == 10800 and any("NCCL_TIMEOUT=10800" in n for n in plan["notes"])
    assert dry("16", "h100", "--set", "nccl_timeout=600", env=env)["config"]["nccl_timeout"] == 600  # --set wins
    proc = run_cli_here("16", "h100", "--dry-run", env=clean_env(NCCL_TIMEOUT="3h"))
    assert proc.returncode == 2 and "NCCL_TIMEOUT='3h' is not a whole number of seconds" in proc.stderr


@pytest.mark.parametrize(
    "name,hint",
    [
        ("1gpu_h100", "taehv-launch 1 h100"),
        ("16gpu_h100", "taehv-launch 16 h100"),
        ("a800_8gpu", "taehv-launch 8 a800"),
    ],
)
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
    assert next(k for k in keys if k["name"] == "ref_vae_type")["choices"] == [
        "cogvideox",
        "hunyuan",
        "wan",
        "wan22",
        "hunyuan15",
        "ltx2",
        "ltx23",
        "h3",
    ]


def test_shell_completion_is_offered():
    proc = run_cli_here("--help")
    assert "--install-completion" in proc.stdout and "--version" in proc.stdout


def test_launch_log_keeps_the_progress_bars_last_state():
    from taehv_launch.run.launch import final_state

    assert final_state(b"step 3/40 | loss 1.0\n") == b"step 3/40 | loss 1.0\n"
    assert final_state(b"\rtrain  10%|#  | 4/40\rtrain  12%|#  | 5/40\n") == b"train  12%|#  | 5/40\n"


def test_no_deepspeed_accelerator_warning_on_cpu():
    plan = dry("1", "cpu")
    assert plan["env"]["DS_ACCELERATOR"] == "cpu"  # DeepSpeed then does not probe, and does not warn
