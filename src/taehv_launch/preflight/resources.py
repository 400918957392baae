"""validate-env's checks of this node's resources for the plan: disk, /dev/shm, open files, CPUs, the
latent cache's space, and the GPU memory plan."""

from __future__ import annotations

import os
import resource
import shutil
from pathlib import Path

from ..plan.memory import shm_bytes
from ..plan.resolve import Plan
from .base import FAIL, PASS, WARN, Check, _gpu_plan


# ---------------------------------------------------------------- resources
def checkpoint_bytes(plan: Plan) -> int:
    """One checkpoint of this plan (run/checkpoints.py's estimate, with this model's sizes)."""
    from ..rundir.checkpoint import estimate_bytes
    from ..train.model.taehv import TAEHV, count_params
    from ..train.model.seraena import PatchDiscWithContext

    c = plan.config
    return estimate_bytes(
        count_params(
            TAEHV(latent_channels=c["latent_channels"], patch_size=c["patch_size"], decoder_arch=c["decoder_arch"])
        ),
        count_params(PatchDiscWithContext(3 * c["n_seraena_frames"], c["latent_channels"])),
        deepspeed=plan.uses_deepspeed,
        world_size=plan.world_size,
        use_seraena=c["use_seraena"],
        seraena_buffer_bytes=min(c["seraena_buffer_mb"], c["seraena_checkpoint_buffer_mb"]) << 20,
    )


def check_resources(plan: Plan, quick: bool) -> list[Check]:
    c, topo, out = plan.config, plan.topology, []
    outdir = Path(c["output_dir"]).expanduser().resolve()
    probe = outdir if outdir.exists() else next((p for p in outdir.parents if p.exists()), Path("/"))
    free = shutil.disk_usage(probe).free
    need = (c["checkpoints_total_limit"] + 2) * checkpoint_bytes(plan) + (1 << 30)
    out.append(
        Check(
            "disk",
            PASS if free >= need else FAIL,
            f"{free / 2**30:.1f} GiB free at {probe}, need about {need / 2**30:.1f} GiB for "
            f"{c['checkpoints_total_limit']} checkpoints + exports + logs",
            "" if free >= need else "free space or choose --set output_dir on a larger disk",
        )
    )
    workers = c["dataloader_num_workers"]
    if workers:
        shm_need = shm_bytes(c, topo.gpus_per_machine)
        try:
            shm = shutil.disk_usage("/dev/shm").total
            ok = shm >= shm_need
            out.append(
                Check(
                    "/dev/shm",
                    PASS if ok else FAIL,
                    f"{shm / 2**30:.1f} GiB, DataLoader workers need about {shm_need / 2**30:.1f} GiB",
                    ""
                    if ok
                    else "mount a larger /dev/shm (docker --shm-size, k8s emptyDir medium: Memory)"
                    " or lower dataloader_num_workers",
                )
            )
        except OSError:
            out.append(Check("/dev/shm", WARN, "no /dev/shm", "DataLoader workers need shared memory"))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    want_files = 1024 * max(1, workers) * topo.gpus_per_machine
    out.append(
        Check(
            "open files",
            PASS if soft >= min(want_files, 65536) else WARN,
            f"ulimit -n {soft}",
            "" if soft >= min(want_files, 65536) else "raise it: ulimit -n 65536",
        )
    )
    cpus = os.cpu_count() or 1
    procs = topo.gpus_per_machine * (1 + workers)
    out.append(
        Check(
            "cpus",
            PASS if cpus >= procs else WARN,
            f"{cpus} CPUs for {topo.gpus_per_machine} processes x (1 + {workers} workers)",
            "" if cpus >= procs else f"lower dataloader_num_workers to {max(0, cpus // topo.gpus_per_machine - 1)}",
        )
    )
    return out


def check_cache_space(plan: Plan, quick: bool) -> list[Check]:
    """validate-env --cache: the latent cache this job would write fits on its filesystem."""
    if plan.options.task != "cache":
        return []
    from ..run.cachesize import cache_size, free_space, space_problem

    size = cache_size(plan.config)
    if size is None:
        return [
            Check(
                "cache space", WARN, "not known yet: the job lists the videos when it starts (the demo makes its own)"
            )
        ]
    problem = space_problem(size, plan.config["latent_cache"])
    free, probe = free_space(plan.config["latent_cache"])
    return [
        Check(
            "cache space",
            FAIL if problem else PASS,
            problem or f"{size.line()}; {free / 1e9:.2f} GB free at {probe}",
            "",
        )
    ]


def check_memory_plan(plan: Plan, quick: bool) -> list[Check]:
    if not _gpu_plan(plan):
        return [Check("memory plan", PASS, "cpu profile: GPU memory does not apply")]
    mem = plan.memory
    status = WARN if mem.fits is None else PASS if mem.fits else FAIL
    return [
        Check(
            "memory plan",
            status,
            mem.detail,
            "" if mem.fits else ("" if mem.fits is None else "see the suggested micro-batch in the detail"),
        )
    ]
