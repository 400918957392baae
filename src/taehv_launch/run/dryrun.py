"""The dry run: the resolved plan as text (print_plan, also printed by the launch) or JSON (plan_json)."""

from __future__ import annotations

import glob
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..errors import EXIT_USAGE, LaunchError, UserError, one_line
from ..plan.resolve import Plan
from ..plan.scaling import unpredicted
from ..plan.schedulers import SOURCE_ASSUMED
from ..plan.trainable import trained_parts
from .render import Rendered, render
from .request import Request, build_plan, prediction
from .runs import check_latest_link

NO_FIT = "this plan will not fit in GPU memory: "
MIN_FREE_BYTES = 2 << 30  # the launch refuses a run directory with less free space


def check_run_name(plan: Plan) -> None:
    """Every node of a multi-node run must name the same run directory (pure: the launch and its dry run)."""
    multi = plan.topology.num_machines > 1 and plan.topology.source != SOURCE_ASSUMED  # assumed: refused earlier
    if multi and plan.run_id_source == "timestamp" and plan.options.run_name is None:
        raise LaunchError(
            "a multi-node run needs one run name on every node: pass the same --run-name "
            "on each node (no scheduler job id was found)"
        )


def check_this_machine(plan: Plan) -> list[str]:
    """What the launch refuses on this machine before it writes anything, checked without writing: the
    inputs the trainer reads first (run/inputs.py), a usable output_dir, and `latest`. Returns the
    notes the input checks made."""
    from .inputs import check_inputs

    notes = check_inputs(plan.config, plan.demo_assets, task=plan.options.task, run_dir=plan.run_dir)
    check_output_dir(plan.run_dir)
    if plan.topology.machine_rank == 0 and plan.options.task == "train":  # the node that repoints `latest`
        check_latest_link(plan.run_dir.parent)
    return list(notes or [])


def planned_elsewhere(plan: Plan) -> bool:
    """A GPU plan dry-run on a machine that cannot run it (no GPU device here, or `16 h100` with no
    scheduler): a preview for other machines, whose folders need not exist here."""
    if plan.profile.device != "cuda":
        return False
    if plan.topology.source == SOURCE_ASSUMED:
        return True
    return not (glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/kfd"))


def check_output_dir(run_dir: Path) -> None:
    """The run directory can be made and written: the nearest part of its path that exists is a
    writable folder on a filesystem that holds files, with MIN_FREE_BYTES free. Writes nothing."""
    fix = "pass a writable --set output_dir=..."
    probe = run_dir
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        kind = "a dangling link" if probe.is_symlink() else "a file"
        raise LaunchError(f"cannot write to {run_dir}: {probe} is {kind}, not a folder; {fix}")
    try:
        fs = os.statvfs(probe)
    except OSError as exc:
        raise LaunchError(f"cannot write to {run_dir}: {exc.strerror or exc}; {fix}") from None
    if fs.f_blocks == 0:
        raise LaunchError(
            f"cannot write to {run_dir}: {probe} is on a filesystem that holds no files (like /proc or /sys); {fix}"
        )
    if fs.f_flag & os.ST_RDONLY or not os.access(probe, os.W_OK | os.X_OK):
        what = "a read-only filesystem" if fs.f_flag & os.ST_RDONLY else "not writable"
        raise LaunchError(f"cannot write to {run_dir}: {probe} is {what}; {fix}")
    free = fs.f_bavail * fs.f_frsize
    if free < MIN_FREE_BYTES:
        raise LaunchError(
            f"only {free / 2**30:.1f} GiB free under {run_dir}: checkpoints need more; "
            f"free space or choose another --set output_dir"
        )


def model_json(c: dict) -> dict[str, Any]:
    """The TAEHV the trainer builds and the files its export writes (train/model/taehv.py, rundir/layout.py)."""
    from ..plan.families import get_family

    stem = get_family(c["ref_vae_type"]).export_stem(c["decoder_arch"])
    return {
        "decoder_arch": c["decoder_arch"],
        "patch_size": c["patch_size"],
        "latent_channels": c["latent_channels"],
        "time_stride": 2 ** sum(c["encoder_time_downscale"]),
        "exports": [f"final_model/{stem}.pth", f"final_model/{stem}.safetensors"],
    }


def model_line(c: dict) -> str:
    m = model_json(c)
    return (
        f"TAEHV, {m['decoder_arch']} decoder (patch {m['patch_size']}, {m['latent_channels']} latent channels, "
        f"{m['time_stride']}x in time); exports {m['exports'][0]} + .safetensors"
    )


CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")  # = train/loop/speed.py's (run/ does not import train/)


def compile_line(c: dict, device: str, cache: bool) -> str:
    """What torch.compile compiles (compile, compile_mode; train/loop/trainer.py `_compile`)."""
    if device != "cuda" or c["compile"] == "none":
        return "none: everything eager" + (" (torch.compile runs on GPUs only)" if device != "cuda" else "")
    ref = f"reference VAE encoder ({'channels-last, ' if c['ref_channels_last'] else ''}mode default)"
    mode = c["compile_mode"]
    if cache:
        return ref
    if c["compile"] == "all" and c["zero_stage"] != 3:
        graphs = ": CUDA graphs, a graph step per micro-batch" if mode in CUDAGRAPH_MODES else ""
        return f"{ref} and TAEHV ({'channels-last, ' if c['channels_last'] else ''}mode {mode}{graphs})"
    why = "under ZeRO-3 (compiled it measured no faster)" if c["compile"] == "all" else "(compile='reference')"
    unused = (
        f"; compile_mode={mode} has no effect: it is TAEHV's (compile='all', no ZeRO-3)" if mode != "default" else ""
    )
    return f"{ref}; TAEHV eager {why}{unused}"


def plan_json(plan: Plan, rendered: Rendered, run_dir: Path) -> dict[str, Any]:
    topo = plan.topology
    return {
        "gpus": plan.gpus,
        "profile": plan.profile.name,
        "topology": {
            "num_machines": topo.num_machines,
            "machine_rank": topo.machine_rank,
            "gpus_per_machine": topo.gpus_per_machine,
            "gpu_ids": topo.gpu_ids,
            "main_process_ip": topo.main_process_ip,
            "main_process_port": topo.main_process_port,
            "source": topo.source,
            "job_id": topo.job_id,
            "world_size": topo.world_size,
            "ranks": list(
                range(topo.machine_rank * topo.gpus_per_machine, (topo.machine_rank + 1) * topo.gpus_per_machine)
            ),
        },
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
        "latent_space": plan.latent_space,
        "model": model_json(plan.config) if plan.options.task == "train" else None,
        "decode": decode_json(plan),
        "compile": compile_line(plan.config, plan.profile.device, plan.options.task == "cache"),
        "trained": trained_parts(plan.config).as_dict() if plan.options.task == "train" else None,
        "predicted": asdict(p) if (p := prediction(plan)) else None,
        "resume": plan.options.resume,
        "files": rendered.files,  # exactly what the launch writes into run_dir
        "notes": list(plan.notes),
    }


def dry_run(req: Request, as_json: bool) -> int:
    from ..plan.topology import check_listed_gpus

    plan = build_plan(req)
    if plan.profile.device == "cuda":  # the launch's CUDA_VISIBLE_DEVICES check, without torch or a GPU here
        check_listed_gpus(plan.topology, os.environ, profile=plan.profile.name)
    run_dir = plan.run_dir
    rendered = render(plan, run_dir)
    size, too_big = cache_size_check(plan)
    # what the launch would refuse, in the launch's order: so does its dry run (the plan is printed first)
    refusal, notes = "", []
    if plan.memory.fits is False and plan.options.task == "train":
        refusal = NO_FIT + plan.memory.detail
    else:
        try:
            check_run_name(plan)
        except UserError as err:
            refusal = str(err)
    if not refusal:
        try:
            notes = check_this_machine(plan)
        except UserError as err:
            if planned_elsewhere(plan):  # a preview for GPU machines: their folders need not exist here
                notes = [f"the launch on this machine would refuse: {err} (a plan for other machines may be fine)"]
            else:
                refusal = str(err)
        refusal = refusal or too_big
    if as_json:
        doc = plan_json(plan, rendered, run_dir)
        doc["notes"] += notes
        if plan.options.task == "cache":
            doc["cache_size"] = size.as_dict() if size is not None else None
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        print_plan(plan, rendered, run_dir, size)
        for note in notes:
            print(f"  note      {note}")
        print("\n(dry run: nothing was written or started)")
    if refusal:
        print(f"error: {one_line(refusal)}", file=sys.stderr)
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
    cache = plan.options.task == "cache"  # a cache job encodes: no optimizer, checkpoints or validation
    out = [
        f"taehv-launch {'cache ' if cache else ''}{plan.gpus} {plan.profile.name}: {plan.profile.description}",
        f"  rows      {plan.row_source}",
        f"  topology  {topo.num_machines} node(s) x {topo.gpus_per_machine} "
        f"{'processes' if plan.profile.device == 'cpu' else 'GPUs'}, this is node {topo.machine_rank} "
        f"(GPU ids {gpu_ids}), master {topo.main_process_ip}:{topo.main_process_port}  [{topo.source}]",
        *(
            [
                f"  batch     {plan.batch_arithmetic()}",
                f"  optimizer AdamW lr {c['learning_rate']:g}, warmup {c['lr_warmup_steps']}, {c['lr_scheduler']} to "
                f"{c['max_train_steps']} steps, " + (f"DeepSpeed ZeRO-{c['zero_stage']}" if c["zero_stage"] else "DDP"),
                *([f"  strategy  {plan.strategy}"] if plan.strategy else []),
                f"  trains    {trained_parts(c).line()}",
                f"  model     {model_line(c)}",
            ]
            if not cache
            else [
                f"  encode    micro-batch {c['micro_batch_size']} (clips per reference encode call) per process, "
                f"{plan.world_size} in all; nothing is trained"
            ]
        ),
        f"  compile   {compile_line(c, plan.profile.device, cache)}",
        f"  clips     {c['n_frames']} frames of {c['height']}x{c['width']}, stride {c['min_frame_delta']}-"
        f"{c['max_frame_delta']}, reference VAE {c['ref_vae_type']} ({c['ref_vae_path'] or default}{' = built-in tiny demo VAE' if demo_vae and c['ref_vae_path'] == demo_vae else ''})",
        f"  latents   {plan.latent_space}",
        f"  data      {c['data_root'] or default_data}{' (built-in synthetic demo videos)' if demo_data and c['data_root'] == demo_data else ''}",
        *([] if cache else [f"  decode    {decode_line(plan)}"]),
        f"  timeouts  process group {c['nccl_timeout']} s"
        + (
            ""
            if cache
            else f"; hang {hang_text(c)}; checkpoint every {c['checkpointing_steps']}, "
            f"validate every {c['validation_steps']}, "
            f"log every {c['log_every']}"
        ),
        f"  run dir   {run_dir}",
        "  env       "
        + (", ".join(f"{k}={v.value}" + (" (kept)" if v.kept else "") for k, v in rendered.env.items()) or "-"),
        "  command   " + " ".join(rendered.argv),
    ]
    if c["latent_cache"]:
        out.append(
            f"  cache     {c['latent_cache']}: "
            + (
                f"write {c['cache_views']} views per video, {c['latent_cache_dtype']}, shards of {c['cache_shard_size']}"
                if plan.options.task == "cache"
                else f"train on its latents (reference encode: {c['latent_cache_encode']})"
            )
        )
    if cache:
        from .cachesize import free_space

        free, probe = free_space(c["latent_cache"])
        out.append(
            f"  size      {size.line()}; {free / 1e9:.2f} GB free at {probe}"
            if size is not None
            else "  size      not known yet: the videos are listed when the job starts (the demo makes its own)"
        )
    if (p := prediction(plan)) is not None:
        out.append(f"  predicted {p.line(plan.world_size, c['max_train_steps'])}")
    elif plan.options.task == "train" and plan.profile.device == "cuda":
        out.append(f"  predicted {unpredicted(plan.profile.name, c)}")
    mem = plan.memory
    if mem.gpu_gib is not None and plan.options.task == "train":
        out.append(f"  memory    {'DOES NOT FIT: ' if mem.fits is False else ''}{mem.detail}")
    out += [f"  note      {n}" for n in plan.notes]
    print("\n".join(out))


def cache_size_check(plan: Plan):
    """A cache job's size (None if its videos are not there yet) and the refusal line when it does not fit."""
    if plan.options.task != "cache":
        return None, ""
    from .cachesize import cache_size, space_problem

    size = cache_size(plan.config)
    return size, (space_problem(size, plan.config["latent_cache"]) if size is not None else "")


def hang_text(c: dict) -> str:
    """The hang detector's limits as the dry run states them (docs/troubleshooting.md, Hangs)."""
    if not c["hang_timeout"]:
        return "detection off (hang_timeout=0)"
    return f"after {c['hang_timeout']} s without progress ({c['hang_timeout_slow']} s in set-up, checkpoints, validation, warm-up)"


def decode_line(plan: Plan) -> str:
    """Where training clips are decoded (video_decoder), and with NVDEC its threads and why, said without
    importing the decoder or opening a video (the sources come from the index cache's record)."""
    c, workers = plan.config, plan.config["dataloader_num_workers"]
    cpu = f"OpenCV on the CPU in {workers} DataLoader workers per process"
    if c["video_decoder"] == "opencv" or plan.profile.device == "cpu":
        return cpu
    nv = "NVDEC on the GPU (PyNvVideoCodec, H.264; other codecs and files NVDEC refuses on the CPU)"
    if c["video_decoder"] != "nvdec":
        nv += f" where installed (the [nvdec] extra), else {cpu}"
    return f"{nv}; {decode_threads_text(plan)}"


def decode_json(plan: Plan) -> dict[str, Any] | None:
    """The NVDEC threads as the dry run states them: threads (None: chosen at start), how, reason."""
    if plan.config["video_decoder"] == "opencv" or plan.profile.device == "cpu" or plan.options.task != "train":
        return None
    choice, where = planned_decode(plan)
    if choice is None:
        return {"threads": None, "how": "at start", "reason": where}
    return {"threads": choice.threads, "how": choice.how, "reason": choice.reason, "record": where}


def planned_decode(plan: Plan):
    """(plan.decodeplan.DecodeChoice, where its sources were read) for the NVDEC threads, or (None, why not):
    video_decode_threads=0 is chosen at the trainer's start where the index cache has no sources record."""
    from ..dataindex.index import cached_sources, index_dir
    from ..plan.decodeplan import decode_choice, largest_pixels, memory_cap, nvdec_engines

    c = plan.config
    sources, where = (
        (None, "")
        if c["video_decode_threads"]
        else cached_sources(c["data_root"], c["annotation_file"], index_dir(SimpleNamespace(**c)))
    )
    if sources is None and not c["video_decode_threads"]:
        return None, where
    choice = decode_choice(
        c["video_decode_threads"],
        sources,
        n_frames=c["n_frames"],
        min_delta=c["min_frame_delta"],
        max_delta=c["max_frame_delta"],
        clip_pixels=c["n_frames"] * c["height"] * c["width"],
        engines=nvdec_engines(plan.profile.name),
        gpu=plan.profile.name,
        memory=memory_cap(c, plan.memory.gpu_gib, plan.world_size, largest_pixels(sources)),
    )
    return choice, where


def decode_threads_text(plan: Plan) -> str:
    from ..plan.decodeplan import BASE_THREADS, SESSIONS_PER_ENGINE, memory_cap, nvdec_engines

    choice, where = planned_decode(plan)
    if choice is not None:
        return choice.line() + (f" (record: {where})" if where else "")
    engines = nvdec_engines(plan.profile.name)
    most = min(SESSIONS_PER_ENGINE * engines or BASE_THREADS, memory_cap(plan.config, plan.memory.gpu_gib) or 99)
    return (
        f"threads chosen at start from the sources ({where}): {BASE_THREADS} to {max(BASE_THREADS, most)} per "
        f"process"
        + (f" on the {plan.profile.name}'s {engines} NVDEC engines" if engines else "")
        + ", within the memory the plan leaves"
    )
