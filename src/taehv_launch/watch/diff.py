"""`taehv-launch diff A B`: what differs between two runs, a run and a plan, or two plans: config, plan
(GPUs, topology, strategy, batch, data index), environment (the variables the launch sets, hosts, GPUs)
and versions, only the rows that differ. Exit 0 identical, 1 different (like diff(1)), 2 bad input.

Each side is one of:
  a run          a run directory (its manifest.jsonl's newest record, node 0's; every node's host), or
                 `latest` / a run id under ./output
  a plan         "GPUS PROFILE [--set KEY=VALUE ...] [--config FILE] [--num-nodes N] [--gpus-per-node G]"
                 as ONE argument (quoted): resolved as `taehv-launch GPUS PROFILE --dry-run` would, here
                 and now; nothing is written. Its environment and versions are this machine's.
  a config file  FILE.py: the plan `GPUS PROFILE --config FILE`, GPUS PROFILE from the file's own
                 "Resolved by taehv-launch for `16 h100`" header (the shipped configs/ and every run's
                 config.py have one), else from the other side.
A plan cannot know the hosts and GPUs it will run on: those rows are compared between runs only.
The plan itself is resolved by the launcher's side, handed in by the command as `resolve`
(run/manifest.py plan_record): this module only reads run directories and config files.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import ConfigError, one_line
from ..files import RECORD_LIMIT, read_json_or_none
from ..rundir.manifest import (
    GROUPS,
    MISSING,
    differences,
    flatten,
    part,
    read_manifest_state,
    record_time,
    short,
)
from ..rundir.launches import current_launch, node_record
from .status import RUN_FILES_TEXT, locate, missing, probe, shown
from .statustext import link_text

PLAN_SPEC = re.compile(r"\s*\d+\s+\S.*", re.S)
ODD_SPACE = re.compile(r"[^\S \t\n]")  # a no-break or other Unicode space: shlex splits on ASCII ones only
HEADER = re.compile(r"Resolved by taehv-launch for `(\d+) (\w+)`")
MACHINE_ROWS = ("environment.hosts", "environment.gpu", "environment.gpu driver", "environment.cuda (driver)")
WIDE = 40  # a value longer than this goes on its own line
# (a plan's Request fields, its argv) -> the manifest record its launch would write; nothing is written
PlanRecord = Callable[[dict[str, Any], list[str]], dict[str, Any]]
SPEC_HELP = (
    'a run directory, a config file (.py) or a plan "GPUS PROFILE [--set KEY=VALUE ...] [--config FILE] '
    '[--num-nodes N] [--gpus-per-node G]" as one quoted argument'
)


@dataclass
class Side:
    label: str  # as given
    kind: str  # "run", "plan", "config file"
    title: str  # what it is, in words
    rows: dict[str, dict[str, Any]]
    skip: tuple[str, ...] = ()  # rows it cannot know
    words: tuple[str, str] | None = None  # its GPUS PROFILE
    extra: dict[str, Any] = field(default_factory=dict)
    unknown: str = ""  # why the skipped groups are not known ("a run from before manifest.jsonl")


def load(text: str, resolve: PlanRecord, output_dir: str = "output", other: Side | None = None) -> Side:
    """One side of a diff, or ConfigError naming what is wrong."""
    if PLAN_SPEC.fullmatch(text):
        return plan_side(text, resolve)
    try:
        path = locate(text, output_dir)
        is_dir = path.is_dir()
        is_run, why = probe(path)
    except OSError as exc:
        is_dir, is_run, why = False, False, exc.strerror or type(exc).__name__
    except ConfigError:
        raise ConfigError(f"an empty path {text!r}: give {SPEC_HELP}") from None
    if why:
        raise ConfigError(f"cannot read {shown(text)} ({why}): make it readable, or give {SPEC_HELP}")
    if is_dir:
        if not is_run:
            raise ConfigError(f"{shown(text)} is not a run directory ({RUN_FILES_TEXT}): give {SPEC_HELP}")
        return run_side(text, path.resolve())
    if path.is_file() and path.suffix == ".py":
        m = HEADER.search(config_head(path))
        words = (m.group(1), m.group(2)) if m else (other.words if other else None)
        if words is None:
            raise ConfigError(
                f"{text} does not say which GPUS PROFILE it is for: give the plan as one argument, "
                f'"GPUS PROFILE --config {text}"'
            )
        spec = f"{words[0]} {words[1]} --config {shlex.quote(str(path))}"
        side = plan_side(spec, resolve, label=text, kind="config file")
        side.title = (
            f"config file {text} as `{words[0]} {words[1]}` resolved here now (environment, versions: this machine)"
        )
        return side
    if path.exists():
        raise ConfigError(f"{shown(text)} is a file but not a config file (.py): give {SPEC_HELP}")
    if link_text(path, "") is not None:  # a link to nothing, a loop of links
        raise missing(text, path, output_dir)
    raise ConfigError(f"no run, config file or plan {text!r}: give {SPEC_HELP}")


def config_head(path: Path) -> str:
    """The first 2000 bytes of a config file (its header), "" when unreadable."""
    try:
        with open(path, "rb") as f:
            return f.read(2000).decode(errors="replace")
    except OSError:
        return ""


def parse_spec(text: str) -> dict[str, Any]:
    """ "GPUS PROFILE [options]" -> the Request's fields (run/request.py)."""
    try:
        words = shlex.split(ODD_SPACE.sub(" ", text))
    except ValueError as exc:
        raise ConfigError(f"cannot read the plan {text!r}: {exc}") from None
    if len(words) < 2:
        raise ConfigError(f"the plan {text!r} is not GPUS PROFILE: give {SPEC_HELP}")
    gpus, profile, rest = words[0], words[1], words[2:]
    sets: list[str] = []
    opts: dict[str, Any] = {}
    names = {"--config": "config", "--num-nodes": "num_nodes", "--gpus-per-node": "gpus_per_node"}
    i = 0
    while i < len(rest):
        word = rest[i]
        name, eq, value = word.partition("=")
        if name not in ("--set", *names):
            raise ConfigError(
                f"{word!r} in the plan {text!r}: a plan takes --set KEY=VALUE, --config FILE, --num-nodes N "
                f"and --gpus-per-node G"
            )
        if not eq:
            if i + 1 >= len(rest):
                raise ConfigError(f"{word} needs a value in the plan {text!r}")
            value, i = rest[i + 1], i + 1
        i += 1
        if name == "--set":
            sets.append(value)
        elif name == "--config":
            opts["config"] = value
        else:
            try:
                opts[names[name]] = int(value)
            except ValueError:
                raise ConfigError(f"{name} must be a whole number, got {value!r} in the plan {text!r}") from None
    if opts.get("num_nodes", 1) > 1:  # which node and where the rendezvous is: nothing a diff compares
        opts.update(node_rank=0, master_addr="127.0.0.1")
    return {"gpus": gpus, "profile": profile, "sets": sets, **opts}


def plan_side(text: str, resolve: PlanRecord, label: str | None = None, kind: str = "plan") -> Side:
    record = resolve(parse_spec(text), shlex.split(text))
    plan = record["plan"]
    return Side(
        label=label or text,
        kind=kind,
        title=f"plan `{text.strip()}` resolved here now (environment, versions: this machine)",
        rows=flatten(record),
        skip=MACHINE_ROWS,
        words=(str(plan["gpus"]), plan["profile"]),
        extra={"plan_hash": plan["hash"]},
    )


def run_side(label: str, run_dir: Path) -> Side:
    manifest = read_manifest_state(run_dir)  # only its tail when huge
    records, skipped = manifest.records, manifest.skipped
    if not records:
        if manifest.why:
            return old_run_side(label, run_dir, f"manifest.jsonl unreadable ({one_line(manifest.why)})")
        return old_run_side(label, run_dir, "before manifest.jsonl")
    rec = records[-1]
    current = current_launch(run_dir, records, live=False)
    hosts = []  # every node's of the launch compared: its record on each node (rundir/launches.py)
    for node in current.nodes if current.record is rec else (0,):
        host = part(rec if node == 0 else node_record(run_dir, current, node), "environment").get("host")
        if host and str(host) not in hosts:
            hosts.append(str(host))
    plan = part(rec, "plan")
    at = record_time(rec)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(at)) if at is not None else "time unknown"
    launches = manifest.launches or len(records)
    launch = rec.get("launch") if isinstance(rec.get("launch"), int) else launches
    left_out = f"; {skipped} unreadable line(s) of manifest.jsonl left out" if skipped else ""
    left_out += "" if manifest.whole else f"; manifest.jsonl over {RECORD_LIMIT >> 20} MiB: its tail read"
    absent = tuple(g for g in GROUPS if not part(rec, g))
    return Side(
        label=label,
        kind="run",
        title=f"run {shown(run_dir)} (launch {launch} of {launches}, {when}{left_out})",
        rows=flatten(rec, hosts),
        skip=absent,
        words=(str(plan.get("gpus")), str(plan.get("profile"))) if plan.get("gpus") else None,
        extra={"plan_hash": plan.get("hash")},
        unknown="not in its manifest record",
    )


def old_run_side(label: str, run_dir: Path, why: str) -> Side:
    """A run without a usable manifest record (from before manifest.jsonl, or with an unreadable one):
    its config.py, read without running it, and env.json; versions and machine facts unknown."""
    from ..plan.configfile import read_config_literals
    from ..rundir.manifest import strategy_name

    try:
        config = read_config_literals(run_dir / "config.py")
    except (OSError, ConfigError):
        config = {}
    if not config:
        raise ConfigError(
            f"{shown(label)}: {why}, and no readable config.py: nothing to compare (give another run or a plan)"
        )
    m = HEADER.search(config_head(run_dir / "config.py"))
    env = read_json_or_none(run_dir / "env.json") or {}
    topo = part(env, "topology")
    nodes, per = topo.get("num_machines"), topo.get("gpus_per_machine")
    if not (isinstance(nodes, int) and isinstance(per, int)) or isinstance(nodes, bool) or isinstance(per, bool):
        nodes = per = None
    world = nodes * per if nodes is not None and per is not None else None
    zero = config.get("zero_stage")
    record = {
        "run_dir": str(run_dir),
        "plan": {
            "gpus": int(m.group(1)) if m else world,
            "profile": m.group(2) if m else None,
            "num_machines": nodes,
            "gpus_per_machine": per,
            "world_size": world,
            "strategy": strategy_name(zero if isinstance(zero, int) else 0, world or 1),
        },
        "config": json.loads(json.dumps(config, default=str)),
        "environment": {"exported": part(env, "exported"), "kept": part(env, "kept_from_environment")},
    }
    return Side(
        label=label,
        kind="run",
        title=f"run {shown(run_dir)} ({why}: its config.py and env.json only)",
        rows=flatten(record),
        skip=("versions", *MACHINE_ROWS, "plan.row_source", "plan.global_batch", "plan.data index"),
        words=(m.group(1), m.group(2)) if m else None,
        unknown=f"not recorded ({why})",
    )


def both(a_text: str, b_text: str, resolve: PlanRecord) -> tuple[Side, Side]:
    """Load the sides; a config file without its own GPUS PROFILE takes the other side's."""
    a = None if Path(a_text).suffix == ".py" and not PLAN_SPEC.fullmatch(a_text) else load(a_text, resolve)
    b = load(b_text, resolve, other=a)
    return (a or load(a_text, resolve, other=b)), b


def compare(a: Side, b: Side, only: tuple[str, ...] = ()) -> list[tuple[str, str, Any, Any]]:
    skip = (*a.skip, *b.skip, *(g for g in GROUPS if only and g not in only))
    return differences(a.rows, b.rows, tuple(dict.fromkeys(skip)))


def not_compared(a: Side, b: Side, only: tuple[str, ...]) -> list[str]:
    out = []
    for side, name in ((a, "A"), (b, "B")):
        for group in GROUPS:
            if group in side.skip and (not only or group in only):
                out.append(f"{group}: not compared, {side.unknown} for {name}")
    if (a.kind != "run" or b.kind != "run") and (not only or "environment" in only):
        out.append("hosts and GPUs: compared between runs only (a plan runs where it is launched)")
    return out


def render_text(a: Side, b: Side, diffs: list, notes: list[str], only: tuple[str, ...]) -> str:
    out = [f"A: {a.title}", f"B: {b.title}"]
    groups = [g for g in GROUPS if not only or g in only]
    fits = [
        (row, short(va, 10**6))
        for _g, row, va, vb in diffs
        if max(len(short(va, 10**6)), len(short(vb, 10**6))) <= WIDE
    ]
    name_w = min(32, max((len(row) for row, _ta in fits), default=0))
    a_w = max((len(ta) for _row, ta in fits), default=0)
    for group in groups:
        rows = [d for d in diffs if d[0] == group]
        if not rows:
            continue
        out.append(f"{group} ({len(rows)} differ{'s' if len(rows) == 1 else ''})")
        for _g, row, va, vb in rows:
            ta, tb = short(va, 10**6), short(vb, 10**6)
            if len(ta) > WIDE or len(tb) > WIDE:
                out += [f"  {row}", f"    A  {ta}", f"    B  {tb}"]
            else:
                out.append(f"  {row:<{name_w}}  {ta:<{a_w}}  {tb}".rstrip())
    skipped = {*a.skip, *b.skip}
    same = [g for g in groups if g not in skipped and not any(d[0] == g for d in diffs)]
    if same:
        out.append(("identical: " if not diffs else "same: ") + ", ".join(same))
    out += [f"note: {n}" for n in notes]
    return "\n".join(out)


def groups_of(only: str | None) -> tuple[str, ...]:
    """--only's groups; () for all. ConfigError for an empty list or an unknown group."""
    if only is None:
        return ()
    groups = tuple(dict.fromkeys(g.strip() for g in only.split(",") if g.strip()))
    bad = [g for g in groups if g not in GROUPS]
    if bad or not groups:
        raise ConfigError(f"--only {only!r}: groups are {', '.join(GROUPS)} (comma-separated, at least one)")
    return groups


def diff(a_text: str, b_text: str, resolve: PlanRecord, as_json: bool = False, only: str | None = None) -> int:
    """The command; `resolve` turns a plan side into its manifest record (run/manifest.py plan_record)."""
    groups = groups_of(only)
    a, b = both(a_text, b_text, resolve)
    compared = [g for g in groups or GROUPS if g not in a.skip and g not in b.skip]
    if not compared:
        raise ConfigError(
            f"nothing to compare: {'; '.join(not_compared(a, b, groups))}; compare "
            f"{', '.join(g for g in GROUPS if g not in a.skip and g not in b.skip) or 'another run'} instead"
        )
    diffs = compare(a, b, groups)
    notes = not_compared(a, b, groups)
    if as_json:
        doc = {
            "a": {"label": a.label, "kind": a.kind, "title": a.title, **a.extra},
            "b": {"label": b.label, "kind": b.kind, "title": b.title, **b.extra},
            "identical": not diffs,
            "differences": [
                {
                    "group": g,
                    "row": row,
                    **({"a": va} if va is not MISSING else {}),
                    **({"b": vb} if vb is not MISSING else {}),
                }
                for g, row, va, vb in diffs
            ],
            "not_compared": notes,
        }
        print(json.dumps(doc, indent=2, default=str))
    else:
        print(render_text(a, b, diffs, notes, groups))
    return 1 if diffs else 0
