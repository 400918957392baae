"""The reference files shipped in configs/ and accelerate_configs/, generated from the table.

`python scripts/generate_configs.py` writes them; a test checks they still match, so they
cannot drift from profiles.py. The launcher never reads them: it renders its own per run.
"""

from __future__ import annotations

from pathlib import Path

from .profiles import PROFILES
from .render import render
from .resolve import resolve
from .topology import detect_topology

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
    return files
