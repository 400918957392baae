"""Rendered files pass accelerate's and DeepSpeed's own validators; the env respects the user."""

from __future__ import annotations

from pathlib import Path

import pytest

from taehv_launch.plan.profiles import PROFILES
from taehv_launch.run.render import render
from taehv_launch.plan.resolve import Options, resolve
from taehv_launch.run.toolcheck import check_accelerate_yaml, check_deepspeed_config
from taehv_launch.errors import ConfigError
from taehv_launch.plan.topology import detect_topology

ROWS = [(name, row.gpus) for name, p in PROFILES.items() for row in p.rows]


def plan_for(gpus, profile="h100", env=None, **kw):
    return resolve(gpus, profile, detect_topology(gpus, env or {}), **kw)


@pytest.mark.parametrize("profile,gpus", ROWS)
def test_rendered_files_pass_the_tools_validators(tmp_path, profile, gpus):
    plan = plan_for(gpus, profile)
    rendered = render(plan, tmp_path, env={}, cpu_count=8)
    for name, text in rendered.files.items():
        (tmp_path / name).write_text(text)
    check_accelerate_yaml(tmp_path / "accelerate.yaml")
    if rendered.deepspeed is not None:
        check_deepspeed_config(rendered.deepspeed, plan.world_size)
        assert rendered.deepspeed["zero_optimization"]["stage"] == plan.config["zero_stage"]
        assert rendered.deepspeed["train_batch_size"] == plan.global_batch_size
        assert "mixed_precision" not in rendered.accelerate  # accelerate refuses it beside a DS config file
        assert rendered.deepspeed["gradient_clipping"] == plan.config["max_grad_norm"]


def test_deepspeed_validator_catches_bad_batch_arithmetic():
    plan = plan_for(16)
    ds = render(plan, Path("/x"), env={}, cpu_count=1).deepspeed
    with pytest.raises(ConfigError, match="DeepSpeed rejects"):
        check_deepspeed_config(ds, world_size=8)  # 128 != 8 x 1 x 8


def test_accelerate_validator_catches_unknown_keys(tmp_path):
    bad = tmp_path / "a.yaml"
    bad.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 2\nbogus_key: 1\n")
    with pytest.raises(ConfigError, match="accelerate rejects"):
        check_accelerate_yaml(bad)


@pytest.mark.parametrize("gpus,bucket", [(8, 500_000_000), (16, 500_000_000), (48, 750_000_000), (64, 1_000_000_000)])
def test_bucket_sizes_from_the_seeds(gpus, bucket):
    """The rows run plain DDP (no DeepSpeed); the seeds' buckets apply when a user asks for ZeRO."""
    assert render(plan_for(gpus), Path("/x"), env={}, cpu_count=1).deepspeed is None
    ds = render(plan_for(gpus, set_values={"zero_stage": 3}), Path("/x"), env={}, cpu_count=1).deepspeed
    assert ds["zero_optimization"]["reduce_bucket_size"] == bucket


@pytest.mark.parametrize("gpus,buffsize", [(8, 16 << 20), (16, 16 << 20), (48, 24 << 20), (64, 32 << 20)])
def test_nccl_env_by_node_count(gpus, buffsize):
    r = render(plan_for(gpus), Path("/x"), env={}, cpu_count=64)
    env = r.exported()
    assert env["NCCL_BUFFSIZE"] == str(buffsize)
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert ("NCCL_IB_DISABLE" in env) == (gpus > 8)
    assert "NCCL_NVLS_ENABLE" not in env and "NCCL_TIMEOUT" not in env and "TORCH_CUDA_ARCH_LIST" not in env
    assert env["OMP_NUM_THREADS"] == "8"


def test_user_and_site_settings_are_kept():
    site = {"NCCL_BUFFSIZE": "4194304", "NCCL_NVLS_ENABLE": "0", "PYTORCH_CUDA_ALLOC_CONF": "mine"}
    r = render(plan_for(64), Path("/x"), env=site, cpu_count=8)
    assert r.env["NCCL_BUFFSIZE"].kept and r.env["NCCL_BUFFSIZE"].value == "4194304"
    assert "NCCL_BUFFSIZE" not in r.exported() and "PYTORCH_CUDA_ALLOC_CONF" not in r.exported()
    assert "NCCL_NVLS_ENABLE" not in r.env


def test_a800_allocator_settings():
    env = render(plan_for(8, "a800"), Path("/x"), env={}, cpu_count=8).exported()
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True,max_split_size_mb:64,roundup_power2_divisions:16"


def test_debug_adds_verbose_distributed_logging():
    env = render(plan_for(8, options=Options(debug=True)), Path("/x"), env={}, cpu_count=8).exported()
    assert env["NCCL_DEBUG"] == "INFO" and env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"


def test_two_node_split_uses_local_gpu_ids_and_passes_the_rank():
    env = {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29600"}
    plan = plan_for(16, env=env)
    r = render(plan, Path("/run"), env=env, cpu_count=8)
    assert r.accelerate["gpu_ids"] == "0,1,2,3,4,5,6,7"
    assert r.accelerate["num_processes"] == 16 and r.accelerate["num_machines"] == 2
    assert r.accelerate["main_process_ip"] == "10.1.2.3" and r.accelerate["main_process_port"] == 29600
    assert r.argv[r.argv.index("--machine_rank") + 1] == "1"
    assert r.node_suffix == ".node1"
    z3 = render(plan_for(16, env=env, set_values={"zero_stage": 3}), Path("/run"), env=env, cpu_count=8)
    assert z3.accelerate["deepspeed_config"]["deepspeed_multinode_launcher"] == "standard"


def test_a_users_cuda_visible_devices_is_respected():
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    r = render(plan_for(4, env=env), Path("/run"), env=env, cpu_count=8)
    assert r.accelerate["gpu_ids"] == "all"


def test_cpu_profile_ddp_uses_the_invocation_that_really_runs_ddp():
    r = render(plan_for(2, "cpu"), Path("/run"), env={}, cpu_count=2)
    assert r.accelerate["distributed_type"] == "MULTI_GPU"
    assert r.exported()["ACCELERATE_USE_CPU"] == "1"
    ds = render(plan_for(2, "cpu", set_values={"zero_stage": 2}), Path("/run"), env={}, cpu_count=2)
    assert ds.accelerate["distributed_type"] == "DEEPSPEED" and "ACCELERATE_USE_CPU" not in ds.exported()


def test_resume_debug_profile_reach_the_trainer():
    plan = plan_for(8, options=Options(resume="/ck/checkpoint-10", debug=True, profile_run=True))
    argv = render(plan, Path("/run"), env={}, cpu_count=8).argv
    assert argv[argv.index("--resume") + 1] == "/ck/checkpoint-10"
    assert "--debug" in argv and "--profile" in argv
    assert argv[1] == "launch" and "--config_file" in argv
