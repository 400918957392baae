"""Config files and `--set` overrides: parse, type-check against schema.KEYS, explain mistakes.

Config files are Python (seed style: `args = EasyDict(); args.learning_rate = 1e-4`, or
plain assignments `learning_rate = 1e-4`). They are executed, so only run files you trust;
`--set` values are parsed with `ast.literal_eval` and never executed. In a plain-assignment
file every top-level name is a key, except helpers: names that start with _ or have no
lower-case letter, and modules, functions and classes; so a misspelt key is an error, not ignored.
"""

from __future__ import annotations

import ast
import difflib
import math
import runpy
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
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
    "tracker_name": "use trackers=... (comma-separated: tensorboard, wandb, mlflow, swanlab; TensorBoard under <run>/logs by default)",
    "report_to": "use trackers=... (comma-separated: tensorboard, wandb, mlflow, swanlab; TensorBoard under <run>/logs by default)",
    "resume_from_checkpoint": "use --resume PATH or --resume auto",
    "use_zero3_save": "ZeRO-3 exports are gathered automatically",
    "zero3_save_16bit_model": "exports gather the full weights under every ZeRO stage (fp32 safetensors + .pth)",
    "deepspeed_config_file": "the DeepSpeed config is rendered into <run>/deepspeed.json when zero_stage > 0 (every "
    "row runs plain DDP, measured fastest for this model: docs/benchmarks.md); set "
    "zero_stage / bucket_size_mb instead",
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
        raise ConfigError(
            f"unknown config key {name!r}{where}{suggest(name, KEYS)}; `taehv-launch keys` lists them all"
        )
    key = KEYS[name]
    ok = isinstance(value, key.type) and not (key.type is int and isinstance(value, bool))
    if key.type is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if key.type is tuple and isinstance(value, list):
        value, ok = tuple(value), True
    if not ok:
        hint = (
            f": write {name}={str(value).lower() in ('true', 'yes', 'on', '1')} (Python's True or False)"
            if key.type is bool and isinstance(value, str)
            else ""
        )
        raise ConfigError(f"{name} must be {key.type.__name__}, got {type(value).__name__} {value!r}{where}{hint}")
    if key.choices and value not in key.choices:
        raise ConfigError(f"{name}={value!r}{where} is not one of {', '.join(map(str, key.choices))}")
    if any(isinstance(v, float) and not math.isfinite(v) for v in (value if isinstance(value, tuple) else (value,))):
        raise ConfigError(  # 1e400 parses as inf: no key means it, and config.py could not read it back
            f"{name}={value!r}{where} holds a number that is not finite: give finite numbers"
            if isinstance(value, tuple)
            else f"{name}={value!r}{where} is not a finite number: give one such as its default {key.default!r}"
        )
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
    values: dict[str, Any]  # checked training-config keys
    notes: list[str]  # seed keys ignored, each with what to use instead
    launch: dict[str, int]  # seed launch options: master_port, world_size (checked against GPUS)


def load_config_file(path: str | Path) -> ConfigFile:
    """Execute a Python config file; every unknown key or bad value is reported at once, in one message."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} not found: pass an existing .py file to --config")
    try:
        namespace = runpy.run_path(str(path))
    except (Exception, SystemExit) as exc:  # the user's own code failed (or called exit()): report it in one line
        detail = " ".join(str(exc).split())
        raise ConfigError(
            f"config file {path} failed to run: {type(exc).__name__}" + (f": {detail}" if detail else "")
        ) from None
    raw, problems, helper_hint = _file_keys(namespace)
    values: dict[str, Any] = {}
    notes, launch = [], {}
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
            key, value = ALIASES.get(name, name), check_value(name, value, None)  # the message names the file
        except ConfigError as err:
            problems.append(str(err))
            continue
        if key in values and values[key] != value:
            other = next(n for n in raw if n != name and ALIASES.get(n, n) == key)
            problems.append(f"{other}={values[key]!r} and {name}={value!r} are two names for one key ({key}): keep one")
        values[key] = value
    hint = f"; {HELPER_HINT} (_{helper_hint} = ...)" if helper_hint else ""
    if len(problems) == 1:
        raise ConfigError(f"{path}: {problems[0]}{hint}")
    if problems:
        raise ConfigError(
            f"{path} has {len(problems)} problems: " + "; ".join(f"({i}) {p}" for i, p in enumerate(problems, 1)) + hint
        )
    return ConfigFile(values, notes, launch)


HELPER_HINT = "`taehv-launch keys` lists the keys; start the name of a helper variable of your own with _"


def _known(name: str) -> bool:
    return name in KEYS or name in ALIASES or name in SEED_ONLY_KEYS or name in LAUNCH_KEYS


def _is_helper(name: str, value: Any) -> bool:
    """Not a key in a plain-assignment file: private names (`_base`), constants (`BASE`, no lower-case
    letter), and modules, functions and classes (`import os`, `def f`, `from math import sqrt`)."""
    return name.startswith("_") or name == name.upper() or isinstance(value, (ModuleType, type)) or callable(value)


def _file_keys(namespace: dict[str, Any]) -> tuple[dict[str, Any], list[str], str]:
    """(the file's keys and values, problems found, the unknown name HELPER_HINT shows, or "").

    Seed style (`args = EasyDict()` or any dict named args): the keys are args' items; a top-level
    name that is a key but not set in args is a mistake (`learning_rate = 1e-4` beside `args`).
    Plain style: every top-level name except helpers (_is_helper) is a key, so a typo is an error."""
    args = namespace.get("args")
    if isinstance(args, dict):  # EasyDict is a dict
        stray = [
            k for k, v in namespace.items() if k != "args" and _known(k) and not _is_helper(k, v) and k not in args
        ]
        return (
            dict(args),
            [
                f"{k} = {namespace[k]!r} is a plain name but this file sets its keys on args: write args.{k} = ..."
                for k in stray
            ],
            "",
        )
    problems = []
    if "args" in namespace and not _is_helper("args", args):
        problems.append(
            f"args is a {type(args).__name__}: make it `args = EasyDict()` (or a dict), or write "
            f"plain assignments (learning_rate = 1e-4)"
        )
    raw = {k: v for k, v in namespace.items() if k != "args" and not _is_helper(k, v)}
    unknown = [k for k in raw if not _known(k)]
    problems += [f"unknown config key {k!r}{suggest(k, KEYS)}" for k in unknown]
    problems += [
        f"{k} is upper case, so it is read as a constant of your own: keys are lower case ({k.lower()})"
        for k in namespace
        if k == k.upper() and k != k.lower() and _known(k.lower())
    ]
    return {k: v for k, v in raw.items() if k not in unknown}, problems, (unknown[0] if unknown else "")


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
        raise ConfigError(
            f"config file {path} lacks keys {', '.join(missing[:5])}: "
            f"regenerate it with taehv-launch --dry-run or run through taehv-launch"
        )
    return values


CONFIG_TEXT_LIMIT = 1 << 20  # bytes: a rendered config.py is about 9 KB


def read_config_literals(path: str | Path) -> dict[str, Any]:
    """The literal assignments of a config file, read with `ast`, never executed: `args.key = <literal>`
    (render_config_file's form) and `key = <literal>`. For read-only commands that look into another
    person's run directory (`taehv-launch diff`); `--config` files are still executed (load_config_file).
    Anything else (imports, `args = EasyDict()`, a value that is not a literal) is passed over, and the
    values are not checked against the keys. OSError: missing or unreadable; ConfigError: not a regular
    file, too large, or not Python."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path} is not a regular file")
    with open(path, "rb") as f:
        data = f.read(CONFIG_TEXT_LIMIT + 1)
    if len(data) > CONFIG_TEXT_LIMIT:
        raise ConfigError(f"{path} is larger than a config file ever is ({CONFIG_TEXT_LIMIT} bytes)")
    try:
        tree = ast.parse(data.decode(errors="replace"), str(path))
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ConfigError(f"{path} is not a Python config file ({type(exc).__name__})") from None
    out: dict[str, Any] = {}
    for node in tree.body:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "args":
            name = target.attr
        elif isinstance(target, ast.Name) and target.id != "args":
            name = target.id
        else:
            continue
        try:
            out[name] = ast.literal_eval(node.value)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            continue
    return out
