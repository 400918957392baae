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

import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from conftest import REPO, clean_env, run_cli, run_cli_here

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "docs" / "zh").glob("*.md"))]
GPU_PROFILES = {"h100", "h200", "a800"}
SUBCOMMANDS = {"run", "cache", "validate-env", "render", "bench", "keys"}
SHELL_STOP = {">", ">>", "|", "&&", ";", "&", "2>&1", "||"}
EXIT_MARK = re.compile(r"#\s*exit\s+(\d+)\s*$")


@dataclass(frozen=True)
class DocCommand:
    where: str
    args: tuple[str, ...]       # after `taehv-launch`
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
        if a[0] == "bench":
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
            found.append(DocCommand(f"{md.relative_to(REPO)}:{start}", tuple(words[1:cut]),
                                    int(mark.group(1)) if mark else 0))
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
    if args[0] == "validate-env":                 # the plan it checks, without a GPU
        args = [a for a in args[1:] if a != "--quick"]
    args += [a for a in ("--dry-run", "--json") if a not in args]
    proc = run_cli_here(*args, env=clean_env(), cwd=REPO)     # paths in the docs are relative to the checkout
    if any(a.startswith("latent_cache=") for a in args) and args[0] != "cache" and "no such folder" in proc.stderr:
        return        # training from a cache that a `cache` command writes first: resolved up to that check
    assert proc.returncode == cmd.code, (cmd.where, proc.stderr)


@pytest.mark.parametrize("cmd", _ids("fast"))
def test_docs_quick_command(cmd, tmp_path):
    proc = run_cli_here(*cmd.args, env=clean_env(), cwd=REPO)
    assert proc.returncode == cmd.code, (cmd.where, proc.stdout[-2000:], proc.stderr)


@pytest.mark.slow
@pytest.mark.parametrize("cmd", [pytest.param(c, id=c.where) for c in
                                 {c.args + (c.code,): c for c in COMMANDS if c.kind == "cpu"}.values()])
def test_docs_cpu_command_runs(cmd, tmp_path):
    proc = run_cli(*cmd.args, env=clean_env(), cwd=tmp_path, timeout=900)
    assert proc.returncode == cmd.code, (cmd.where, proc.stdout[-3000:], proc.stderr[-3000:])
