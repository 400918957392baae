"""What each CLI command does, as one function each. The CLI only parses and calls these."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .plan.configfile import ConfigFile, load_config_file, parse_sets
from .plan.demo import demo_cache_dir, demo_paths
from .plan.profiles import get_profile
from .errors import EXIT_ABORTED, EXIT_RESUMABLE, EXIT_USAGE, CheckpointError, ConfigError, LaunchError
from .run.render import Rendered, render
from .plan.resolve import Options, Plan, resolve
from .run.checkpoints import layout_change_note, read_state, resume_problem
from .run.runs import resolve_resume, run_id_for
from .plan.schema import ALIASES, KEYS
from .plan.scaling import Prediction, predict
from .plan.text import PATH_KEYS, check_path, check_text
from .plan.topology import check_local_gpus, detect_topology

NO_FIT = "this plan will not fit in GPU memory: "


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
        raise ConfigError(f"GPU count must be a whole number like 1, 8 or 16, got {text!r} "
                          f"(usage: taehv-launch GPUS PROFILE)") from None


def build_plan(req: Request, env: dict[str, str] | None = None, local: bool = True) -> Plan:
    """Everything the run will use, decided once: `--dry-run`, validate-env and the launch all call this.
    local=False (`render`): the plan is for other machines; what the run reads there (the latent cache)
    is not checked on this one."""
    env = dict(os.environ if env is None else env)
    gpus = parse_gpus(req.gpus)
    for item in req.sets:
        check_text("--set", item)       # a NUL byte breaks even a path lookup
    if req.config:
        check_path("--config", req.config)
    file = load_config_file(req.config) if req.config else ConfigFile({}, [], {})
    set_values = parse_sets(req.sets)
    get_profile(req.profile)   # an unknown profile is the first thing to report
    if "world_size" in file.launch and file.launch["world_size"] != gpus:
        raise ConfigError(f"{req.config} says world_size={file.launch['world_size']} but the command asks for {gpus} "
                          f"GPUs: run `taehv-launch {file.launch['world_size']} {req.profile} ...` or drop world_size")
    master_port = req.master_port if req.master_port is not None else file.launch.get("master_port")
    topology = detect_topology(gpus, env, num_nodes=req.num_nodes, node_rank=req.node_rank,
                               master_addr=req.master_addr, master_port=master_port,
                               gpus_per_node=req.gpus_per_node, profile=req.profile)
    env_values, notes = environment_values(env), list(file.notes)
    if env_values and "nccl_timeout" not in {**file.values, **set_values}:
        notes.append(f"NCCL_TIMEOUT={env['NCCL_TIMEOUT']} from the environment sets nccl_timeout")
    zero = {**file.values, **set_values}.get("zero_stage")
    if "bucket_size_mb" in {**file.values, **set_values} and not zero:
        notes.append("bucket_size_mb sizes DeepSpeed's buckets: it has no effect on plain DDP (zero_stage=0), which "
                     "this plan runs; add --set zero_stage=N to use DeepSpeed ZeRO-N")
    plan = resolve(gpus, req.profile, topology, file_values=file.values, set_values=set_values,
                   env_values=env_values, options=req.options, notes=tuple(notes))
    for key in PATH_KEYS:
        if plan.config[key]:
            check_path(key, str(plan.config[key]))
    if req.options.task == "cache" and not plan.config["latent_cache"]:
        raise ConfigError("taehv-launch cache needs --set latent_cache=DIR: the folder the latents go to "
                          "(training then reads it with the same --set)")
    return settle(plan, env, local)


def environment_values(env: dict[str, str]) -> dict[str, int]:
    """Config keys the seeds set through the environment: NCCL_TIMEOUT (seconds) is nccl_timeout."""
    raw = env.get("NCCL_TIMEOUT")
    if raw is None or raw == "":
        return {}
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"NCCL_TIMEOUT={raw!r} is not a whole number of seconds: unset it or use "
                          f"--set nccl_timeout=SECONDS") from None
    if value < 1:
        raise ConfigError(f"NCCL_TIMEOUT={raw} must be at least 1 second: unset it or use --set nccl_timeout=SECONDS")
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
                run_dir, source = ckpt.parent, "resumed run"     # continue the run the checkpoint belongs to
        options = replace(options, resume=str(ckpt) if ckpt else None)
    demo = ("", "")
    if plan.profile.device == "cpu":
        demo = demo_paths(demo_cache_dir(env), config["ref_vae_type"], config["latent_channels"])
        config = {**config, "data_root": config["data_root"] or demo[0],
                  "ref_vae_path": config["ref_vae_path"] or (demo[1] if config["use_ref_vae"] else "")}
    if config["latent_cache"] and options.task == "train" and local:
        check_latent_cache(config)
    if options.task == "cache" and local and Path(config["latent_cache"]).expanduser().exists() \
            and not Path(config["latent_cache"]).expanduser().is_dir():
        raise ConfigError(f"latent_cache={config['latent_cache']} is a file: give a folder (new, or the one an "
                          f"earlier cache job of this config wrote)")
    return replace(plan, run_dir=run_dir, run_id_source=source, options=options, config=config, notes=tuple(notes),
                   demo_assets=demo)


def check_latent_cache(config: dict[str, Any]) -> None:
    """A latent cache that is unfinished or made for another config is refused before anything starts
    (the trainer checks again, with the reference VAE's weights)."""
    from types import SimpleNamespace

    from .train.latentcache import check_fingerprint, read_manifest

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
        from_step = int(read_state(ckpt).get("step", 0))     # settle() has read it once already: readable
        try:
            speed = json.loads((ckpt.parent / "speed.json").read_text())
            if int(speed.get("world_size", 0)) == plan.world_size:
                own = float(speed["clips_per_s_per_gpu"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return predict(plan.profile.name, plan.config, plan.world_size, plan.topology.num_machines, from_step, own)


def plan_json(plan: Plan, rendered: Rendered, run_dir: Path) -> dict[str, Any]:
    topo = plan.topology
    return {
        "gpus": plan.gpus,
        "profile": plan.profile.name,
        "topology": {"num_machines": topo.num_machines, "machine_rank": topo.machine_rank,
                     "gpus_per_machine": topo.gpus_per_machine, "gpu_ids": topo.gpu_ids,
                     "main_process_ip": topo.main_process_ip, "main_process_port": topo.main_process_port,
                     "source": topo.source, "job_id": topo.job_id, "world_size": topo.world_size,
                     "ranks": list(range(topo.machine_rank * topo.gpus_per_machine,
                                         (topo.machine_rank + 1) * topo.gpus_per_machine))},
        "row_source": plan.row_source,
        "strategy": plan.strategy,
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in plan.config.items()},
        "global_batch_size": plan.global_batch_size,
        "run_dir": str(run_dir),
        "run_id_source": plan.run_id_source,
        "accelerate": rendered.accelerate,
        "deepspeed": rendered.deepspeed,
        "env": rendered.exported(),
        "env_kept": {k: v.value for k, v in rendered.env.items() if v.kept},
        "command": rendered.argv,
        "memory": asdict(plan.memory),
        "predicted": asdict(p) if (p := prediction(plan)) else None,
        "resume": plan.options.resume,
        "files": rendered.files,          # exactly what the launch writes into run_dir
        "notes": list(plan.notes),
    }


def dry_run(req: Request, as_json: bool) -> int:
    from .plan.topology import check_listed_gpus

    plan = build_plan(req)
    if plan.profile.device == "cuda":   # the launch's CUDA_VISIBLE_DEVICES check, without torch or a GPU here
        check_listed_gpus(plan.topology, os.environ, profile=plan.profile.name)
    run_dir = plan.run_dir
    rendered = render(plan, run_dir)
    size, too_big = _cache_size(plan)
    if as_json:
        doc = plan_json(plan, rendered, run_dir)
        if plan.options.task == "cache":
            doc["cache_size"] = size.as_dict() if size is not None else None
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        print_plan(plan, rendered, run_dir, size)
        print("\n(dry run: nothing was written or started)")
    if too_big:                      # the launch would refuse it: so does its dry run
        print(f"error: {too_big}", file=sys.stderr)
        return EXIT_USAGE
    if plan.memory.fits is False and plan.options.task == "train":  # the launch would refuse it: so does its dry run
        print(f"error: {NO_FIT}{plan.memory.detail}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def print_plan(plan: Plan, rendered: Rendered, run_dir: Path, size=None) -> None:
    """size: a cache job's run.cachesize.CacheSize (None: not known, e.g. the cpu demo's videos are not made yet)."""
    topo, c = plan.topology, plan.config
    demo_data, demo_vae = plan.demo_assets
    listed = os.environ.get("CUDA_VISIBLE_DEVICES") if plan.profile.device == "cuda" else None
    gpu_ids = topo.gpu_ids + (f" = CUDA_VISIBLE_DEVICES {listed}" if listed is not None else "")
    default = "NOT SET: --set ref_vae_path=... is required on GPUs"
    default_data = "NOT SET: --set data_root=... is required on GPUs"
    cache = plan.options.task == "cache"     # a cache job encodes: no optimizer, checkpoints or validation
    out = [
        f"taehv-launch {'cache ' if cache else ''}{plan.gpus} {plan.profile.name}: "
        f"{plan.profile.description}",
        f"  rows      {plan.row_source}",
        f"  topology  {topo.num_machines} node(s) x {topo.gpus_per_machine} "
        f"{'processes' if plan.profile.device == 'cpu' else 'GPUs'}, this is node {topo.machine_rank} "
        f"(GPU ids {gpu_ids}), master {topo.main_process_ip}:{topo.main_process_port}  [{topo.source}]",
        *([f"  batch     {plan.batch_arithmetic()}",
           f"  optimizer AdamW lr {c['learning_rate']:g}, warmup {c['lr_warmup_steps']}, {c['lr_scheduler']} to "
           f"{c['max_train_steps']} steps, " + (f"DeepSpeed ZeRO-{c['zero_stage']}" if c["zero_stage"] else "DDP"),
           *([f"  strategy  {plan.strategy}"] if plan.strategy else [])]
          if not cache else
          [f"  encode    micro-batch {c['micro_batch_size']} (clips per reference encode call) per process, "
           f"{plan.world_size} in all; nothing is trained"]),
        f"  clips     {c['n_frames']} frames of {c['height']}x{c['width']}, stride {c['min_frame_delta']}-"
        f"{c['max_frame_delta']}, reference VAE {c['ref_vae_type']} ({c['ref_vae_path'] or default}{' = built-in tiny demo VAE' if demo_vae and c['ref_vae_path'] == demo_vae else ''})",
        f"  data      {c['data_root'] or default_data}{' (built-in synthetic demo videos)' if demo_data and c['data_root'] == demo_data else ''}",
        f"  timeouts  process group {c['nccl_timeout']} s" + ("" if cache else
                                                             f"; checkpoint every {c['checkpointing_steps']}, "
                                                             f"validate every {c['validation_steps']}, "
                                                             f"log every {c['log_every']}"),
        f"  run dir   {run_dir}",
        "  env       " + (", ".join(f"{k}={v.value}" + (" (kept)" if v.kept else "")
                                    for k, v in rendered.env.items()) or "-"),
        "  command   " + " ".join(rendered.argv),
    ]
    if c["latent_cache"]:
        out.append(f"  cache     {c['latent_cache']}: " + (
            f"write {c['cache_views']} views per video, {c['latent_cache_dtype']}, shards of {c['cache_shard_size']}"
            if plan.options.task == "cache" else f"train on its latents (reference encode: {c['latent_cache_encode']})"))
    if cache:
        from .run.cachesize import free_space

        free, probe = free_space(c["latent_cache"])
        out.append(f"  size      {size.line()}; {free / 1e9:.2f} GB free at {probe}" if size is not None else
                   "  size      not known yet: the videos are listed when the job starts (the demo makes its own)")
    if (p := prediction(plan)) is not None:
        out.append(f"  predicted {p.line(plan.world_size, c['max_train_steps'])}")
    mem = plan.memory
    if mem.gpu_gib is not None and plan.options.task == "train":
        out.append(f"  memory    {'' if mem.fits else 'DOES NOT FIT: '}{mem.detail}")
    out += [f"  note      {n}" for n in plan.notes]
    print("\n".join(out))


def _cache_size(plan: Plan):
    """A cache job's size (None if its videos are not there yet) and the refusal line when it does not fit."""
    if plan.options.task != "cache":
        return None, ""
    from .run.cachesize import cache_size, space_problem

    size = cache_size(plan.config)
    return size, (space_problem(size, plan.config["latent_cache"]) if size is not None else "")


def launch(req: Request) -> int:
    from .run import launch as edge
    from .run.host import visible_gpus
    from .run.inputs import check_inputs
    from .run.lock import RunLock
    from .run.toolcheck import check_accelerate_yaml, check_deepspeed_config

    plan = build_plan(req)      # resolves --resume and refuses a checkpoint that cannot continue
    if plan.memory.fits is False and plan.options.task == "train":    # a cache job only encodes
        raise ConfigError(NO_FIT + plan.memory.detail)
    run_dir, notes = plan.run_dir, []
    if plan.topology.num_machines > 1 and plan.run_id_source == "timestamp" and plan.options.run_name is None:
        raise LaunchError("a multi-node run needs one run name on every node: pass the same --run-name "
                          "on each node (no scheduler job id was found)")
    if plan.profile.device == "cuda":
        check_local_gpus(plan.topology, visible_gpus(), profile=plan.profile.name)
    check_inputs(plan.config, plan.demo_assets)    # what the trainer would refuse first, before writing
    size, too_big = _cache_size(plan)
    if too_big:
        raise ConfigError(too_big)
    rendered = render(plan, run_dir)
    if rendered.deepspeed is not None:
        check_deepspeed_config(rendered.deepspeed, plan.world_size)
    edge.check_port_free(plan)     # before writing: a launch that cannot start must not repoint `latest`
    lock = RunLock(run_dir, plan.topology.machine_rank)
    edge.prepare_run_dir(plan, run_dir, lock)      # refuses a run dir another launch holds
    notes += edge.write_files(run_dir, rendered.files)   # identical on every node: safe on a shared filesystem
    if size is not None:
        from .dataindex.index import keep_index

        keep_index(size.entries)            # the job reads the videos listed here instead of listing them again
    notes += edge.write_files(run_dir, {f"env{rendered.node_suffix}.json": edge.env_record(plan, rendered)})
    check_accelerate_yaml(run_dir / "accelerate.yaml")
    print_plan(plan, rendered, run_dir, size)     # with the plan's notes (config file, resume)
    for note in notes:                      # and what writing the run's files found
        print(f"  note      {note}")
    sys.stdout.flush()
    try:
        code = edge.run(plan, rendered, run_dir)
    finally:
        lock.release()
    log = run_dir / f"launch{rendered.node_suffix}.log"
    what = "cache job" if plan.options.task == "cache" else "trainer"
    print(f"taehv-launch: {what} exited with code {code}; run: {run_dir}; log: {log}", flush=True)
    status = edge.read_status(run_dir, plan.topology.machine_rank) or {}
    if code == EXIT_ABORTED:
        kept = ("complete shards are kept: run the same command to continue" if plan.options.task == "cache" else
                "--resume auto continues from the newest complete checkpoint")
        print(f"error: stopped at once by a second signal, nothing more was saved; {kept}", file=sys.stderr)
    elif code not in (0, EXIT_RESUMABLE):
        message = status.get("message") if status.get("code") == code else None
        print(f"error: {message or f'the {what} failed: see {log}'}", file=sys.stderr)
    return code


def list_keys(as_json: bool = False) -> int:
    if as_json:
        aliases = {}
        for alias, name in ALIASES.items():
            aliases.setdefault(name, []).append(alias)
        sys.stdout.write(json.dumps([{"name": name, "type": key.type.__name__,
                                      "default": list(key.default) if isinstance(key.default, tuple) else key.default,
                                      "help": key.help, "choices": list(key.choices), "aliases": aliases.get(name, [])}
                                     for name, key in KEYS.items()], indent=2) + "\n")
        return 0
    width = max(map(len, KEYS))
    for name, key in KEYS.items():
        choices = f" [{', '.join(map(str, key.choices))}]" if key.choices else ""
        print(f"{name:<{width}}  {key.type.__name__:<5}  {key.default!r:<22} {key.help}{choices}")
    return 0

