"""The reference files shipped in configs/ and accelerate_configs/, generated from the table.

`python scripts/generate_configs.py` writes them; a test checks they still match, so they
cannot drift from profiles.py. The launcher never reads them: it renders its own per run.
"""

from __future__ import annotations

from pathlib import Path

from ..plan.profiles import PROFILES
from ..plan.schema import KEYS
from ..run.render import render
from ..plan.resolve import resolve
from ..plan.topology import detect_topology

PLACEHOLDER = Path("/RUN_DIR")


def expected_files() -> dict[str, str]:
    files: dict[str, str] = {}
    for name, profile in PROFILES.items():
        for row in profile.rows:
            plan = resolve(row.gpus, name, detect_topology(row.gpus, {}))
            rendered = render(plan, PLACEHOLDER, env={}, cpu_count=1, accelerate_bin="accelerate")
            stem = f"{name}_{row.gpus}gpu"
            files[f"configs/taehv_config_{stem}.py"] = rendered.files["config.py"]
            yaml = rendered.files["accelerate.yaml"]
            if "deepspeed.json" in rendered.files:
                yaml = yaml.replace(str(PLACEHOLDER / "deepspeed.json"), f"accelerate_configs/deepspeed_{stem}.json")
                files[f"accelerate_configs/deepspeed_{stem}.json"] = rendered.files["deepspeed.json"]
            files[f"accelerate_configs/accelerate_{stem}.yaml"] = yaml
    files["docs/config.md"] = config_reference()
    files["docs/profiles.md"] = profile_reference()
    from .examples import example_files

    files |= example_files()
    return files


def config_reference() -> str:
    """docs/config.md: every key of schema.KEYS with its type, default and meaning."""
    lines = [
        "# Config reference",
        "",
        "Generated from `src/taehv_launch/plan/schema.py` by `python scripts/generate_configs.py` (a test",
        "checks it is current). Set keys with `--set KEY=VALUE` (a Python literal) or in a config file",
        "(`--config my.py`, seed style `args = EasyDict(); args.KEY = VALUE`).",
        "Precedence: `--set` > `--config` > profile row > profile > these defaults.",
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    for name, key in KEYS.items():
        choices = f" One of: {', '.join(map(str, key.choices))}." if key.choices else ""
        lines.append(f"| `{name}` | {key.type.__name__} | `{key.default!r}` | {key.help}.{choices} |")
    return "\n".join(lines) + "\n"


COUNTS = (1, 2, 4, 8, 16, 24, 32, 48, 64)


def profile_reference() -> str:
    """docs/profiles.md: what each GPU profile resolves to for common GPU counts, from resolve() itself."""
    from ..plan.profiles import nccl_buffsize_for, row_for

    rule = " ".join(line.strip() for line in row_for.__doc__.split("\n\n")[1].splitlines())
    rule = rule.removeprefix("Rule for counts not in the table: ").replace(" (micro_override)", "")
    lines = [
        "# Profiles and GPU counts",
        "",
        "Generated from `src/taehv_launch/plan/profiles.py` by `python scripts/generate_configs.py` (a test",
        "checks it is current): each row is what `taehv-launch GPUS PROFILE --dry-run` resolves on nodes of",
        "8 GPUs. Table rows are the seeds' numbers; the others follow the rule below. Every value can be",
        "overridden with `--set KEY=VALUE` (docs/config.md).",
        "",
        f"**Rule for other counts:** {rule}",
        "",
    ]
    for name, profile in PROFILES.items():
        lines += [f"## `{name}`: {profile.description}", ""]
        lines += [
            "| GPUs | nodes | row | micro | accum. | global batch | LR | warmup | ZeRO | workers x prefetch "
            "| ckpt / val / log every | NCCL timeout | predicted peak |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for gpus in (n for n in COUNTS if n <= profile.max_gpus):
            plan = resolve(gpus, name, detect_topology(gpus, {}))
            c, topo, mem = plan.config, plan.topology, plan.memory
            how = "table" if plan.row_source.startswith("table row") else "rule"
            peak = f"{mem.predicted_gib:.1f} of {mem.gpu_gib:.0f} GiB" if mem.predicted_gib else "-"
            lines.append(
                f"| {gpus} | {topo.num_machines} | {how} | {c['micro_batch_size']} | "
                f"{c['gradient_accumulation_steps']} | {plan.global_batch_size} | {c['learning_rate']:g} | "
                f"{c['lr_warmup_steps']} | {c['zero_stage'] or 'DDP'} | "
                f"{c['dataloader_num_workers']} x {c['prefetch_factor']} | {c['checkpointing_steps']} / "
                f"{c['validation_steps']} / {c['log_every']} | {c['nccl_timeout']} s | {peak} |"
            )
        lines += [
            "",
            (
                f"Shared: {c['n_frames']} frames of {c['height']}x{c['width']}, {c['mixed_precision']}, "
                f"compile `{c['compile']}`, Seraena crop {c['seraena_crop']}, reference encode chunk "
                f"{c['ref_vae_chunk_size']}, `PYTORCH_CUDA_ALLOC_CONF={profile.alloc_conf}`."
            )
            if profile.device == "cuda"
            else "The built-in demo on the CPU (processes instead of GPUs): `taehv-launch 1 cpu`.",
            "",
        ]
    mib = [nccl_buffsize_for(n) >> 20 for n in (1, 6, 8)]
    lines += [
        f"NCCL_BUFFSIZE (set only when you have not set it): 1-5 nodes {mib[0]} MiB, 6-7 nodes {mib[1]} MiB, "
        f"8 or more nodes {mib[2]} MiB.",
        "",
    ]
    return "\n".join(lines)
