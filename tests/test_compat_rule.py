"""Library internals only in compat.py, read from the code's syntax tree (issue #40).

A name with a leading underscore (`_x`, `__x`, not a dunder such as `__name__`) on a third-party module
or object is a library's private internal: it may move in any release. Outside src/taehv_launch/compat.py
the package may not
- import one (`import torch._C`, `from torch.utils.data import _utils`, `from torch._C import x`);
- read, write or call one as an attribute (`loader._iterator`, `torch._dynamo.x`, `super()._get_iterator()`),
  also through getattr/setattr/hasattr/delattr with the name as a string;
- patch a library at run time (unittest.mock), or adjust accelerate's step counter (`x.step -= 1`).

Which object is third-party? An import alias is known: torch, accelerate, numpy... are; the package's own
modules (relative or `taehv_launch`) and the standard library (`os._exit`) are not. Any other object
(`self.loader`, a local, a call's result) is judged by the name: a private name that the package defines
nowhere itself (no `def _x`, `class _x`, `_x = ...`, `self._x = ...`) is a library's. Each failure names
file:line and the expression.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "taehv_launch"
ROOT = PKG.parent.parent
ALLOWED_FILE = "compat.py"
ACCESSORS = {"getattr", "setattr", "hasattr", "delattr"}
# Underscore names that are the standard library's public API on objects whose type the walk cannot see.
PUBLIC_UNDERSCORE = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__")) and name != "_"


def origin(module: str) -> str:
    """'own', 'stdlib' or 'third' for an absolute module name."""
    top = module.split(".")[0]
    if top == "taehv_launch":
        return "own"
    if top in sys.stdlib_module_names or top == "__future__":
        return "stdlib"
    return "third"


def absolute(node: ast.ImportFrom, module_path: str) -> str:
    """The absolute module an ImportFrom reads from (relative imports resolved inside the package)."""
    if not node.level:
        return node.module or ""
    parts = module_path.split(".")[: -node.level]
    return ".".join(parts + ([node.module] if node.module else []))


def defined_names(sources: dict[str, ast.AST]) -> set[str]:
    """Private names the package defines itself (functions, classes, variables, attributes of self)."""
    names: set[str] = set()
    for tree in sources.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    names.add(node.attr)  # not `loader._iterator = None`: that writes a library's internal
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return {n for n in names if private(n)}


class Visitor(ast.NodeVisitor):
    def __init__(self, rel: str, module_path: str, own: set[str]):
        self.rel, self.module_path, self.own = rel, module_path, own
        self.aliases: dict[str, str] = {}  # local name -> "own" | "stdlib" | "third"
        self.classes: list[list[str]] = []  # the enclosing classes' base origins
        self.bad: list[str] = []

    def fail(self, node: ast.AST, what: str) -> None:
        self.bad.append(f"{self.rel}:{node.lineno}: {what}")

    # imports ---------------------------------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            kind = origin(a.name)
            self.aliases[a.asname or a.name.split(".")[0]] = kind
            if kind == "third" and any(private(p) for p in a.name.split(".")):
                self.fail(node, f"import of a library internal: import {a.name}")
            if a.name.startswith("unittest.mock"):
                self.fail(node, "run-time patching (unittest.mock) outside compat.py")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = absolute(node, self.module_path)
        kind = origin(module)
        for a in node.names:
            self.aliases[a.asname or a.name] = kind
            if kind == "third" and (private(a.name) or any(private(p) for p in module.split("."))):
                self.fail(node, f"import of a library internal: from {module} import {a.name}")
            if module == "unittest.mock" or (module == "unittest" and a.name == "mock"):
                self.fail(node, "run-time patching (unittest.mock) outside compat.py")

    # classes (super() reaches the bases) ----------------------------------------------------------------
    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes.append([self.kind_of(b) for b in node.bases])
        self.generic_visit(node)
        self.classes.pop()

    # attributes -----------------------------------------------------------------------------------------
    def kind_of(self, base: ast.AST) -> str:
        """'own', 'stdlib', 'third' or 'unknown' for the object an attribute is read from."""
        if isinstance(base, ast.Name):
            if base.id in ("self", "cls"):
                return "own"
            return self.aliases.get(base.id, "unknown")
        if isinstance(base, ast.Attribute):
            root = base
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in self.aliases:
                return self.aliases[root.id]  # torch.utils.data, os.path: the module's origin
            return "unknown"  # self.loader, f().x: an object
        if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
            bases = self.classes[-1] if self.classes else []
            return "third" if "third" in bases else ("unknown" if "unknown" in bases else "own")
        return "unknown"

    def check(self, node: ast.AST, base: ast.AST, name: str, text: str) -> None:
        if not private(name) or name in PUBLIC_UNDERSCORE:
            return
        kind = self.kind_of(base)
        if kind == "third" or (kind == "unknown" and name not in self.own):
            self.fail(node, f"library internal `{text}`: move it into compat.py behind a named function")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.check(node, node.value, node.attr, ast.unparse(node))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Name) and f.id in ACCESSORS and len(node.args) >= 2:
            name = node.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                self.check(node, node.args[0], name.value, f"{f.id}({ast.unparse(node.args[0])}, {name.value!r})")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        t = node.target
        if (
            isinstance(node.op, ast.Sub)
            and isinstance(t, ast.Attribute)
            and t.attr == "step"
            and self.kind_of(t.value) != "own"
        ):
            self.fail(node, f"adjusts a library's counter `{ast.unparse(t)}`: compat.uncount_micro_batch")
        self.generic_visit(node)


def violations(sources: dict[str, str]) -> list[str]:
    """`sources`: path relative to the repository -> text. Files named compat.py are exempt."""
    trees = {rel: ast.parse(text) for rel, text in sources.items()}
    own = defined_names(trees)
    bad: list[str] = []
    for rel, tree in trees.items():
        if Path(rel).name == ALLOWED_FILE:
            continue
        module = ".".join(Path(rel).relative_to("src").with_suffix("").parts)
        if module.endswith(".__init__"):
            module = module[: -len(".__init__")] + ".__init__"  # relative imports resolve from the package
        v = Visitor(rel, module, own)
        v.visit(tree)
        bad += v.bad
    return bad


def package_sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted(PKG.rglob("*.py"))}


def test_library_internals_are_touched_only_in_compat():
    bad = violations(package_sources())
    assert not bad, "move these uses of library internals into src/taehv_launch/compat.py:\n" + "\n".join(bad)


def test_the_rule_fires_on_each_form():
    """Every form the rule names, in a file outside compat.py, with its file:line; the same text in
    compat.py, and the package's own or the standard library's underscore names, pass."""
    bad_src = "\n".join(
        [
            "import os",  # 1
            "import torch",
            "import torch._dynamo",  # 3
            "from torch.utils.data import DataLoader, _utils",  # 4
            "from torch._C import _dump",  # 5
            "from unittest import mock",  # 6
            "from ..durability import stop",
            "def f(loader, acc, model):",
            "    it = getattr(loader, '_iterator', None)",  # 9
            "    it._shutdown_workers()",  # 10
            "    torch._C._nothing()",  # 11
            "    acc.step -= 1",  # 12 (x.step += 1 on our own state is fine)
            "    model._orig_mod.x = 1",  # 13
            "    stop._handle(1, None)",  # our own module: fine
            "    os._exit(0)",  # the standard library: fine
            "    return self_x._mine",  # defined below: the package's own name
            "class L(DataLoader):",
            "    _mine = 1",
            "    def __iter__(self):",
            "        return super()._get_iterator()",  # 20
        ]
    )
    sources = {
        "src/taehv_launch/train/loop/x.py": bad_src,
        "src/taehv_launch/compat.py": bad_src,
    }
    got = violations(sources)
    lines = sorted(int(b.split(":")[1]) for b in got)
    assert lines == [3, 4, 5, 6, 9, 10, 11, 11, 12, 13, 20], got
    assert all(b.startswith("src/taehv_launch/train/loop/x.py:") for b in got)
    assert any("`it._shutdown_workers`" in b for b in got)
    assert any("getattr(loader, '_iterator')" in b for b in got)
