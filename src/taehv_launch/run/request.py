"""The launcher's plan glue: what the user asked for (Request) -> the resolved, settled Plan.

`--dry-run`, validate-env, render, bench compare and the launch all call build_plan(); settle()
makes the decisions that read the disk or the environment (run directory, --resume, demo assets).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, ConfigError
from ..plan.configfile import ConfigFile, load_config_file, parse_sets
from ..plan.demo import demo_cache_dir, demo_paths
from ..plan.profiles import check_gpu_count, get_profile
from ..plan.resolve import MAX_NCCL_TIMEOUT, Options, Plan, resolve
from ..plan.scaling import Prediction, predict
from ..plan.text import PATH_KEYS, check_path, check_text
from ..plan.topology import detect_topology
from ..rundir.checkpoint import read_state
from .checkpoints import layout_change_note, resume_problem
from .runs import check_rerun, resolve_resume, run_id_for


@dataclass(frozen=True, kw_only=True)
class Request:
    """Everything the user asked for on the command line."""

    gpus: str
    profile: str
    sets: list[str] = field(default_factory=list)
    config: str | None = None
    options: Options = Options()
    num_nodes: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    gpus_per_node: int | None = None


def parse_gpus(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(
            f"GPU count must be a whole number like 1, 8 or 16, got {text!r} (usage: taehv-launch GPUS PROFILE)"
        ) from None


def build_plan(req: Request, env: dict[str, str] | None = None, local: bool = True) -> Plan:
    """Everything the run will use, decided once: `--dry-run`, validate-env and the launch all call this.
    local=False (`render`): the plan is for other machines; what the run reads there (the latent cache)
    is not checked on this one."""
    env = dict(os.environ if env is None else env)
    gpus = parse_gpus(req.gpus)
    for item in req.sets:
        check_text("--set", item)  # a NUL byte breaks even a path lookup
    if req.config:
        check_path("--config", req.config)
        if os.path.isdir(os.path.expanduser(req.config)):
            raise ConfigError(f"config file {req.config!r} is a folder: pass a .py config file to --config")
    file = load_config_file(req.config) if req.config else ConfigFile({}, [], {})
    set_values = parse_sets(req.sets)
    profile = get_profile(req.profile)  # an unknown profile is the first thing to report
    check_gpu_count(profile, gpus)  # then a count it does not take, before the topology suggests counts
    if "world_size" in file.launch and file.launch["world_size"] != gpus:
        raise ConfigError(
            f"{req.config} says world_size={file.launch['world_size']} but the command asks for {gpus} "
            f"GPUs: run `taehv-launch {file.launch['world_size']} {req.profile} ...` or drop world_size"
        )
    master_port = req.master_port if req.master_port is not None else file.launch.get("master_port")
    topology = detect_topology(
        gpus,
        env,
        num_nodes=req.num_nodes,
        node_rank=req.node_rank,
        master_addr=req.master_addr,
        master_port=master_port,
        gpus_per_node=req.gpus_per_node,
        profile=req.profile,
        max_gpus=profile.max_gpus,
    )
    env_values, notes = environment_values(env), list(file.notes)
    if env_values and "nccl_timeout" not in {**file.values, **set_values}:
        notes.append(f"NCCL_TIMEOUT={env['NCCL_TIMEOUT']} from the environment sets nccl_timeout")
    zero = {**file.values, **set_values}.get("zero_stage")
    if "bucket_size_mb" in {**file.values, **set_values} and not zero:
        notes.append(
            "bucket_size_mb sizes DeepSpeed's buckets: it has no effect on plain DDP (zero_stage=0), which "
            "this plan runs; add --set zero_stage=N to use DeepSpeed ZeRO-N"
        )
    plan = resolve(
        gpus,
        req.profile,
        topology,
        file_values=file.values,
        set_values=set_values,
        env_values=env_values,
        options=req.options,
        notes=tuple(notes),
    )
    for key in PATH_KEYS:
        if plan.config[key]:
            check_path(key, str(plan.config[key]))
    if req.options.task == "cache" and not plan.config["latent_cache"]:
        raise ConfigError(
            "taehv-launch cache needs --set latent_cache=DIR: the folder the latents go to "
            "(training then reads it with the same --set)"
        )
    return settle(plan, env, local)


def environment_values(env: dict[str, str]) -> dict[str, int]:
    """Config keys the seeds set through the environment: NCCL_TIMEOUT (seconds) is nccl_timeout."""
    raw = env.get("NCCL_TIMEOUT")
    if raw is None or raw == "":
        return {}
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(
            f"NCCL_TIMEOUT={raw!r} is not a whole number of seconds: unset it or use --set nccl_timeout=SECONDS"
        ) from None
    if not 1 <= value <= MAX_NCCL_TIMEOUT:
        raise ConfigError(
            f"NCCL_TIMEOUT={raw} is out of range: use 1-{MAX_NCCL_TIMEOUT} seconds (a week), unset it, "
            f"or use --set nccl_timeout=SECONDS"
        )
    return {"nccl_timeout": value}


def settle(plan: Plan, env: dict[str, str], local: bool = True) -> Plan:
    """The decisions that read the disk or the environment: the run directory, the checkpoint that
    `--resume` continues (and so the run it belongs to), the demo assets' paths on the cpu profile."""
    run_id, source = run_id_for(plan.options.run_name, plan.topology.job_id)
    if plan.options.task == "cache" and source == "timestamp":
        run_id = f"cache-{run_id}"
    run_dir = Path(plan.config["output_dir"]).expanduser().resolve() / run_id
    notes, options, config = list(plan.notes), plan.options, plan.config
    if options.resume:
        explicit_run = source != "timestamp"
        ckpt, resume_notes = resolve_resume(options.resume, run_dir.parent, run_dir if explicit_run else None)
        notes += resume_notes
        if ckpt is not None:
            refusal, family_note = resume_problem(ckpt, config)
            if refusal:
                raise CheckpointError(refusal)
            note = layout_change_note(ckpt, plan.world_size, config)
            notes += [n for n in (note, family_note) if n]
            if not explicit_run:
                run_dir, source = ckpt.parent, "resumed run"  # continue the run the checkpoint belongs to
        options = replace(options, resume=str(ckpt) if ckpt else None)
    if not options.resume:
        if options.task == "train" and local:  # a fresh start never trains over a run's checkpoints or exports
            check_rerun(run_dir, plan.options.resume)
        options = replace(options, resume=None)  # `--resume ''` (an unset variable in a script): a fresh start
    demo = ("", "")
    if plan.profile.device == "cpu":
        demo = demo_paths(demo_cache_dir(env), config["ref_vae_type"], config["latent_channels"])
        config = {
            **config,
            "data_root": config["data_root"] or demo[0],
            "ref_vae_path": config["ref_vae_path"] or (demo[1] if config["use_ref_vae"] else ""),
        }
    if config["latent_cache"] and options.task == "train" and local:
        check_latent_cache(config)
    if (
        options.task == "cache"
        and local
        and Path(config["latent_cache"]).expanduser().exists()
        and not Path(config["latent_cache"]).expanduser().is_dir()
    ):
        raise ConfigError(
            f"latent_cache={config['latent_cache']} is a file: give a folder (new, or the one an "
            f"earlier cache job of this config wrote)"
        )
    return replace(
        plan,
        run_dir=run_dir,
        run_id_source=source,
        options=options,
        config=config,
        notes=tuple(notes),
        demo_assets=demo,
    )


def check_latent_cache(config: dict[str, Any]) -> None:
    """A latent cache that is unfinished or made for another config is refused before anything starts
    (the trainer checks again, with the reference VAE's weights)."""
    from types import SimpleNamespace

    from ..dataindex.latentcache import check_fingerprint, read_manifest

    manifest = read_manifest(config["latent_cache"])
    check_fingerprint(manifest["fingerprint"], SimpleNamespace(**config), None, config["latent_cache"])


def prediction(plan: Plan) -> Prediction | None:
    """Predicted speed, time and GPU-hours of a training plan: from the run's own speed.json and
    checkpoint step when resuming, else from the measured one-GPU speed and the scaling model."""
    if plan.options.task != "train" or plan.profile.device != "cuda":
        return None
    from_step, own = 0, None
    if plan.options.resume:
        ckpt = Path(plan.options.resume)
        from_step = int(read_state(ckpt).get("step", 0))  # settle() has read it once already: readable
        try:
            speed = json.loads((ckpt.parent / "speed.json").read_text())
            if int(speed.get("world_size", 0)) == plan.world_size:
                own = speed  # used where measured on this config's family and path (plan/scaling.py run_figure)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    topo = plan.topology
    return predict(plan.profile.name, plan.config, plan.world_size, topo.num_machines, from_step, run_speed=own)
