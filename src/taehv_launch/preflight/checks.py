"""`taehv-launch validate-env`: check, for this exact plan on this node, what would kill the job later.

Each check gives PASS / WARN / FAIL, one line of evidence and, when it fails, what to do.
The only module that probes the machine (GPUs, network, disk, data, models).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from ..run.request import Request, build_plan
from ..errors import UserError
from ..run.host import port_free, visible_gpus
from ..plan.resolve import Plan
from ..plan.memory import shm_bytes
from .base import FAIL, PASS, WARN, Check, _gpu_plan

ALLREDUCE_FLOOR_GBPS = 50.0     # bus bandwidth below this on one node means no NVLink/P2P path


# ---------------------------------------------------------------- GPUs
def check_gpus(plan: Plan, quick: bool) -> list[Check]:
    import torch

    from ..plan.topology import check_local_gpus

    n = visible_gpus()
    if not _gpu_plan(plan):
        return [Check("gpus", PASS, f"cpu profile: {plan.topology.gpus_per_machine} process(es), no GPU needed"
                      + (f" ({n} GPU(s) visible, unused)" if n else ""))]
    if n == 0:
        return [Check("gpus", FAIL, f"no GPU visible; the plan needs {plan.topology.gpus_per_machine} on this node",
                      "check nvidia-smi and CUDA_VISIBLE_DEVICES, or run `taehv-launch validate-env 1 cpu`")]
    out = []
    try:
        check_local_gpus(plan.topology, n, profile=plan.profile.name)
        out.append(Check("gpus", PASS, f"{n} visible, plan uses {plan.topology.gpus_per_machine} on this node"))
    except UserError as err:
        out.append(Check("gpus", FAIL, str(err), "fix the GPU count or the node layout"))
    names = {torch.cuda.get_device_name(i) for i in range(n)}
    want = plan.profile.name.upper()
    out.append(Check("gpu model", PASS if all(want in nm.upper() for nm in names) else WARN,
                     f"{', '.join(sorted(names))} for profile {plan.profile.name}",
                     "" if all(want in nm.upper() for nm in names) else
                     f"the {plan.profile.name} profile's batch sizes and allocator settings were chosen for "
                     f"{want}; pick the profile of this GPU or check memory with the memory-plan line"))
    drv = _nvidia_smi("driver_version")
    out.append(Check("driver / CUDA", PASS, f"driver {drv or 'unknown'}, CUDA runtime {torch.version.cuda}"))
    bf16 = torch.cuda.is_bf16_supported()
    needs_bf16 = plan.config["mixed_precision"] == "bf16"
    out.append(Check("bf16", PASS if bf16 or not needs_bf16 else FAIL, f"bf16 {'supported' if bf16 else 'NOT supported'}",
                     "" if bf16 or not needs_bf16 else "use --set mixed_precision=fp16 on this GPU"))
    mem = plan.memory
    free = min(torch.cuda.mem_get_info(i)[0] for i in range(min(n, plan.topology.gpus_per_machine))) / 2**30
    if mem.predicted_gib is None:
        out.append(Check("gpu memory free", PASS, f"{free:.1f} GiB free on the emptiest GPU ({mem.detail})"))
    else:
        ok = free >= mem.predicted_gib
        out.append(Check("gpu memory free", PASS if ok else FAIL,
                         f"{free:.1f} GiB free, plan needs about {mem.predicted_gib:.1f} GiB",
                         "" if ok else "stop other processes on these GPUs (nvidia-smi) or lower micro_batch_size"))
    return out


def _nvidia_smi(field: str) -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout.strip().splitlines()
        return out[0] if out else None
    except (OSError, subprocess.SubprocessError):
        return None


# ---------------------------------------------------------------- software
def check_software(plan: Plan, quick: bool) -> list[Check]:
    from importlib import metadata

    from packaging.requirements import Requirement

    out = []
    try:
        reqs = {Requirement(r).name.lower(): Requirement(r) for r in metadata.requires("taehv-launch") or []
                if "extra ==" not in r}
    except metadata.PackageNotFoundError:   # running from a source tree on PYTHONPATH
        reqs = {}
        out.append(Check("taehv-launch", WARN, "not installed as a package: supported version ranges unknown",
                         "pip install -e . from the checkout"))
    for name in ("torch", "accelerate", "deepspeed", "diffusers", "transformers", "opencv-python-headless"):
        req = reqs.get(name)
        try:
            ver = metadata.version(name)
        except metadata.PackageNotFoundError:
            out.append(Check(name, FAIL, "not installed", f"pip install '{req or name}'"))
            continue
        ok = req is None or req.specifier.contains(ver, prereleases=True)
        out.append(Check(name, PASS if ok else FAIL, f"{ver} (supported: {req.specifier if req else 'any'})",
                         "" if ok else f"pip install '{req}'"))
    try:
        metadata.version("opencv-python")
        out.append(Check("opencv wheels", FAIL, "opencv-python and opencv-python-headless are both installed",
                         "pip uninstall -y opencv-python (both together break cv2)"))
    except metadata.PackageNotFoundError:
        pass
    import torch

    if _gpu_plan(plan):
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
        out.append(Check("nccl", PASS if nccl else FAIL, f"NCCL {nccl}" if nccl else "NCCL not available",
                         "" if nccl else "install a CUDA build of torch"))
    else:
        import torch.distributed as dist

        out.append(Check("gloo", PASS if dist.is_gloo_available() else FAIL, "gloo backend for CPU ranks"))
    return out


# ---------------------------------------------------------------- communication
def check_communication(plan: Plan, quick: bool) -> list[Check]:
    topo, out = plan.topology, []
    if topo.num_machines > 1:
        if topo.machine_rank == 0:
            if port_free(topo.main_process_port):
                out.append(Check("master port", PASS, f"port {topo.main_process_port} is free on the master"))
            else:
                out.append(Check("master port", FAIL, f"port {topo.main_process_port} is in use",
                                 "pass --master-port with a free port"))
        else:
            try:
                socket.create_connection((topo.main_process_ip, topo.main_process_port), timeout=5).close()
                out.append(Check("master reachable", PASS, f"{topo.main_process_ip}:{topo.main_process_port} accepts"))
            except OSError as exc:
                out.append(Check("master reachable", WARN, f"{topo.main_process_ip}:{topo.main_process_port}: "
                                 f"{exc.strerror or exc} (fine if node 0 has not started yet)",
                                 "check the address, firewall and that node 0 runs first"))
    if quick:
        return out + [Check("all-reduce", WARN, "skipped (--quick)")]
    import torch

    gpu = _gpu_plan(plan)
    n = min(topo.gpus_per_machine, torch.cuda.device_count()) if gpu else min(2, topo.gpus_per_machine)
    if n < 2:
        return out + [Check("all-reduce", PASS, "one process on this node: nothing to reduce locally")]
    try:
        from .worker import spawn_allreduce

        gbps, secs = spawn_allreduce(n, gpu)
    except Exception as exc:
        return out + [Check("all-reduce", FAIL, f"{n}-rank all-reduce failed: {type(exc).__name__}: {exc}",
                            "run with --debug-level logs: NCCL_DEBUG=INFO taehv-launch validate-env ...")]
    if gpu:
        ok = gbps >= ALLREDUCE_FLOOR_GBPS
        out.append(Check("all-reduce", PASS if ok else WARN,
                         f"{n} GPUs, 256 MiB, bus bandwidth {gbps:.0f} GB/s (floor {ALLREDUCE_FLOOR_GBPS:.0f})",
                         "" if ok else "slow intra-node path: check nvidia-smi topo -m and NCCL_P2P_DISABLE"))
    else:
        out.append(Check("all-reduce", PASS, f"{n} CPU ranks over gloo, 16 MiB in {secs * 1000:.0f} ms"))
    return out


# ---------------------------------------------------------------- data
def _demo_asset(plan: Plan, which: int) -> str | None:
    """For the cpu demo's data (0) or reference VAE (1): where it is, or will be made by the first
    run (not a failure); None when the config names other assets."""
    path = plan.demo_assets[which]
    if not path or (plan.config["data_root"], plan.config["ref_vae_path"])[which] != path:
        return None
    return f"present in {path}" if (Path(path) / ".complete").is_file() else f"will be created in {path} by the first run"


def check_data(plan: Plan, quick: bool) -> list[Check]:
    from .decoder import check_decoder

    c = plan.config
    if not c["data_root"]:
        return [Check("data", FAIL, "data_root is not set", "--set data_root=/path/to/videos")]
    if demo := _demo_asset(plan, 0):
        return [Check("data", PASS, "built-in synthetic demo set: " + demo), check_decoder(plan, None)]
    from ..train.data.clips import VideoClipDataset
    from ..dataindex.index import build_index

    with tempfile.TemporaryDirectory() as cache:
        try:
            entries = build_index(c["data_root"], c["annotation_file"], cache)
        except UserError as err:
            return [Check("data", FAIL, str(err), "fix data_root / annotation_file")]
    out = [Check("data index", PASS, f"{len(entries)} videos under {c['data_root']}"
                 + (f" ({entries.missing} annotation paths missing)" if getattr(entries, "missing", 0) else ""))]
    sample = entries[:: max(1, len(entries) // (3 if quick else 8))][: 3 if quick else 8]
    broken = []
    for e in sample:
        ds = VideoClipDataset([e], c["height"], c["width"], c["n_frames"], c["min_frame_delta"], c["max_frame_delta"],
                              train=False)
        try:
            item = ds[0]
            if item["skipped"]:
                broken.append(e.path)
        except UserError:
            broken.append(e.path)
    share = len(broken) / max(1, len(sample))
    status = PASS if share == 0 else FAIL if share == 1 else WARN
    out.append(Check("data decode", status, f"{len(sample) - len(broken)}/{len(sample)} sampled videos decode to "
                     f"{c['n_frames']}x{c['height']}x{c['width']}" + (f"; broken e.g. {broken[0]}" if broken else ""),
                     "" if status == PASS else "broken files are skipped during training; remove them or fix the paths"))
    good = [e.path for e in sample if e.path not in broken]
    return out + [check_decoder(plan, good[0] if good else None)]


# ---------------------------------------------------------------- models
def check_models(plan: Plan, quick: bool) -> list[Check]:
    c, out = plan.config, []
    if c["latent_cache"] and c["latent_cache_encode"] == "never":   # settle() checked the cache's manifest
        out.append(Check("reference VAE", PASS, f"not loaded: the latent cache {c['latent_cache']} holds its latents"))
    elif c["use_ref_vae"]:
        if not c["ref_vae_path"]:
            out.append(Check("reference VAE", FAIL, "ref_vae_path is not set", "--set ref_vae_path=/path/to/vae"))
        elif demo := _demo_asset(plan, 1):
            out.append(Check("reference VAE", PASS, f"built-in tiny {c['ref_vae_type']} VAE: " + demo))
        else:
            out.append(_check_ref_vae(c, quick))
    if c["pretrained_model_path"]:
        from ..train.model.taehv import build_taehv

        try:
            build_taehv(c)
            out.append(Check("pretrained TAEHV", PASS, f"{c['pretrained_model_path']} loads with matching keys"))
        except UserError as err:
            out.append(Check("pretrained TAEHV", FAIL, str(err), "fix pretrained_model_path or the model keys"))
    return out


def _check_ref_vae(c: dict, quick: bool) -> Check:
    import torch

    from ..train.reference.refvae import ChannelMismatch, load_reference_vae

    try:
        t0 = time.perf_counter()
        ref = load_reference_vae(c["ref_vae_type"], c["ref_vae_path"], dtype=torch.float32, device="cpu",
                                 expect_channels=c["latent_channels"])
        if quick:
            return Check("reference VAE", PASS, f"{c['ref_vae_type']} loads ({ref.latent_channels} latent channels)")
        lat = ref.encode(torch.rand(1, 12, 3, 64, 64))
        return Check("reference VAE", PASS, f"{c['ref_vae_type']} loads and encodes 12x64x64 -> {tuple(lat.shape)} "
                     f"in {time.perf_counter() - t0:.1f} s")
    except ChannelMismatch as err:
        return Check("reference VAE", FAIL, str(err), f"--set latent_channels={err.channels}")
    except UserError as err:
        return Check("reference VAE", FAIL, str(err), "fix ref_vae_path / ref_vae_type")


# ---------------------------------------------------------------- resources
def checkpoint_bytes(plan: Plan) -> int:
    """One checkpoint of this plan (run/checkpoints.py's estimate, with this model's sizes)."""
    from ..rundir.checkpoint import estimate_bytes
    from ..train.model.taehv import TAEHV, count_params
    from ..train.model.seraena import PatchDiscWithContext

    c = plan.config
    return estimate_bytes(count_params(TAEHV(latent_channels=c["latent_channels"], patch_size=c["patch_size"])),
                          count_params(PatchDiscWithContext(3 * c["n_seraena_frames"], c["latent_channels"])),
                          deepspeed=plan.uses_deepspeed, world_size=plan.world_size, use_seraena=c["use_seraena"],
                          seraena_buffer_bytes=min(c["seraena_buffer_mb"], c["seraena_checkpoint_buffer_mb"]) << 20)


def check_resources(plan: Plan, quick: bool) -> list[Check]:
    c, topo, out = plan.config, plan.topology, []
    outdir = Path(c["output_dir"]).expanduser().resolve()
    probe = outdir if outdir.exists() else next((p for p in outdir.parents if p.exists()), Path("/"))
    free = shutil.disk_usage(probe).free
    need = (c["checkpoints_total_limit"] + 2) * checkpoint_bytes(plan) + (1 << 30)
    out.append(Check("disk", PASS if free >= need else FAIL,
                     f"{free / 2**30:.1f} GiB free at {probe}, need about {need / 2**30:.1f} GiB for "
                     f"{c['checkpoints_total_limit']} checkpoints + exports + logs",
                     "" if free >= need else "free space or choose --set output_dir on a larger disk"))
    workers = c["dataloader_num_workers"]
    if workers:
        shm_need = shm_bytes(c, topo.gpus_per_machine)
        try:
            shm = shutil.disk_usage("/dev/shm").total
            ok = shm >= shm_need
            out.append(Check("/dev/shm", PASS if ok else FAIL,
                             f"{shm / 2**30:.1f} GiB, DataLoader workers need about {shm_need / 2**30:.1f} GiB",
                             "" if ok else "mount a larger /dev/shm (docker --shm-size, k8s emptyDir medium: Memory)"
                             " or lower dataloader_num_workers"))
        except OSError:
            out.append(Check("/dev/shm", WARN, "no /dev/shm", "DataLoader workers need shared memory"))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    want_files = 1024 * max(1, workers) * topo.gpus_per_machine
    out.append(Check("open files", PASS if soft >= min(want_files, 65536) else WARN, f"ulimit -n {soft}",
                     "" if soft >= min(want_files, 65536) else "raise it: ulimit -n 65536"))
    cpus = os.cpu_count() or 1
    procs = topo.gpus_per_machine * (1 + workers)
    out.append(Check("cpus", PASS if cpus >= procs else WARN,
                     f"{cpus} CPUs for {topo.gpus_per_machine} processes x (1 + {workers} workers)",
                     "" if cpus >= procs else f"lower dataloader_num_workers to {max(0, cpus // topo.gpus_per_machine - 1)}"))
    return out


def check_cache_space(plan: Plan, quick: bool) -> list[Check]:
    """validate-env --cache: the latent cache this job would write fits on its filesystem."""
    if plan.options.task != "cache":
        return []
    from ..run.cachesize import cache_size, free_space, space_problem

    size = cache_size(plan.config)
    if size is None:
        return [Check("cache space", WARN, "not known yet: the job lists the videos when it starts (the demo makes "
                                           "its own)")]
    problem = space_problem(size, plan.config["latent_cache"])
    free, probe = free_space(plan.config["latent_cache"])
    return [Check("cache space", FAIL if problem else PASS,
                  problem or f"{size.line()}; {free / 1e9:.2f} GB free at {probe}",
                  "")]


def check_memory_plan(plan: Plan, quick: bool) -> list[Check]:
    if not _gpu_plan(plan):
        return [Check("memory plan", PASS, "cpu profile: GPU memory does not apply")]
    mem = plan.memory
    status = WARN if mem.fits is None else PASS if mem.fits else FAIL
    return [Check("memory plan", status, mem.detail,
                  "" if mem.fits else ("" if mem.fits is None else "see the suggested micro-batch in the detail"))]


CHECKS: list[Callable[[Plan, bool], list[Check]]] = [check_gpus, check_software, check_communication, check_data,
                                                     check_models, check_resources, check_cache_space,
                                                     check_memory_plan]


def validate_env(req: Request, as_json: bool, quick: bool) -> int:
    plan = build_plan(req)
    checks: list[Check] = []
    for fn in CHECKS:
        name = fn.__name__.removeprefix("check_")
        try:
            checks += fn(plan, quick)
        except Exception as exc:    # a check that crashes is a failed check, not a crashed preflight
            checks.append(Check(name, FAIL, f"check crashed: {type(exc).__name__}: {exc}",
                                "report this with TAEHV_TRACEBACK=1 output"))
    failed = any(c.status == FAIL for c in checks)
    if as_json:
        sys.stdout.write(json.dumps({"checks": [asdict(c) for c in checks], "ok": not failed}, indent=2) + "\n")
    else:
        print(f"validate-env {plan.gpus} {plan.profile.name}: {plan.topology.describe()}")
        for c in checks:
            print(f"  {c.status}  {c.name:<18} {c.detail}")
            if c.fix and c.status != PASS:
                print(f"        {'':<18} fix: {c.fix}")
        print(f"{sum(c.status == FAIL for c in checks)} failed, {sum(c.status == WARN for c in checks)} warnings, "
              f"{sum(c.status == PASS for c in checks)} passed")
    return 1 if failed else 0
