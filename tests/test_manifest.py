"""The reproducibility manifest (#26): <run>/manifest.jsonl, one record a launch, built from the real
plan and this machine's installed packages; on a later launch of the run, what changed is a note.
The index fingerprint is checked against the index cache file the real index builder writes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from importlib.metadata import version
from pathlib import Path

import pytest

from conftest import REPO, clean_env, overrides
from taehv_launch.run.manifest import PACKAGES, build_record, git_facts, record_launch, torch_cuda
from taehv_launch.run.render import render
from taehv_launch.run.request import Request, build_plan
from taehv_launch.rundir.manifest import (
    NOTE_ITEMS,
    RUN_PLACEHOLDER,
    append_manifest,
    flatten,
    manifest_nodes,
    manifest_notes,
    manifest_path,
    plan_hash,
    read_manifest,
)
from trainrun import launch, ok


def record_for(*words: str, env: dict | None = None) -> dict:
    req = Request(gpus=words[0], profile=words[1], sets=list(words[2:]))
    plan = build_plan(req, env=env or clean_env())
    return build_record(plan, render(plan, plan.run_dir), plan.run_dir, argv=list(words))


def test_the_plan_hash_is_stable_and_sees_every_key():
    config = {"learning_rate": 1e-4, "zero_stage": 0, "data_root": "/d"}
    topo = {"num_machines": 2, "gpus_per_machine": 8, "world_size": 16}
    h = plan_hash(config, topo, "DDP")
    assert h == plan_hash(dict(reversed(list(config.items()))), dict(topo), "DDP")  # order does not count
    assert len({h, plan_hash({**config, "learning_rate": 2e-4}, topo, "DDP"), plan_hash(config, topo, "ZeRO-1")}) == 3
    assert h != plan_hash(config, {**topo, "num_machines": 4, "world_size": 32}, "DDP")


def test_a_record_of_a_real_plan(tmp_path):
    rec = record_for("16", "h100")
    plan = rec["plan"]
    assert (plan["gpus"], plan["profile"], plan["num_machines"], plan["gpus_per_machine"]) == (16, "h100", 2, 8)
    assert plan["strategy"] == "DDP" and plan["global_batch"] == 128
    topo = {k: plan[k] for k in ("num_machines", "gpus_per_machine", "world_size")}
    assert plan["hash"] == plan_hash(rec["config"], topo, "DDP")
    assert rec["plan"]["hash"] == record_for("16", "h100")["plan"]["hash"]  # same plan, same hash
    assert rec["plan"]["hash"] != record_for("16", "h100", "learning_rate=2e-4")["plan"]["hash"]
    versions = rec["versions"]
    for name in PACKAGES:
        try:
            want = version(name)
        except Exception:
            want = None
        assert versions["packages"][name] == want, name
    import torch

    assert versions["torch_cuda"] == torch.version.cuda == torch_cuda()
    assert rec["command"]["argv"] == ["taehv-launch", "16", "h100"]
    # the run directory inside exported variables (the flight recorder's dump path) reads <run>
    dump = rec["environment"]["exported"]["TORCH_FR_DUMP_TEMP_FILE"]
    assert dump.startswith(rec["run_dir"])
    assert flatten(rec)["environment"]["TORCH_FR_DUMP_TEMP_FILE"].startswith(RUN_PLACEHOLDER + "/")


def test_the_commit_of_a_checkout():
    facts = git_facts()
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    assert facts is not None and facts["commit"] == head.stdout.strip() and isinstance(facts["dirty"], bool)
    assert Path(facts["checkout"]).resolve() == REPO.resolve()
    assert git_facts(Path("/usr/lib/python3")) is None  # not a checkout of this project


def test_the_index_fingerprint_names_the_index_cache_file(videos, tmp_path):
    from taehv_launch.dataindex.index import build_index

    cache = tmp_path / "index"
    rec = record_for("1", "cpu", f"data_root={str(videos)!r}", f"index_cache_dir={str(cache)!r}")
    data = rec["data"]
    assert data["index"] and Path(data["key"]["data_root"]).resolve() == videos.resolve()  # via a symlink in CI
    assert not cache.exists()  # nothing listed, nothing written at launch
    build_index(str(videos), "", str(cache))  # what the trainer does
    assert [p.name for p in cache.glob("*.npz")] == [f"index-{data['index']}.npz"]
    assert data["cache_file"] == str(cache / f"index-{data['index']}.npz")


def test_manifest_file_and_notes(tmp_path):
    assert read_manifest(tmp_path) == [] and manifest_notes(None, {"launch": 1}) == []
    a = record_for("1", "cpu")
    a["launch"] = 1
    append_manifest(tmp_path, a)
    with open(manifest_path(tmp_path), "a") as f:
        f.write("not json\n")  # a torn line is skipped
    b = record_for("1", "cpu")
    b["launch"] = 2
    append_manifest(tmp_path, b)
    append_manifest(tmp_path, b, node=1)
    assert [r["launch"] for r in read_manifest(tmp_path)] == [1, 2]
    assert manifest_path(tmp_path, 1).name == "manifest.node1.jsonl" and manifest_nodes(tmp_path) == [0, 1]
    assert manifest_notes(a, b) == [
        "manifest: launch 2 of this run; config, plan, environment and versions as at launch 1"
    ]
    c = record_for("2", "cpu", "learning_rate=4e-4", "seed=7", "log_every=3", "ema_decay=0.9", "n_frames=24")
    c["launch"] = 3
    notes = manifest_notes(b, c)
    config = next(n for n in notes if n.startswith("manifest: config changed since launch 2: "))
    assert "learning_rate 0.0005 -> 0.0004" in config and "more (manifest.jsonl has both)" in config
    assert config.count(" -> ") == NOTE_ITEMS
    assert any(n.startswith("manifest: plan changed since launch 2: gpus 1 -> 2, world_size 1 -> 2") for n in notes)


@pytest.mark.slow
def test_a_resume_notes_what_changed(tmp_path):
    proc, run = launch(tmp_path, 1, "--set", "max_train_steps=2", run_name="m")
    ok(proc)
    assert "manifest:" not in proc.stdout
    (first,) = read_manifest(run)
    assert first["launch"] == 1 and first["resume"] is None and first["plan"]["profile"] == "cpu"
    assert first["command"]["argv"][:3] == ["taehv-launch", "1", "cpu"]
    proc, _ = launch(tmp_path, 1, *overrides("max_train_steps=3 learning_rate=4e-4"), "--resume", "auto", run_name="m")
    ok(proc)
    notes = [line.strip() for line in proc.stdout.splitlines() if line.strip().startswith("note      manifest:")]
    assert notes[0] == (
        "note      manifest: config changed since launch 1: learning_rate 0.0005 -> 0.0004, max_train_steps 2 -> 3"
    ), proc.stdout
    # nothing else changed, unless a commit landed in this checkout between the two launches
    assert all(n.startswith("note      manifest: versions changed since launch 1: git commit ") for n in notes[1:]), (
        notes
    )
    records = read_manifest(run)
    assert [r["launch"] for r in records] == [1, 2]
    assert records[1]["resume"].endswith("checkpoint-2")
    assert records[0]["plan"]["hash"] != records[1]["plan"]["hash"]
    assert json.loads(manifest_path(run).read_text().splitlines()[0]) == first  # appended, not rewritten


def test_a_damaged_manifest_is_a_note_never_a_failed_launch(tmp_path):
    """record_launch (the launch's path): a previous record of any shape, garbage lines, a folder or a
    FIFO in place of manifest.jsonl are notes; the launch goes on."""
    req = Request(gpus="1", profile="cpu", sets=[f"output_dir={str(tmp_path / 'output')!r}"])
    plan = build_plan(req, env=clean_env())
    rendered = render(plan, plan.run_dir)
    run = tmp_path / "run"
    run.mkdir()
    bad = {"launch": 1, "time": "yesterday", "plan": [1, 2], "config": None}
    bad |= {"environment": {"exported": ["A=1"], "gpu": [1]}, "versions": {"git": {"commit": None}, "packages": [1]}}
    manifest_path(run).write_text(json.dumps(bad) + "\ngarbage\n")
    notes = record_launch(plan, rendered, run)
    assert notes[0] == f"manifest: 1 unreadable line(s) of {manifest_path(run)} left out", notes
    assert any(n.startswith("manifest: versions changed since launch 1: ") for n in notes), notes
    assert [r["launch"] for r in read_manifest(run)] == [1, 2]
    for kind in ("folder", "fifo"):
        other = tmp_path / kind
        other.mkdir()
        if kind == "folder":
            manifest_path(other).mkdir()
        else:
            os.mkfifo(manifest_path(other))
        notes = record_launch(plan, rendered, other)  # a FIFO: never opened for writing (it would block)
        assert len(notes) == 1 and notes[0].startswith(f"manifest: {manifest_path(other)}"), notes
        assert notes[0].endswith(
            (
                "is not a regular file; this launch's record is not written",
                "Is a directory; this launch's record is not written",
            )
        ), notes


def test_git_takes_no_lock_and_a_checkout_without_commits_reads(tmp_path):
    """git_facts never writes in the checkout (`git status` would refresh .git/index and take
    index.lock): a file touched since the last commit leaves .git/index as it was."""
    if not shutil.which("git"):
        pytest.skip("no git")
    repo, pkg = tmp_path / "repo", tmp_path / "repo" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)

    git("init", "-q")
    git("add", "pkg/__init__.py")
    facts = git_facts(pkg)
    assert facts is not None and facts["commit"] is None, facts  # no commit yet
    assert flatten({"versions": {"git": facts}})["versions"]["git commit"].startswith("(no commit)")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    index = repo / ".git" / "index"
    before = index.stat().st_mtime_ns
    later = time.time() + 5
    os.utime(pkg / "__init__.py", (later, later))  # same content, newer mtime: a stale index entry
    facts = git_facts(pkg)
    assert facts["commit"] and facts["dirty"] is False
    assert index.stat().st_mtime_ns == before and not (repo / ".git" / "index.lock").exists()
