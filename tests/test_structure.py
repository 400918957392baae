"""The package's shape: the import graph has no circle (lazy imports inside functions included),
no module grows past ~400 lines, and the CLI's import path stays free of heavy libraries."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "taehv_launch"
MAX_LINES = 420


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """Package modules that `path` imports anywhere in its body."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in modules and t != name}
    return found


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PKG.rglob("*.py")}
    mods = set(files)
    # a package's empty __init__ is not an edge worth following
    return {m: {t for t in imports(p, mods) if files[t].name != "__init__.py" or files[t].read_text().strip()}
            for m, p in files.items()}


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in sorted(g.get(m, ())):
            if state.get(t) == 1:
                return stack[stack.index(t):] + [t]
            if t not in state and (c := visit(t)):
                return c
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if m not in state and (c := visit(m)):
            return c
    return None


def test_the_import_graph_has_no_circle():
    cycle = find_cycle(graph())
    assert cycle is None, " -> ".join(cycle)


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_module_is_too_long():
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these modules (over {MAX_LINES} lines): {long}"


PRIVATE = ("_terminate_process_handler", "__compatible_ops__", "_lazy_init_hp_params_optimizer_state",
           "mock.patch", ".step -= 1", "from unittest import mock")


def test_library_internals_are_touched_only_in_compat():
    users = {str(p.relative_to(PKG)): [s for s in PRIVATE if s in p.read_text()]
             for p in PKG.rglob("*.py") if p.name != "compat.py"}
    assert not {k: v for k, v in users.items() if v}, "move these uses of library internals into compat.py"


def test_errors_are_in_the_family():
    """The package raises no bare ValueError/RuntimeError for users to read: UserError subclasses
    (errors.py) or assertions for our own bugs."""
    bare = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py")
            if (n := len([l for l in p.read_text().splitlines() if "raise RuntimeError(" in l or "raise ValueError(" in l]))}
    assert not bare, bare
