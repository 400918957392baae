"""YAML text without importing PyYAML on the CLI path (the launcher's YAML and the cluster templates).

Block style for dicts and lists, JSON-quoted strings (valid YAML scalars) in which every character
that does not print (DEL, C1 controls, U+2028 and the other line breaks YAML would fold, lone
surrogates) is escaped too, so any string loads back unchanged. `plain=True` leaves
simple strings unquoted for files people read (`name: trainer`); words YAML would read as
something else (true, no, null, 1e3, ...) are always quoted.
"""

from __future__ import annotations

import json
import re
from typing import Any

_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./-]*$")
_RESERVED = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}


def scalar(value: Any, plain: bool = False) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    text = str(value)
    if plain and _PLAIN.match(text) and text.lower() not in _RESERVED:
        return text
    return _NOT_ASCII_PRINTABLE.sub(_escape, json.dumps(text, ensure_ascii=False))


_NOT_ASCII_PRINTABLE = re.compile(r"[^\x20-\x7e]")


def _escape(match: re.Match) -> str:
    char = match.group()
    if char.isprintable():
        return char
    code = ord(char)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"  # YAML's \U: one escape, no surrogate pair


def yaml_text(mapping: dict[str, Any], plain: bool = False) -> str:
    return "\n".join(_block(mapping, 0, plain)) + "\n"


def _block(value: Any, indent: int, plain: bool) -> list[str]:
    pad = " " * indent
    if isinstance(value, dict):
        lines = []
        for k, v in value.items():
            if isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}{k}:")
                lines += _block(v, indent + 2, plain)
            else:
                lines.append(f"{pad}{k}: {_inline(v, plain)}")
        return lines
    lines = []
    for item in value:
        if isinstance(item, (dict, list)) and item:
            inner = _block(item, indent + 2, plain)
            lines.append(f"{pad}- {inner[0].lstrip()}")
            lines += inner[1:]
        else:
            lines.append(f"{pad}- {_inline(item, plain)}")
    return lines


def _inline(value: Any, plain: bool) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return scalar(value, plain)
