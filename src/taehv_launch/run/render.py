"""Plan -> the files, environment and argv of one launch. Data only: nothing is written here.

`launch.py` writes what this returns into the run directory and starts the command;
`--dry-run` prints it. The accelerate YAML is shared by all nodes (machine_rank 0 in the
file, each node's rank on the command line), so a shared filesystem holds one copy.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..compat import FR_BUFFER_VARS, FR_DUMP_FILE_VARS, flight_recorder_buffer_var, torch_version
from ..plan.configfile import render_config_file
from ..plan.profiles import nccl_buffsize_for
from ..plan.resolve import Plan
from ..rundir.heartbeat import TIMEOUT_DUMP_PREFIX, stacks_dir
from ..rundir.layout import node_suffix
from ..yamltext import yaml_text

TRAINER_SCRIPT = Path(__file__).resolve().parent.parent / "train" / "main.py"


@dataclass(frozen=True, kw_only=True)
class EnvVar:
    value: str
    reason: str
    kept: bool = False  # True: the user or site already set it, we left it alone


@dataclass(frozen=True, kw_only=True)
class Rendered:
    files: dict[str, str]  # run-dir relative name -> text
    accelerate: dict[str, Any]
    deepspeed: dict[str, Any] | None
    env: dict[str, EnvVar]  # what the launch exports (or found already set)
    argv: list[str]
    node_suffix: str = ""  # "" on node 0, ".node<k>" on the others
    notes: list[str] = field(default_factory=list)

    def exported(self) -> dict[str, str]:
        """Only the variables we set (not the ones we found already set)."""
        return {k: v.value for k, v in self.env.items() if not v.kept}


def deepspeed_config(plan: Plan) -> dict[str, Any] | None:
    """DeepSpeed's own keys. Batch keys are concrete numbers (DeepSpeed checks them at init)."""
    c = plan.config
    if not plan.uses_deepspeed:
        return None
    stage = c["zero_stage"]
    bucket = c["bucket_size_mb"] * 1_000_000 if c["bucket_size_mb"] else int(plan.row.bucket)
    zero: dict[str, Any] = {
        "stage": stage,
        "overlap_comm": plan.profile.device == "cuda",
        "contiguous_gradients": True,
        "reduce_bucket_size": bucket,
    }
    if stage <= 2:
        zero |= {"allgather_partitions": True, "allgather_bucket_size": bucket, "reduce_scatter": True}
    else:
        zero |= {
            "stage3_prefetch_bucket_size": bucket,
            "stage3_param_persistence_threshold": 100_000,
            "stage3_gather_16bit_weights_on_model_save": False,
        }
    return {
        "train_batch_size": plan.global_batch_size,
        "train_micro_batch_size_per_gpu": c["micro_batch_size"],
        "gradient_accumulation_steps": c["gradient_accumulation_steps"],
        "gradient_clipping": c["max_grad_norm"],
        "bf16": {"enabled": c["mixed_precision"] == "bf16"},
        "fp16": {"enabled": c["mixed_precision"] == "fp16", "loss_scale": 0, "initial_scale_power": 16},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,  # our own logging; DeepSpeed's would go to stdout
        "wall_clock_breakdown": False,
    }


def accelerate_config(plan: Plan, run_dir: Path, env: Mapping[str, str]) -> dict[str, Any]:
    topo, c = plan.topology, plan.config
    on_cpu = plan.profile.device == "cpu"
    if plan.uses_deepspeed:
        dist = "DEEPSPEED"
    elif topo.world_size > 1:
        dist = "MULTI_GPU"  # on CPU too: with ACCELERATE_USE_CPU=1 this is real gloo DDP (PLATFORM.md)
    else:
        dist = "NO"
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": dist,
        "num_processes": topo.world_size,
        "num_machines": topo.num_machines,
        "machine_rank": 0,
        "main_process_ip": topo.main_process_ip,
        "main_process_port": topo.main_process_port,
        "rdzv_backend": "static",
        "same_network": True,
        # a user's CUDA_VISIBLE_DEVICES already picks this node's GPUs; local ids 0..n-1 otherwise
        "gpu_ids": "all" if (on_cpu or "CUDA_VISIBLE_DEVICES" in env) else topo.gpu_ids,
        "use_cpu": on_cpu and not plan.uses_deepspeed and topo.world_size == 1,
        "debug": plan.options.debug,
        "main_training_function": "main",
        "downcast_bf16": "no",
        "enable_cpu_affinity": False,
    }
    if plan.uses_deepspeed:
        cfg["deepspeed_config"] = {
            "deepspeed_config_file": str(run_dir / "deepspeed.json"),
            "zero3_init_flag": False,
            "deepspeed_multinode_launcher": "standard",  # one launcher per node, like torchrun
        }
    else:
        cfg["mixed_precision"] = c["mixed_precision"]
    return cfg


FR_BUFFER = 2000  # collectives the flight recorder keeps (PyTorch's recommended size)


def environment(plan: Plan, env: Mapping[str, str], cpu_count: int, run_dir: Path | None = None) -> dict[str, EnvVar]:
    """Variables for the launch. Each is set only when the user or site has not set it (or, for the
    flight recorder's renamed variables, either of its names)."""
    topo = plan.topology
    want: dict[str, tuple[str, str]] = {}
    procs = max(1, topo.gpus_per_machine)
    want["OMP_NUM_THREADS"] = (str(max(1, cpu_count // procs)), f"{cpu_count} CPUs / {procs} processes")
    if plan.profile.device == "cpu":
        # DeepSpeed (imported by accelerate) otherwise warns on every CPU run that it found no accelerator
        want["DS_ACCELERATOR"] = ("cpu", "the cpu profile: DeepSpeed need not probe for a GPU")
        if not plan.uses_deepspeed and topo.world_size > 1:
            want["ACCELERATE_USE_CPU"] = ("1", "the only accelerate invocation that runs real DDP on CPU")
    else:
        want["PYTORCH_CUDA_ALLOC_CONF"] = (plan.profile.alloc_conf, f"{plan.profile.name} allocator settings")
        want["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = (
            "1",
            "a failed collective aborts the job instead of hanging (replaces the seeds' BLOCKING_WAIT)",
        )
        want["NCCL_BUFFSIZE"] = (
            str(nccl_buffsize_for(topo.num_machines)),
            f"{nccl_buffsize_for(topo.num_machines) >> 20} MiB for {topo.num_machines} node(s)",
        )
        if topo.num_machines > 1:
            want["NCCL_IB_DISABLE"] = ("0", "multi-node: use InfiniBand when present")
            want["NCCL_SOCKET_NTHREADS"] = ("8", "multi-node socket transport (seed value)")
            want["NCCL_NSOCKS_PERTHREAD"] = ("4", "multi-node socket transport (seed value)")
            want["NCCL_NET_GDR_LEVEL"] = ("5", "GPUDirect RDMA across the system (seed value)")
    want[flight_recorder_buffer_var(torch_version())] = (
        str(FR_BUFFER),
        "flight recorder: the last collectives, dumped into heartbeat/stacks when the job hangs",
    )
    if plan.profile.device == "cuda" and run_dir is not None:
        prefix = str(stacks_dir(run_dir) / TIMEOUT_DUMP_PREFIX)
        want["TORCH_NCCL_DUMP_ON_TIMEOUT"] = (
            "1",
            "at the NCCL timeout (the hang detector's backstop) dump the flight recorder",
        )
        for name in FR_DUMP_FILE_VARS:  # newer torch reads the first, older the second
            want[name] = (prefix, "where that dump goes (torch appends the rank)")
    for names in (FR_BUFFER_VARS, FR_DUMP_FILE_VARS):  # a value the user set under either name wins
        if any(n in env for n in names):
            for n in names:
                if n not in env:
                    want.pop(n, None)
    if plan.options.debug:
        want["TORCH_DISTRIBUTED_DEBUG"] = ("DETAIL", "--debug")
        want["TORCH_CPP_LOG_LEVEL"] = ("INFO", "--debug")
        want["TORCH_SHOW_CPP_STACKTRACES"] = ("1", "--debug")
        if plan.profile.device == "cuda":
            want["NCCL_DEBUG"] = ("INFO", "--debug")
            want["NCCL_DEBUG_SUBSYS"] = ("INIT,NET", "--debug")
    want["PYTHONUNBUFFERED"] = ("1", "log lines reach launch.log as they happen")
    out = {}
    for name, (value, reason) in want.items():
        if name in env:
            out[name] = EnvVar(value=env[name], reason=f"already set (we would use {value}: {reason})", kept=True)
        else:
            out[name] = EnvVar(value=value, reason=reason)
    if plan.profile.device == "cpu":  # forced, whatever was set: the cpu profile means the CPU
        out["CUDA_VISIBLE_DEVICES"] = EnvVar(
            value="",
            reason="the cpu profile on a machine with GPUs: hidden, or gloo's barrier asks for cuda:<rank>",
        )
    return out


def render(
    plan: Plan,
    run_dir: Path,
    env: Mapping[str, str] | None = None,
    cpu_count: int | None = None,
    accelerate_bin: str | None = None,
) -> Rendered:
    env = dict(os.environ if env is None else env)
    cpu_count = cpu_count or os.cpu_count() or 1
    topo = plan.topology
    acc = accelerate_config(plan, run_dir, env)
    ds = deepspeed_config(plan)
    suffix = node_suffix(topo.machine_rank)
    files = {
        "config.py": render_config_file(plan.config, header=_config_header(plan)),
        "accelerate.yaml": yaml_text(acc),  # every string quoted, as accelerate reads it back
    }
    if ds is not None:
        files["deepspeed.json"] = json.dumps(ds, indent=2) + "\n"
    argv = [
        accelerate_bin or _accelerate_bin(),
        "launch",
        "--config_file",
        str(run_dir / "accelerate.yaml"),
        "--machine_rank",
        str(topo.machine_rank),
        str(TRAINER_SCRIPT),
        "--config",
        str(run_dir / "config.py"),
        "--run-dir",
        str(run_dir),
    ]
    if plan.options.task != "train":
        argv += ["--task", plan.options.task]
    if plan.options.resume:
        argv += ["--resume", plan.options.resume]
    if plan.options.debug:
        argv.append("--debug")
    if plan.options.profile_run:
        argv.append("--profile")
    return Rendered(
        files=files,
        accelerate=acc,
        deepspeed=ds,
        env=environment(plan, env, cpu_count, run_dir),
        argv=argv,
        node_suffix=suffix,
    )


def _accelerate_bin() -> str:
    """The accelerate next to this interpreter (a venv's), else the one on PATH."""
    local = Path(sys.executable).parent / "accelerate"
    return str(local) if local.exists() else "accelerate"


def _config_header(plan: Plan) -> str:
    return (
        f"Resolved by taehv-launch for `{plan.gpus} {plan.profile.name}`: {plan.row_source}.\n"
        f"{plan.batch_arithmetic()}.\n"
        "Precedence: --set > --config > profile row > profile > defaults. Python: only run files you trust."
    )
