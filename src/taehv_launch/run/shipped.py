"""The reference files shipped in configs/ and accelerate_configs/, generated from the table.

`python scripts/generate_configs.py` writes them; a test checks they still match, so they
cannot drift from profiles.py. The launcher never reads them: it renders its own per run.
"""

from __future__ import annotations

from pathlib import Path

from ..plan.profiles import PROFILES
from ..plan.schema import KEYS
from .render import render
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
    from ..cluster.examples import example_files

    files |= example_files()
    return files


def config_reference() -> str:
    """docs/config.md: every key of schema.KEYS with its type, default and meaning."""
    lines = ["# Config reference", "",
             "Generated from `src/taehv_launch/plan/schema.py` by `python scripts/generate_configs.py` (a test",
             "checks it is current). Set keys with `--set KEY=VALUE` (a Python literal) or in a config file",
             "(`--config my.py`, seed style `args = EasyDict(); args.KEY = VALUE`).",
             "Precedence: `--set` > `--config` > profile row > profile > these defaults.", "",
             "| key | type | default | meaning |", "|---|---|---|---|"]
    for name, key in KEYS.items():
        choices = f" One of: {', '.join(map(str, key.choices))}." if key.choices else ""
        lines.append(f"| `{name}` | {key.type.__name__} | `{key.default!r}` | {key.help}.{choices} |")
    return "\n".join(lines) + "\n"
