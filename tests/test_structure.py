"""The package's shape (issue #24): packages import downward only, in the layers written once below;
no package-level circle (lazy imports inside functions count); no module grows past 400 lines; the
CLI's import path stays free of heavy libraries. Each failure names the file, the line and the rule."""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from conftest import clean_env

PKG = Path(__file__).resolve().parents[1] / "src" / "taehv_launch"
MAX_LINES = 400
HEAVY = ("torch", "accelerate", "deepspeed", "diffusers", "cv2")

# The layers, lowest first. A package may import from itself and from lower layers only: never upward,
# never from another package of its own layer. "__init__" is taehv_launch/__init__.py. errors sits below
# the rest of the ground (files, compat, yamltext raise its exceptions).
LAYERS = [
    ("errors", {"__init__", "errors"}),
    ("base", {"files", "compat", "yamltext"}),
    ("formats", {"rundir", "dataindex"}),  # what the launcher and the trainer share on disk; the index
    ("plan", {"plan"}),  # pure resolution
    # the launcher edge (writes the run directory, sends signals); the trainer; the read-only watch
    # (status, diff): three sides of the run directory, none importing another
    ("edges", {"run", "train", "watch"}),
    ("cluster", {"cluster"}),  # sbatch / k8s rendering (uses run)
    ("tools", {"preflight", "bench", "quality"}),
    ("top", {"cli", "gen"}),  # one module per command; docs/example generators
]
LAYER = {pkg: i for i, (_, pkgs) in enumerate(LAYERS) for pkg in pkgs}


@dataclass(frozen=True)
class Edge:
    """One import written in a package module: where, what it reaches, and whether inside a function."""

    path: Path
    line: int
    target: str  # absolute module name (taehv_launch.run.launch) or a heavy library (torch.nn)
    lazy: bool

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(PKG.parent.parent)}:{self.line}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str:
    """taehv_launch.run.launch -> run; taehv_launch.errors -> errors; taehv_launch -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def walk(tree: ast.AST, lazy: bool = False):
    """(node, inside a function?) for every node."""
    for child in ast.iter_child_nodes(tree):
        yield child, lazy
        yield from walk(child, lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))


def imports(path: Path, source: str | None = None) -> list[Edge]:
    """Every import written in `path` (module level and inside functions, relative and absolute) that
    reaches taehv_launch, plus the heavy libraries, as Edges to absolute module names."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    top_level = {p.stem for p in PKG.glob("*.py")} | {p.name for p in PKG.iterdir() if p.is_dir()}
    known = set(modules())
    edges = []
    for node, lazy in walk(ast.parse(source if source is not None else path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from taehv_launch import cli` reaches taehv_launch.cli; `from .run import launch` reaches
            # taehv_launch.run.launch; `from .run.launch import main` reaches taehv_launch.run.launch
            targets = [
                f"{mod}.{a.name}"
                if f"{mod}.{a.name}" in known or (mod == "taehv_launch" and a.name in top_level)
                else mod
                for a in node.names
            ]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            targets = [str(node.args[0].value)]
        else:
            continue
        for t in dict.fromkeys(targets):
            if t == "taehv_launch" or t.startswith("taehv_launch.") or t.split(".")[0] in HEAVY:
                edges.append(Edge(path, node.lineno, t, lazy))
    return edges


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def layer_violations(files: dict[str, Path] | None = None, sources: dict[Path, str] | None = None) -> list[str]:
    """One line per import that breaks the layering: file:line, the rule, and the two packages."""
    files, sources = files or modules(), sources or {}
    bad = []
    for mod, path in files.items():
        src = package_of(mod)
        if src not in LAYER:
            bad.append(
                f"{path.relative_to(PKG.parent.parent)}:1: package {src!r} is in no layer "
                f"(move it into one of {sorted(LAYER)}, or add it to LAYERS in tests/test_structure.py)"
            )
            continue
        seen = set()
        for e in imports(path, sources.get(path)):
            if e.target.split(".")[0] in HEAVY:
                continue
            dst = package_of(e.target)
            if dst == src or dst not in LAYER or (e.line, dst) in seen:
                continue
            seen.add((e.line, dst))
            how = "lazy import" if e.lazy else "import"
            if LAYER[dst] > LAYER[src]:
                bad.append(
                    f"{e.where}: upward {how}: {src} imports {e.target} (layer {LAYERS[LAYER[src]][0]!r} "
                    f"below {LAYERS[LAYER[dst]][0]!r}); a package may import only from lower layers"
                )
            elif LAYER[dst] == LAYER[src]:
                bad.append(
                    f"{e.where}: same-layer {how}: {src} imports {e.target}; {src} and {dst} share layer "
                    f"{LAYERS[LAYER[src]][0]!r} and must not import each other"
                )
    return bad


def package_graph(files: dict[str, Path] | None = None) -> dict[str, dict[str, Edge]]:
    """package -> {imported package: the first import that makes the edge}."""
    g: dict[str, dict[str, Edge]] = {}
    for mod, path in (files or modules()).items():
        src = package_of(mod)
        g.setdefault(src, {})
        for e in imports(path):
            if e.target.split(".")[0] not in HEAVY and (dst := package_of(e.target)) != src:
                g[src].setdefault(dst, e)
    return g


def find_cycle(g: dict[str, set[str]] | dict[str, dict]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in sorted(g.get(m, ())):
            if state.get(t) == 1:
                return stack[stack.index(t) :] + [t]
            if t not in state and (c := visit(t)):
                return c
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if m not in state and (c := visit(m)):
            return c
    return None


def test_every_import_goes_down_the_layers():
    bad = layer_violations()
    assert not bad, f"{len(bad)} imports break the layering:\n" + "\n".join(bad)


def test_the_package_graph_has_no_circle():
    g = package_graph()
    cycle = find_cycle(g)
    assert cycle is None, (
        "package circle: "
        + " -> ".join(cycle)
        + "\n"
        + "\n".join(f"  {a} -> {b} at {g[a][b].where}" for a, b in zip(cycle, cycle[1:]))
    )


def child_of(module: str, parent: str) -> str | None:
    """The direct child of package `parent` that holds `module` (taehv_launch.train.loop.guard under
    taehv_launch.train -> taehv_launch.train.loop), or None when the module lies outside it."""
    if not module.startswith(parent + "."):
        return None
    return parent + "." + module[len(parent) + 1 :].split(".")[0]


def child_graph(parent: str, files: dict[str, Path], sources: dict[Path, str] | None = None) -> dict[str, dict]:
    """Inside package `parent`: child (subpackage or module) -> {child it imports: the first import}."""
    g: dict[str, dict[str, Edge]] = {}
    for mod, path in files.items():
        src = child_of(mod, parent)
        if src is None:
            continue
        g.setdefault(src, {})
        for e in imports(path, (sources or {}).get(path)):
            dst = child_of(e.target, parent)
            if dst is not None and dst != src and dst in files:
                g[src].setdefault(dst, e)
    return g


def nested_cycles(files: dict[str, Path] | None = None, sources: dict[Path, str] | None = None) -> list[str]:
    """One line per package (at any depth below taehv_launch) whose children import each other in a
    circle: the circle and the import that makes each edge."""
    files = files or modules()
    packages = sorted({m for m, p in files.items() if p.name == "__init__.py" and m != "taehv_launch"})
    bad = []
    for parent in packages:
        g = child_graph(parent, files, sources)
        cycle = find_cycle(g)
        if cycle:
            hops = "; ".join(f"{a} -> {b} at {g[a][b].where}" for a, b in zip(cycle, cycle[1:]))
            bad.append(f"circle inside {parent}: {' -> '.join(cycle)} ({hops})")
    return bad


def test_no_package_has_a_circle_between_its_children():
    """Every level, not only the top: train/'s stages (data, reference, model, loop, durability) and
    the modules beside them must not import each other in a circle (issue #40)."""
    bad = nested_cycles()
    assert not bad, "\n".join(bad)


def test_a_circle_inside_a_package_is_caught():
    files = modules()
    data = PKG / "train" / "data" / "cached.py"
    loop = PKG / "train" / "loop" / "build.py"
    sources = {
        data: data.read_text() + "\ndef _injected():\n    from ..loop import build\n",  # data -> loop
        loop: loop.read_text(),  # loop -> data already
    }
    bad = nested_cycles(files, sources)
    assert any(b.startswith("circle inside taehv_launch.train: ") and "taehv_launch.train.data" in b for b in bad), bad


def test_the_module_graph_has_no_circle():
    files = modules()
    # an empty package __init__ is not an edge worth following
    g = {
        m: {
            e.target
            for e in imports(p)
            if e.target in files
            and e.target != m
            and (files[e.target].name != "__init__.py" or files[e.target].read_text().strip())
        }
        for m, p in files.items()
    }
    cycle = find_cycle(g)
    assert cycle is None, "module circle: " + " -> ".join(cycle)


def test_no_module_is_too_long():
    long = [
        f"{p.relative_to(PKG.parent.parent)}:{n}: {n} lines, over the limit of {MAX_LINES}; split it"
        for p in sorted(PKG.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    ]
    assert not long, "\n".join(long)


# What the CLI loads to plan, render and dry-run (the ~0.2 s path): these modules and what they import.
CLI_PATH = ("cli", "plan", "cluster", "run.render", "run.runs")


def cli_import_path() -> dict[str, list[str]]:
    """Modules imported at module level from the CLI_PATH modules, each with the chain that reaches it."""
    files = modules()
    eager = {m: [e.target for e in imports(p) if not e.lazy] for m, p in files.items()}
    roots = [m for m in files if any(m == f"taehv_launch.{r}" or m.startswith(f"taehv_launch.{r}.") for r in CLI_PATH)]
    assert "taehv_launch.cli" in roots and "taehv_launch.plan.resolve" in roots, roots
    chains = {m: [m] for m in roots}
    todo = list(roots)
    while todo:
        m = todo.pop()
        reached = [t for t in eager.get(m, []) if t in files]
        parts = m.split(".")
        reached += [".".join(parts[:i]) for i in range(1, len(parts))]  # importing a.b.c runs a and a.b
        for t in reached:
            if t not in chains:
                chains[t] = chains[m] + [t]
                todo.append(t)
    return chains


def test_the_cli_import_path_imports_nothing_heavy():
    """Static: no module on the CLI's import path imports a heavy library at module level."""
    files, bad = modules(), []
    for m, chain in sorted(cli_import_path().items()):
        for e in imports(files[m]):
            if not e.lazy and e.target.split(".")[0] in HEAVY:
                bad.append(
                    f"{e.where}: heavy import on the CLI path: {e.target} at module level "
                    f"(reached by {' -> '.join(chain)}); import it inside the function that needs it"
                )
    assert not bad, "\n".join(bad)


def test_a_dry_run_loads_nothing_heavy():
    """Dynamic: a real dry run (lazy imports included) leaves no heavy library in sys.modules."""
    code = (
        "import sys; sys.argv = ['taehv-launch', '16', 'h100', '--dry-run', '--json']\n"
        "from taehv_launch.cli import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        f"print('HEAVY', [m for m in {HEAVY!r} if m in sys.modules], code, file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=120)
    line = [l for l in proc.stderr.splitlines() if l.startswith("HEAVY ")]
    assert line, proc.stderr
    assert line[-1] == "HEAVY [] 0", f"the dry run loaded heavy libraries (or failed): {line[-1]}\n{proc.stderr}"


# --- the checks can fail: each rule fires on a small made-up case -------------------------------------


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_an_upward_and_a_sideways_import_are_caught():
    plan = PKG / "plan" / "resolve.py"
    run = PKG / "run" / "render.py"
    sources = {
        plan: "def f():\n    from ..run import launch\n",  # upward, lazy, relative
        run: "import os\nfrom taehv_launch.train import main\n",
    }  # same layer, absolute
    bad = layer_violations({module_name(plan): plan, module_name(run): run}, sources)
    assert len(bad) == 2, bad
    assert bad[0].startswith("src/taehv_launch/plan/resolve.py:2: upward lazy import: plan imports taehv_launch.run")
    assert bad[1].startswith("src/taehv_launch/run/render.py:2: same-layer import: run imports taehv_launch.train")


def test_the_watch_and_the_launcher_do_not_import_each_other():
    """watch/ (status, diff) reads run directories through rundir/; run/ writes them: neither imports the other."""
    watch = PKG / "watch" / "diff.py"
    run = PKG / "run" / "launch.py"
    sources = {watch: "def f():\n    from ..run.request import build_plan\n", run: "from ..watch import status\n"}
    bad = layer_violations({module_name(watch): watch, module_name(run): run}, sources)
    assert [b.split(": ", 2)[1] for b in bad] == ["same-layer lazy import", "same-layer import"], bad
    assert "watch imports taehv_launch.run.request" in bad[0] and "run imports taehv_launch.watch" in bad[1], bad


# --- rules that are not about the graph -----------------------------------------------------------------

# Library internals only in compat.py: tests/test_compat_rule.py reads the code's syntax tree.


def test_errors_are_in_the_family():
    """The package raises no bare ValueError/RuntimeError for users to read: UserError subclasses
    (errors.py) or assertions for our own bugs."""
    bare = {
        str(p.relative_to(PKG)): n
        for p in PKG.rglob("*.py")
        if (n := len([l for l in p.read_text().splitlines() if "raise RuntimeError(" in l or "raise ValueError(" in l]))
    }
    assert not bare, bare


FAULTS = PKG / "train" / "faults.py"  # the one module that reads the tests' fault-injection variables
FAULT_PREFIX = "TAEHV_LAUNCH_" + "TEST_"


def fault_hooks_outside(sources: dict[Path, str] | None = None) -> list[str]:
    """file:line for each mention of a TAEHV_LAUNCH_TEST_* variable in a product module other than faults.py."""
    sources = sources or {p: p.read_text() for p in sorted(PKG.rglob("*.py"))}
    return [
        f"{p.relative_to(PKG.parent.parent)}:{i}: {FAULT_PREFIX}* outside train/faults.py; add a named hook there"
        for p, text in sources.items()
        if p != FAULTS
        for i, line in enumerate(text.splitlines(), 1)
        if FAULT_PREFIX in line
    ]


def test_fault_injection_lives_only_in_the_faults_module():
    """Issue #40: the tests' faults are switched on through train/faults.py's hooks, never read elsewhere."""
    assert FAULTS.exists() and FAULT_PREFIX in FAULTS.read_text()
    bad = fault_hooks_outside()
    assert not bad, "\n".join(bad)
    guard = PKG / "train" / "loop" / "guard.py"
    injected = {guard: guard.read_text() + f'\nX = os.environ.get("{FAULT_PREFIX}X")\n', FAULTS: FAULTS.read_text()}
    assert [b.split(": ")[0] for b in fault_hooks_outside(injected)] == [
        f"src/taehv_launch/train/loop/guard.py:{len(injected[guard].splitlines())}"
    ]
