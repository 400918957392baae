"""Config files and `--set` overrides: parse, type-check against schema.KEYS, explain mistakes.

Config files are Python (seed style: `args = EasyDict(); args.learning_rate = 1e-4`, or
plain assignments `learning_rate = 1e-4`). They are executed, so only run files you trust;
`--set` values are parsed with `ast.literal_eval` and never executed.
"""

from __future__ import annotations

import ast
import difflib
import runpy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ..errors import ConfigError
from .schema import ALIASES, KEYS

# Keys the seed configs carry that this trainer does not use. Accepted in config files so
# seed files load; each is reported as ignored, with what to use instead.
SEED_ONLY_KEYS: dict[str, str] = {
    "use_flash_attention": "TAEHV is convolutions only; the Hunyuan and Wan VAEs' attention runs through torch's "
                           "scaled_dot_product_attention, which has its own FlashAttention kernels",
    "enable_xformers": "TAEHV is convolutions only; the Hunyuan and Wan VAEs' attention runs through torch's "
                       "scaled_dot_product_attention",
    "compile_model": "use --set compile='reference' or 'all' (the GPU profiles compile the reference encoder)",
    "persistent_workers": "workers are always persistent when dataloader_num_workers > 0",
    "num_validation_samples": "use num_sample_clips",
    "tracker_name": "logs always go to TensorBoard under <run>/logs",
    "report_to": "logs always go to TensorBoard under <run>/logs",
    "resume_from_checkpoint": "use --resume PATH or --resume auto",
    "use_zero3_save": "ZeRO-3 exports are gathered automatically",
    "zero3_save_16bit_model": "exports gather the full weights under every ZeRO stage (fp32 safetensors + .pth)",
    "deepspeed_config_file": "the DeepSpeed config is rendered from the profile into <run>/deepspeed.json; "
                             "set zero_stage / bucket_size_mb instead",
    "communication_overlap": "overlap_comm is on for every GPU profile (rendered into deepspeed.json)",
    "frames_target": "derived: n_frames - frames_to_trim",
    "per_gpu_batch_size": "use micro_batch_size",
}


def suggest(name: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def check_value(name: str, value: Any, origin: str | None) -> Any:
    """Return `value` checked (and tuple-normalised) for key `name` (an alias is checked as the key it
    names); raise ConfigError otherwise, naming `origin` (None: the caller names it)."""
    name = ALIASES.get(name, name)
    where = f" in {origin}" if origin else ""
    if name not in KEYS:
        raise ConfigError(f"unknown config key {name!r}{where}{suggest(name, KEYS)}; "
                          f"`taehv-launch keys` lists them all")
    key = KEYS[name]
    ok = isinstance(value, key.type) and not (key.type is int and isinstance(value, bool))
    if key.type is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if key.type is tuple and isinstance(value, list):
        value, ok = tuple(value), True
    if not ok:
        raise ConfigError(f"{name} must be {key.type.__name__}, got {type(value).__name__} {value!r}{where}")
    if key.choices and value not in key.choices:
        raise ConfigError(f"{name}={value!r}{where} is not one of {', '.join(map(str, key.choices))}")
    return value


def parse_set(item: str) -> tuple[str, Any]:
    """`KEY=VALUE` -> (key, literal). Bare words that are not literals are taken as strings."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r} is not KEY=VALUE (example: --set learning_rate=2e-4)")
    name, raw = (s.strip() for s in item.split("=", 1))
    if not name:
        raise ConfigError(f"--set {item!r} has no key (example: --set learning_rate=2e-4)")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw  # unquoted strings: --set data_root=/data/videos
    return ALIASES.get(name, name), check_value(name, value, f"--set {item}")


def parse_sets(items: Iterable[str]) -> dict[str, Any]:
    """Later --set of a key (under either of its names) wins, as with any repeated --set."""
    return dict(parse_set(item) for item in items)


# Seed keys that are launch options here: the config file sets them unless the command line does.
LAUNCH_KEYS = ("master_port", "world_size")


@dataclass(frozen=True)
class ConfigFile:
    values: dict[str, Any]           # checked training-config keys
    notes: list[str]                 # seed keys ignored, each with what to use instead
    launch: dict[str, int]           # seed launch options: master_port, world_size (checked against GPUS)


def load_config_file(path: str | Path) -> ConfigFile:
    """Execute a Python config file; every unknown key or bad value is reported at once, in one message."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} not found: pass an existing .py file to --config")
    try:
        namespace = runpy.run_path(str(path))
    except (Exception, SystemExit) as exc:  # the user's own code failed (or called exit()): report it in one line
        detail = " ".join(str(exc).split())
        raise ConfigError(f"config file {path} failed to run: {type(exc).__name__}"
                          + (f": {detail}" if detail else "")) from None
    args = namespace.get("args")
    if isinstance(args, dict):  # EasyDict is a dict
        raw = dict(args)
    else:
        raw = {k: v for k, v in namespace.items()
               if not k.startswith("_") and (k in KEYS or k in ALIASES or k in SEED_ONLY_KEYS or k in LAUNCH_KEYS)}
    values: dict[str, Any] = {}
    notes, problems, launch = [], [], {}
    for name, value in raw.items():
        if name in SEED_ONLY_KEYS:
            notes.append(f"{path.name}: ignoring seed key {name!r}: {SEED_ONLY_KEYS[name]}")
            continue
        if name in LAUNCH_KEYS:
            try:
                launch[name] = int(value)
            except (TypeError, ValueError):
                problems.append(f"{name} must be a whole number, got {value!r}")
            continue
        try:
            key, value = ALIASES.get(name, name), check_value(name, value, None)   # the message names the file
        except ConfigError as err:
            problems.append(str(err))
            continue
        if key in values and values[key] != value:
            other = next(n for n in raw if n != name and ALIASES.get(n, n) == key)
            problems.append(f"{other}={values[key]!r} and {name}={value!r} are two names for one key ({key}): keep one")
        values[key] = value
    if len(problems) == 1:
        raise ConfigError(f"{path}: {problems[0]}")
    if problems:
        raise ConfigError(f"{path} has {len(problems)} problems: " + "; ".join(
            f"({i}) {p}" for i, p in enumerate(problems, 1)))
    return ConfigFile(values, notes, launch)


def render_config_file(config: dict[str, Any], header: str) -> str:
    """A seed-style config file (`args = EasyDict()`), grouped as in schema.KEYS, with help."""
    lines = [f'"""{header}"""', "", "from easydict import EasyDict", "", "args = EasyDict()"]
    for name, key in KEYS.items():
        lines.append(f"args.{name} = {config[name]!r}  # {key.help}")
    return "\n".join(lines) + "\n"


def read_rendered_config(path: str | Path) -> dict[str, Any]:
    """Read back a config file written by `render_config_file` (the trainer's input)."""
    values = load_config_file(path).values
    missing = [k for k in KEYS if k not in values]
    if missing:
        raise ConfigError(f"config file {path} lacks keys {', '.join(missing[:5])}: "
                          f"regenerate it with taehv-launch --dry-run or run through taehv-launch")
    return values
