"""`taehv-launch keys`: every training-config key with its type, default and meaning."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from ..plan.schema import ALIASES, KEYS
from .core import app, exit_with


@app.command("keys", help="List every training-config key with its type, default and meaning.")
def keys_cmd(
    as_json: Annotated[
        bool, typer.Option("--json", help="the schema as JSON: name, type, default, help, choices, aliases")
    ] = False,
) -> None:
    exit_with(lambda: list_keys(as_json))


def list_keys(as_json: bool = False) -> int:
    if as_json:
        aliases = {}
        for alias, name in ALIASES.items():
            aliases.setdefault(name, []).append(alias)
        sys.stdout.write(
            json.dumps(
                [
                    {
                        "name": name,
                        "type": key.type.__name__,
                        "default": list(key.default) if isinstance(key.default, tuple) else key.default,
                        "help": key.help,
                        "choices": list(key.choices),
                        "aliases": aliases.get(name, []),
                    }
                    for name, key in KEYS.items()
                ],
                indent=2,
            )
            + "\n"
        )
        return 0
    width = max(map(len, KEYS))
    for name, key in KEYS.items():
        choices = f" [{', '.join(map(str, key.choices))}]" if key.choices else ""
        print(f"{name:<{width}}  {key.type.__name__:<5}  {key.default!r:<22} {key.help}{choices}")
    return 0
