#!/usr/bin/env python3
"""Rewrite the absolute paths of the machine a run was made on as placeholders, so that evidence
files (docs/evidence/) say what ran, not where: tests/test_docs.py refuses machine paths in docs/.

    python3 scripts/scrub_paths.py PATH...    files, or folders (every file under them), in place
    python3 scripts/scrub_paths.py -          stdin to stdout (console output pasted into the docs)
    import scrub_paths; scrub_paths.scrub_stdio()   in a script: what it prints from then on

Placeholders: <repo> the checkout, <out> the evidence folder ($OUT), <python> the Python install
(its prefix, or whatever folder holds lib/python3.X), ~ the home folder, <tmp> the temporary folder,
<driver> the NVIDIA driver's libraries. The fixed rules name where this project's evidence was made
(the GPU machine's checkout, $OUT, torch venv and driver folder), so that files copied from there
are rewritten the same anywhere. Text files are rewritten as text; a pickle (the NCCL flight
recorder's dumps) string by string, loaded without importing anything; other binary files are left
alone. Standard library only: the evidence scripts (scripts/gpu_*.sh, survive_overhead.sh) run it
on $OUT when they exit.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# where this project's evidence was made: the GPU machine's checkout, $OUT, torch venv and driver libraries
FIXED = {"/work/main": "<repo>", "/root/out": "<out>", "/opt/torch/.venv": "<python>", "/usr/local/nvidia": "<driver>"}
# after the literal folders: any absolute path of these shapes (not one inside a relative path or URL)
START = r"(?<![\w.~<>$}-])(?<!:/)"
PATTERNS = [
    (re.compile(START + r"(?:/[\w.+-]+)+?(?=/lib/python3\.\d+/)"), "<python>"),
    (re.compile(START + r"/(?:root|home/[\w.-]+|Users/[\w.-]+)(?=/)"), "~"),
    (re.compile(START + r"/(?:private/)?var/folders/[\w.+-]+/[\w.+-]+/T(?=/)"), "<tmp>"),
    (re.compile(START + r"/(?:private/)?(?:var/)?tmp(?=/)"), "<tmp>"),
]


def literal_rules() -> list[tuple[str, str]]:
    """(folder, placeholder) of this machine and the fixed ones, the longest folder first."""
    rules = dict(FIXED)
    if os.environ.get("OUT", "").startswith("/"):
        rules[os.environ["OUT"].rstrip("/")] = "<out>"
    rules[str(REPO)] = "<repo>"
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        if prefix not in ("/usr", "/usr/local", "/opt/homebrew"):  # a venv or a Python of its own
            rules[prefix] = "<python>"
    home = os.path.expanduser("~")
    if home.count("/") > 1:
        rules[home] = "~"
    rules[tempfile.gettempdir()] = "<tmp>"
    return sorted(((k, v) for k, v in rules.items() if k.startswith("/") and len(k) > 1), key=lambda r: -len(r[0]))


RULES = literal_rules()


def scrub(text: str) -> str:
    for folder, placeholder in RULES:
        text = re.sub(START + re.escape(folder) + r"(?![\w.+-])", placeholder, text)
    for pattern, placeholder in PATTERNS:
        text = pattern.sub(placeholder, text)
    return text


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):  # plain data only: nothing is imported or called
        raise pickle.UnpicklingError(f"not plain data: {module}.{name}")


def _deep(value):
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {_deep(k): _deep(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_deep(v) for v in value)
    return value


def scrub_bytes(data: bytes) -> bytes:
    if data[:1] == b"\x80":
        try:
            obj = _PlainUnpickler(io.BytesIO(data)).load()
        except Exception:
            return data
        return pickle.dumps(_deep(obj), protocol=data[1])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data
    return scrub(text).encode("utf-8")


def scrub_file(path: str | Path) -> bool:
    path = Path(path)
    data = path.read_bytes()
    new = scrub_bytes(data)
    if new != data:
        path.write_bytes(new)
    return new != data


class _Scrubbed:
    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(scrub(text))

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def scrub_stdio() -> None:
    """Scrub what this process prints from now on (Python's own writes; a library's C code writes past it)."""
    sys.stdout, sys.stderr = _Scrubbed(sys.stdout), _Scrubbed(sys.stderr)


def main(args: list[str]) -> int:
    if args == ["-"]:
        sys.stdout.write(scrub(sys.stdin.read()))
        return 0
    if not args:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    changed = 0
    for arg in args:
        root = Path(arg)
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        changed += sum(scrub_file(p) for p in files if not p.is_symlink())
    print(f"scrub_paths: {changed} file(s) rewritten", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
