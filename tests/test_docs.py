"""Every `taehv-launch` command in the docs still works: the docs cannot drift from the code.

Commands are the lines starting with `taehv-launch ` in ```bash blocks of README.md, docs/*.md and
docs/zh/*.md (`\\` continuations joined; a trailing `# exit N` says the expected exit code, else 0):

- `render slurm|k8s ...`: rendered; the script passes `bash -n`, the YAML parses (fast).
- a GPU profile (h100, h200, a800), `cache` included: run here as `--dry-run --json`; `validate-env`
  on a GPU profile as the same plan's dry run (fast). `bench` on a GPU profile: skipped (GPU only).
- `keys`, `--help`, `--version`, any `--dry-run`: run as written (fast).
  These write nothing and run in the checkout (the docs' relative paths are relative to it).
- the `cpu` profile: run for real, as written, in a fresh folder (slow).
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import json
import re
import shlex
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from conftest import REPO, clean_env, overrides, run_cli, run_cli_here

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "docs" / "zh").glob("*.md"))]
GPU_PROFILES = {"h100", "h200", "a800"}
SUBCOMMANDS = {"run", "cache", "validate-env", "render", "bench", "keys", "eval"}
SHELL_STOP = {">", ">>", "|", "&&", ";", "&", "2>&1", "||"}
EXIT_MARK = re.compile(r"#\s*exit\s+(\d+)\s*$")


@dataclass(frozen=True)
class DocCommand:
    where: str
    args: tuple[str, ...]  # after `taehv-launch`
    code: int

    @property
    def kind(self) -> str:
        a = self.args
        if not a or a[0] in ("--help", "-h", "--version", "keys") or "--help" in a or "-h" in a:
            return "fast"
        if a[0] == "render":
            return "render"
        positional = [x for x in (a[1:] if a[0] in SUBCOMMANDS else a) if not x.startswith("-")]
        profile = next((x for x in positional if x in GPU_PROFILES | {"cpu"}), None)
        if a[0] == "eval":  # needs the reader's own weights and videos: tests/test_eval.py runs it on real files
            return "skip"
        if a[0] == "bench":  # measurements: run on CPU only (slow suite)
            return "cpu" if profile == "cpu" else "skip"
        if profile in GPU_PROFILES:
            return "gpu"
        return "fast" if "--dry-run" in a else "cpu"


def doc_commands() -> list[DocCommand]:
    found = []
    for md in DOCS:
        lang, pending, start = None, "", 0
        for n, line in enumerate(md.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                lang = None if lang is not None else (line.strip()[3:].strip() or "")
                continue
            if lang not in ("bash", "sh"):
                continue
            if not pending:
                start = n
            pending += line.rstrip()[:-1] + " " if line.rstrip().endswith("\\") else line
            if line.rstrip().endswith("\\"):
                continue
            text, pending = pending.strip().removeprefix("$ "), ""
            if not text.startswith("taehv-launch "):
                continue
            mark = EXIT_MARK.search(text)
            words = shlex.split(text, comments=True)
            cut = next((i for i, w in enumerate(words) if w in SHELL_STOP or w.startswith((">", "2>"))), len(words))
            found.append(
                DocCommand(f"{md.relative_to(REPO)}:{start}", tuple(words[1:cut]), int(mark.group(1)) if mark else 0)
            )
    return found


COMMANDS = doc_commands()


def _ids(kind: str) -> list:
    return [pytest.param(c, id=c.where) for c in COMMANDS if c.kind == kind]


def test_the_docs_have_commands_of_every_kind():
    kinds = {c.kind for c in COMMANDS}
    assert {"render", "gpu", "cpu", "fast"} <= kinds, kinds
    assert any(c.where.startswith("docs/zh/") for c in COMMANDS)


@pytest.mark.parametrize("cmd", _ids("render"))
def test_docs_render_command(cmd, tmp_path):
    proc = run_cli_here(*cmd.args, env=clean_env(), cwd=REPO)
    assert proc.returncode == cmd.code, (cmd.where, proc.stderr)
    if cmd.code:
        return
    if cmd.args[1] == "slurm":
        script = tmp_path / "job.sbatch"
        script.write_text(proc.stdout)
        subprocess.run(["bash", "-n", str(script)], check=True)
    else:
        assert [d["kind"] for d in yaml.safe_load_all(proc.stdout)] == ["Service", "Job"], cmd.where


@pytest.mark.parametrize("cmd", _ids("gpu"))
def test_docs_gpu_command_resolves(cmd, tmp_path):
    args = list(cmd.args)
    if args[0] == "validate-env":  # the plan it checks, without a GPU
        args = [a for a in args[1:] if a != "--quick"]
    args += [a for a in ("--dry-run", "--json") if a not in args]
    if args[0] != "cache" and any(a.startswith("latent_cache=") for a in args):
        args = with_stand_in_cache(args, tmp_path)
    proc = run_cli_here(*args, env=clean_env(), cwd=REPO)  # paths in the docs are relative to the checkout
    assert proc.returncode == cmd.code, (cmd.where, proc.stderr)


def with_stand_in_cache(args: list[str], tmp: Path) -> list[str]:
    """Training from a latent cache that the docs' `cache` command writes first (at a path such as
    /data/lat that does not exist here): point latent_cache at a folder holding the manifest that
    cache job would finish with for this plan (its fingerprint; no shards), so the launcher's cache
    check runs for real and the rest of the plan resolves."""
    from taehv_launch.dataindex.latentcache import MANIFEST, fingerprint

    drop = {i + d for i, a in enumerate(args) if a.startswith("latent_cache=") for d in (-1, 0)}
    plain = [a for i, a in enumerate(args) if i not in drop]  # the `--set latent_cache=...` pair
    proc = run_cli_here(*plain, env=clean_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    config = json.loads(proc.stdout)["config"]
    cache = tmp / "latents"
    cache.mkdir()
    fp = fingerprint(SimpleNamespace(**config), weights="")
    (cache / MANIFEST).write_text(json.dumps({"format": fp["format"], "fingerprint": fp, "shards": []}))
    return [f"latent_cache={cache}" if a.startswith("latent_cache=") else a for a in args]


@pytest.mark.parametrize("cmd", _ids("fast"))
def test_docs_quick_command(cmd, tmp_path):
    proc = run_cli_here(*cmd.args, env=clean_env(), cwd=REPO)
    assert proc.returncode == cmd.code, (cmd.where, proc.stdout[-2000:], proc.stderr)


@pytest.mark.slow
@pytest.mark.parametrize(
    "cmd", [pytest.param(c, id=c.where) for c in {c.args + (c.code,): c for c in COMMANDS if c.kind == "cpu"}.values()]
)
def test_docs_cpu_command_runs(cmd, tmp_path):
    proc = run_cli(*cmd.args, env=clean_env(), cwd=tmp_path, timeout=900)
    assert proc.returncode == cmd.code, (cmd.where, proc.stdout[-3000:], proc.stderr[-3000:])


# --- the common-error tables quote what the product prints ---------------------------------------
# docs/troubleshooting.md "## Common errors" and docs/zh/troubleshooting.md "## 常见错误": the first
# column quotes the start of an `error:` line. In a quote, `<word>` stands for any value and `...` for
# any text. Each quote is checked against the line the product prints when the case is triggered
# here (a dry run in this process, or a real launch that is refused), or, for the few cases that only
# a GPU or the trainer reaches, against a string literal / f-string of the source file named.

TABLES = {
    "en": (REPO / "docs" / "troubleshooting.md", "## Common errors"),
    "zh": (REPO / "docs" / "zh" / "troubleshooting.md", "## 常见错误"),
}
SRC = REPO / "src" / "taehv_launch"
PLACEHOLDER = re.compile(r"<[A-Za-z_ ]+>|\.\.\.")
CLOUD_2_NODES = {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "10.0.0.1"}


@dataclass(frozen=True)
class ErrorCase:
    key: str  # the table's quote starts with this
    args: tuple[str, ...] = ()  # `taehv-launch ARGS`; {tmp} is the test's folder
    env: tuple[tuple[str, str], ...] = ()
    launch: bool = False  # a real launch in a subprocess (refused before training), not a dry run
    hold_port: int | None = None  # listen on this port while it runs
    lock_run: str | None = None  # hold this run directory's lock (output/<name>/.lock) while it runs
    files: tuple[tuple[str, str], ...] = ()  # (path under {tmp}, text) written first
    slow: bool = False
    source: str | None = None  # not triggered here: the src file (under src/taehv_launch) that raises it


ERROR_CASES = [
    ErrorCase("12 GPUs are more than one node", ("12", "h100", "--dry-run")),
    ErrorCase("8 GPUs cannot be split over 2 nodes", ("8", "h100", "--dry-run"), tuple(CLOUD_2_NODES.items())),
    ErrorCase(
        "srun started", ("16", "h100", "--dry-run"), (("SLURM_STEP_NUM_TASKS", "16"), ("SLURM_STEP_NUM_NODES", "2"))
    ),
    ErrorCase("taehv-launch is running under torchrun", ("8", "h100", "--dry-run"), (("LOCAL_RANK", "0"),)),
    ErrorCase("a multi-node run needs one run name", ("16", "h100"), tuple(CLOUD_2_NODES.items()), launch=True),
    ErrorCase("unknown config key", ("8", "h100", "--set", "micro_batch=4", "--dry-run")),
    ErrorCase("n_frames=", ("8", "h100", "--set", "n_frames=10", "--dry-run")),
    ErrorCase("this plan will not fit in GPU memory", ("8", "h100", "--set", "micro_batch_size=64", "--dry-run")),
    ErrorCase(
        "port 29500 is in use", ("2", "cpu", "--run-name", "t", "--master-port", "29500"), launch=True, hold_port=29500
    ),
    ErrorCase("no video files", ("1", "cpu", "--set", "data_root={tmp}/empty"), launch=True),
    ErrorCase(
        "the reference VAE at",
        ("1", "cpu", "--run-name", "v", "--set", "ref_vae_path={tmp}/vae"),
        launch=True,
        files=(("vae/config.json", '{"_class_name": "AutoencoderKLCogVideoX", "latent_channels": 16}'),),
    ),
    ErrorCase("<run dir> is in use by another launch", ("1", "cpu", "--run-name", "t"), launch=True, lock_run="t"),
    # the trainer's start-up probe, after `accelerate launch` started: slow here, and checked in the source too
    ErrorCase(
        "none of the first",
        ("1", "cpu", "--run-name", "b", *overrides("data_root={tmp}/broken dataloader_num_workers=0")),
        launch=True,
        slow=True,
        files=(("broken/a.mp4", "not a video"),),
    ),
    ErrorCase("none of the first", source="train/data/clips.py"),
    # the trainer on a GPU only: on the cpu profile an empty data_root means the demo videos
    ErrorCase("data_root is empty", source="train/loop/build.py"),
    # every file unusable later in training (the probe above saw a usable one first)
    ErrorCase("no usable video among", source="train/data/clips.py"),
    # need a real complete checkpoint (tests/test_trust.py resumes one for each)
    ErrorCase("checkpoint-<n> is at step", source="run/checkpoints.py"),
    ErrorCase("checkpoint-<n> was trained against", source="run/checkpoints.py"),
]


def error_table(lang: str) -> list[str]:
    """The quotes in the first column of that page's common-error table."""
    path, heading = TABLES[lang]
    text = path.read_text()
    assert heading in text, f"{path.relative_to(REPO)} has no {heading!r} section"
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [re.match(r"\| `([^`]+)`", row).group(1) for row in rows]


def quote_regex(quote: str) -> re.Pattern:
    parts = PLACEHOLDER.split(quote)
    return re.compile(".+?".join(re.escape(p) for p in parts))


def literal_templates(path: Path) -> list[list[str | None]]:
    """Every string literal in a Python file as its parts: text, or None for an f-string's {hole}."""
    tree = ast.parse(path.read_text())
    inner = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    out: list[list[str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            out.append([v.value if isinstance(v, ast.Constant) else None for v in node.values])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inner:
            out.append([node.value])
    return out


def starts_template(parts: list[str | None], quote: str) -> bool:
    """Whether some value of the f-string `parts` starts with `quote`: the doc's placeholders and any
    concrete value (`data_root`, `8`) may stand where the source has a {hole}, never for its text."""
    if not quote:
        return True
    if not parts:
        return False
    head, rest = parts[0], parts[1:]
    if head is None:  # a hole takes some of the quote; text must follow it if more parts follow
        stop = len(quote) + 1 if not rest else len(quote)
        return any(starts_template(rest, quote[k:]) for k in range(1, stop))
    n = min(len(head), len(quote))
    return quote[:n] == head[:n] and (n < len(head) or starts_template(rest, quote[n:]))


_triggered: dict[ErrorCase, str] = {}


def trigger(case: ErrorCase, tmp: Path) -> str:
    """The one `error:` line (without the prefix) that the case prints, with exit code 2."""
    if case in _triggered:
        return _triggered[case]
    (tmp / "empty").mkdir(exist_ok=True)
    for rel, text in case.files:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    args = [a.replace("{tmp}", str(tmp)) for a in case.args]
    env = clean_env(TAEHV_CACHE=str(tmp.parent / "taehv-cache"), OMP_NUM_THREADS="1", **dict(case.env))
    with socket.socket() as holder, contextlib.ExitStack() as stack:
        if case.lock_run is not None:  # what a live launch of that run holds (run/lock.py)
            (tmp / "output" / case.lock_run).mkdir(parents=True)
            lock = stack.enter_context(open(tmp / "output" / case.lock_run / ".lock", "w"))
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if case.hold_port is not None:
            try:  # SO_REUSEPORT: the English and Chinese tables' cases, on two xdist workers, hold it together
                holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                holder.bind(("", case.hold_port))
                holder.listen()
            except OSError:
                pass  # someone else holds it: in use all the same
        if case.launch:
            proc = run_cli(*args, "--set", f"output_dir={tmp / 'output'}", env=env, cwd=tmp, timeout=600)
        else:
            proc = run_cli_here(*args, env=env, cwd=tmp)
    errors = [line.removeprefix("error: ") for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and len(errors) == 1, (case.args, proc.returncode, proc.stderr[-2000:])
    _triggered[case] = errors[0]
    return errors[0]


def error_rows() -> list:
    out = []
    for lang in TABLES:
        try:
            quotes = error_table(lang)
        except AssertionError:
            continue  # test_error_tables_exist_and_agree says so
        for quote in quotes:
            for case in [c for c in ERROR_CASES if quote.startswith(c.key)] or [None]:
                how = "source" if case and case.source else "triggered"
                marks = [pytest.mark.slow] if case and case.slow else []
                out.append(pytest.param(lang, quote, case, marks=marks, id=f"{lang}:{how}:{quote[:40]}"))
    return out


def test_error_tables_exist_and_agree():
    """Both pages have the table, quoting the same messages (the Chinese page quotes them in English)."""
    assert error_table("en") == error_table("zh")


@pytest.mark.parametrize("lang,quote,case", error_rows())
def test_error_table_quotes_what_the_product_prints(lang, quote, case, tmp_path_factory):
    assert case is not None, f"{lang} common-error table: no ErrorCase in tests/test_docs.py for {quote!r}"
    if case.source:  # that file raises it; any file of src/ may (code moves), none may not
        quote_holes = PLACEHOLDER.sub("\0", quote).rstrip("\0").rstrip()
        assert any(
            starts_template(t, quote_holes) for path in sorted(SRC.rglob("*.py")) for t in literal_templates(path)
        ), f"{lang} table quotes {quote!r}, which no string in src/ (expected: {case.source}) starts with"
        return
    line = trigger(case, tmp_path_factory.mktemp("err"))
    assert quote_regex(quote).match(line), f"{lang} table quotes {quote!r}; the product prints {line!r}"


def test_memory_headroom_in_the_docs():
    """The share of GPU memory above which a plan is refused, as the pages state it."""
    from taehv_launch.plan.memory import HEADROOM

    for lang in TABLES:
        path, heading = TABLES[lang]
        row = next(r for r in path.read_text().splitlines() if r.startswith("| `this plan will not fit"))
        assert re.findall(r"(\d+)%", row) == [f"{HEADROOM * 100:.0f}"], (lang, row)


def test_exit_codes_in_the_docs():
    """The exit-code tables list exactly the codes in errors.py."""
    from taehv_launch import errors

    codes = {str(v) for k, v in vars(errors).items() if k.startswith("EXIT_")}
    for page in (
        REPO / "docs" / "troubleshooting.md",
        REPO / "docs" / "zh" / "troubleshooting.md",
        REPO / "docs" / "resume.md",
    ):
        rows = set(re.findall(r"^\| (\d+) \|", page.read_text(), re.M))
        assert rows == codes, (page.name, rows, codes)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_docs_links_resolve():
    """Relative links between the docs (pages that link to docs/benchmarks.md instead of repeating
    its figures) point at a file that exists and, with `#anchor`, at one of its headings."""
    bad = []
    for md in DOCS:
        for target, anchor in re.findall(r"\]\(([^)#:\s]+\.md)(?:#([^)\s]+))?\)", md.read_text()):
            path = (md.parent / target).resolve()
            if not path.is_file():
                bad.append(f"{md.relative_to(REPO)}: {target}")
            elif anchor:
                headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M)
                if anchor not in {github_anchor(h) for h in headings}:
                    bad.append(f"{md.relative_to(REPO)}: {target}#{anchor}")
    assert not bad, bad


SET_IN_PROSE = re.compile(r"--set ([a-z_]+=[^\s`)]*)")


def test_docs_set_values_parse():
    """Every `--set KEY=VALUE` the docs mention names a real key, with a value its type check
    accepts (where the value is concrete, not a placeholder: `...`, `<c>`, `N`)."""
    from taehv_launch.errors import ConfigError
    from taehv_launch.plan.configfile import parse_set

    bad = []
    for md in DOCS:
        for item in sorted(set(SET_IN_PROSE.findall(md.read_text()))):
            item = shlex.split(item)[0] if item.count('"') % 2 == 0 and item.count("'") % 2 == 0 else item
            value = item.split("=", 1)[1]
            if "..." in value or "<" in value or not value or re.fullmatch(r"[A-Z]+", value):  # N, PATH
                item = item.split("=", 1)[0] + "=0"  # the key only: any value, the name must exist
            try:
                parse_set(item)
            except ConfigError as err:
                if "=0" not in item or "unknown" in str(err):
                    bad.append(f"{md.relative_to(REPO)}: --set {item}: {err}")
    assert not bad, bad


# --- no machine's paths in the docs ----------------------------------------------------------------
# An absolute path in the docs says where something ran (a temporary folder, the checkout, the home
# folder, the Python install), which is no use to a reader: evidence is written with placeholders
# (<repo>, <out>, <python>, ~, <tmp>; scripts/scrub_paths.py, which the evidence scripts run on their
# output). A path here is a '/' that starts no relative path, URL or placeholder, then 2+ components.
ABSOLUTE_PATH = re.compile(r"(?<![\w.~<>$}-])(?<!:/)/[A-Za-z_.][\w.+-]*/[^\s\"'`,;:()\[\]{}<>|\\]*")
# The paths that are part of the product's documented interface, kept as written:
ALLOWED_PATHS = (
    "/data/",  # example data, model and cache folders in commands a user types (--set data_root=/data/videos)
    "/models/",  # example reference VAE folder (--set ref_vae_path=/models/CogVideoX-2b)
    "/shared/",  # example shared filesystem of the cluster commands (render slurm --output-dir /shared/runs)
    "/runs/r/",  # the run directory in the quoted one-line messages of docs/troubleshooting.md
    "/dev/shm",  # the DataLoader's shared memory: validate-env checks it, the k8s Job mounts it
    "/proc/self/",  # what `bench index` reads for worker memory (/proc/self/smaps_rollup)
    "/mnt/shared/datasets/",  # the synthetic paths `bench index` makes up (docs/benchmarks.md)
    "/bin/bash",  # the rendered sbatch scripts' first line (docs/cluster/)
)
PATH_PAGES = [
    REPO / "README.md",
    REPO / "ARCHITECTURE.md",
    *sorted(p for p in (REPO / "docs").rglob("*") if p.is_file()),
]


def machine_paths(text: str) -> list[str]:
    return [m for m in ABSOLUTE_PATH.findall(text) if not m.startswith(ALLOWED_PATHS)]


def test_no_machine_paths_in_the_docs():
    bad = []
    for page in PATH_PAGES:
        if page.suffix in (".png", ".jpg", ".gif"):
            continue
        text = page.read_bytes().decode("utf-8", "replace")  # a pickled flight-recorder dump's strings too
        for n, line in enumerate(text.splitlines(), 1):
            bad += [f"{page.relative_to(REPO)}:{n}: {path}" for path in machine_paths(line)]
    assert not bad, "absolute paths of a machine (python3 scripts/scrub_paths.py FILE rewrites them):\n" + "\n".join(
        bad[:40]
    )


def test_scrub_paths_leaves_none(tmp_path):
    """What the evidence scripts run on their output passes the check above and keeps the interface's paths."""
    machine = (
        f"run dir {REPO}/output/g2; /work/main/src/x.py /opt/torch/.venv/bin/accelerate /tmp/bc/output/a "
        "file:///tmp/all4/mlruns /usr/local/lib/python3.12/site-packages/torch/x.py /usr/lib/python3.10/y.py "
        "/home/alice/.cache/x /root/.cache/taehv-launch/demo /root/out/hang /private/var/folders/ab/cd/T/tmpq/v.mp4 "
        "/var/tmp/x/y /usr/local/nvidia/lib64"
    )
    interface = "--set data_root=/data/videos /dev/shm https://pytorch.org/docs/stable/x.html rel/tmp/x"
    source = tmp_path / "log.txt"
    source.write_text(machine + "\n" + interface + "\n")
    proc = subprocess.run(
        ["python3", str(REPO / "scripts" / "scrub_paths.py"), str(tmp_path)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert machine_paths(machine), "the check must see the machine paths before"
    out = source.read_text().splitlines()
    assert machine_paths(out[0]) == [], out[0]
    assert out[1] == interface
    assert "<repo>/output/g2" in out[0] and "<python>/bin/accelerate" in out[0] and "<tmp>/bc/output/a" in out[0]
