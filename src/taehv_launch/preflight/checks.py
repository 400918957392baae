"""`taehv-launch validate-env`: check, for this exact plan on this node, what would kill the job later.

Each check gives PASS / WARN / FAIL, one line of evidence and, when it fails, what to do.
The only module that probes the machine (GPUs, network, disk, data, models).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from dataclasses import asdict
from typing import Callable

from ..run.request import Request, build_plan
from ..errors import UserError
from ..run.host import port_free, visible_gpus
from ..plan.resolve import Plan
from .base import FAIL, PASS, WARN, Check, _gpu_plan
from .inputs import check_data, check_models
from .resources import check_cache_space, check_memory_plan, check_resources

ALLREDUCE_FLOOR_GBPS = 50.0  # bus bandwidth below this on one node means no NVLink/P2P path


# ---------------------------------------------------------------- GPUs
def check_gpus(plan: Plan, quick: bool) -> list[Check]:
    import torch

    from ..plan.topology import check_local_gpus

    n = visible_gpus()
    if not _gpu_plan(plan):
        return [
            Check(
                "gpus",
                PASS,
                f"cpu profile: {plan.topology.gpus_per_machine} process(es), no GPU needed"
                + (f" ({n} GPU(s) visible, unused)" if n else ""),
            )
        ]
    if n == 0:
        return [
            Check(
                "gpus",
                FAIL,
                f"no GPU visible; the plan needs {plan.topology.gpus_per_machine} on this node",
                "check nvidia-smi and CUDA_VISIBLE_DEVICES, or run `taehv-launch validate-env 1 cpu`",
            )
        ]
    out = []
    try:
        check_local_gpus(plan.topology, n, profile=plan.profile.name)
        out.append(Check("gpus", PASS, f"{n} visible, plan uses {plan.topology.gpus_per_machine} on this node"))
    except UserError as err:
        out.append(Check("gpus", FAIL, str(err), "fix the GPU count or the node layout"))
    names = {torch.cuda.get_device_name(i) for i in range(n)}
    want = plan.profile.name.upper()
    out.append(
        Check(
            "gpu model",
            PASS if all(want in nm.upper() for nm in names) else WARN,
            f"{', '.join(sorted(names))} for profile {plan.profile.name}",
            ""
            if all(want in nm.upper() for nm in names)
            else f"the {plan.profile.name} profile's batch sizes and allocator settings were chosen for "
            f"{want}; pick the profile of this GPU or check memory with the memory-plan line",
        )
    )
    drv = _nvidia_smi("driver_version")
    out.append(Check("driver / CUDA", PASS, f"driver {drv or 'unknown'}, CUDA runtime {torch.version.cuda}"))
    bf16 = torch.cuda.is_bf16_supported()
    needs_bf16 = plan.config["mixed_precision"] == "bf16"
    out.append(
        Check(
            "bf16",
            PASS if bf16 or not needs_bf16 else FAIL,
            f"bf16 {'supported' if bf16 else 'NOT supported'}",
            "" if bf16 or not needs_bf16 else "use --set mixed_precision=fp16 on this GPU",
        )
    )
    mem = plan.memory
    free = min(torch.cuda.mem_get_info(i)[0] for i in range(min(n, plan.topology.gpus_per_machine))) / 2**30
    if mem.predicted_gib is None:
        out.append(Check("gpu memory free", PASS, f"{free:.1f} GiB free on the emptiest GPU ({mem.detail})"))
    else:
        ok = free >= mem.predicted_gib
        out.append(
            Check(
                "gpu memory free",
                PASS if ok else FAIL,
                f"{free:.1f} GiB free, plan needs about {mem.predicted_gib:.1f} GiB",
                "" if ok else "stop other processes on these GPUs (nvidia-smi) or lower micro_batch_size",
            )
        )
    return out


def _nvidia_smi(field: str) -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = (
            subprocess.run(
                ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            .stdout.strip()
            .splitlines()
        )
        return out[0] if out else None
    except (OSError, subprocess.SubprocessError):
        return None


# ---------------------------------------------------------------- software
def check_software(plan: Plan, quick: bool) -> list[Check]:
    from importlib import metadata

    from packaging.requirements import Requirement

    out = []
    try:
        reqs = {
            Requirement(r).name.lower(): Requirement(r)
            for r in metadata.requires("taehv-launch") or []
            if "extra ==" not in r
        }
    except metadata.PackageNotFoundError:  # running from a source tree on PYTHONPATH
        reqs = {}
        out.append(
            Check(
                "taehv-launch",
                WARN,
                "not installed as a package: supported version ranges unknown",
                "pip install -e . from the checkout",
            )
        )
    for name in ("torch", "accelerate", "deepspeed", "diffusers", "transformers", "opencv-python-headless", "av"):
        req = reqs.get(name)
        try:
            ver = metadata.version(name)
        except metadata.PackageNotFoundError:
            out.append(Check(name, FAIL, "not installed", f"pip install '{req or name}'"))
            continue
        ok = req is None or req.specifier.contains(ver, prereleases=True)
        out.append(
            Check(
                name,
                PASS if ok else FAIL,
                f"{ver} (supported: {req.specifier if req else 'any'})",
                "" if ok else f"pip install '{req}'",
            )
        )
    try:
        metadata.version("opencv-python")
        out.append(
            Check(
                "opencv wheels",
                FAIL,
                "opencv-python and opencv-python-headless are both installed",
                "pip uninstall -y opencv-python (both together break cv2)",
            )
        )
    except metadata.PackageNotFoundError:
        pass
    import torch

    if _gpu_plan(plan):
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
        out.append(
            Check(
                "nccl",
                PASS if nccl else FAIL,
                f"NCCL {nccl}" if nccl else "NCCL not available",
                "" if nccl else "install a CUDA build of torch",
            )
        )
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
                out.append(
                    Check(
                        "master port",
                        FAIL,
                        f"port {topo.main_process_port} is in use",
                        "pass --master-port with a free port",
                    )
                )
        else:
            try:
                socket.create_connection((topo.main_process_ip, topo.main_process_port), timeout=5).close()
                out.append(Check("master reachable", PASS, f"{topo.main_process_ip}:{topo.main_process_port} accepts"))
            except OSError as exc:
                out.append(
                    Check(
                        "master reachable",
                        WARN,
                        f"{topo.main_process_ip}:{topo.main_process_port}: "
                        f"{exc.strerror or exc} (fine if node 0 has not started yet)",
                        "check the address, firewall and that node 0 runs first",
                    )
                )
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
        return out + [
            Check(
                "all-reduce",
                FAIL,
                f"{n}-rank all-reduce failed: {type(exc).__name__}: {exc}",
                "run with --debug-level logs: NCCL_DEBUG=INFO taehv-launch validate-env ...",
            )
        ]
    if gpu:
        ok = gbps >= ALLREDUCE_FLOOR_GBPS
        out.append(
            Check(
                "all-reduce",
                PASS if ok else WARN,
                f"{n} GPUs, 256 MiB, bus bandwidth {gbps:.0f} GB/s (floor {ALLREDUCE_FLOOR_GBPS:.0f})",
                "" if ok else "slow intra-node path: check nvidia-smi topo -m and NCCL_P2P_DISABLE",
            )
        )
    else:
        out.append(Check("all-reduce", PASS, f"{n} CPU ranks over gloo, 16 MiB in {secs * 1000:.0f} ms"))
    return out


CHECKS: list[Callable[[Plan, bool], list[Check]]] = [
    check_gpus,
    check_software,
    check_communication,
    check_data,
    check_models,
    check_resources,
    check_cache_space,
    check_memory_plan,
]


def validate_env(req: Request, as_json: bool, quick: bool) -> int:
    plan = build_plan(req)
    checks: list[Check] = []
    for fn in CHECKS:
        name = fn.__name__.removeprefix("check_")
        try:
            checks += fn(plan, quick)
        except Exception as exc:  # a check that crashes is a failed check, not a crashed preflight
            checks.append(
                Check(
                    name,
                    FAIL,
                    f"check crashed: {type(exc).__name__}: {exc}",
                    "report this with TAEHV_TRACEBACK=1 output",
                )
            )
    failed = any(c.status == FAIL for c in checks)
    if as_json:
        sys.stdout.write(json.dumps({"checks": [asdict(c) for c in checks], "ok": not failed}, indent=2) + "\n")
    else:
        print(f"validate-env {plan.gpus} {plan.profile.name}: {plan.topology.describe()}")
        for c in checks:
            print(f"  {c.status}  {c.name:<18} {c.detail}")
            if c.fix and c.status != PASS:
                print(f"        {'':<18} fix: {c.fix}")
        print(
            f"{sum(c.status == FAIL for c in checks)} failed, {sum(c.status == WARN for c in checks)} warnings, "
            f"{sum(c.status == PASS for c in checks)} passed"
        )
    return 1 if failed else 0
