"""Launching a named run again (#35): a run folder that holds checkpoints or exports is never trained
over from scratch (one line, exit 2, nothing written; its dry run says the same); a folder holding only
the launch files of a run that failed before its first checkpoint may be reused; `--resume auto` of a
named run whose every checkpoint is damaged is refused naming them; a resume's ETA counts the steps left."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from conftest import assert_one_line_error, clean_env, overrides, run_cli, run_cli_here
from taehv_launch.rundir.checkpoint import COMPLETE, write_complete
from trainrun import launch, ok


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every file's bytes and every link's target under folder."""
    out: dict[str, bytes | str] = {}
    for p in sorted(folder.rglob("*")):
        key = str(p.relative_to(folder))
        if p.is_symlink():
            out[key] = os.readlink(p)
        elif p.is_file():
            out[key] = p.read_bytes()
    return out


def checkpoint(run: Path, step: int, *, complete: bool = True, world: int = 1) -> Path:
    """A checkpoint folder the launcher can read: trainer_state.json and, when complete, a COMPLETE
    marker with sizes and checksums written by the trainer's own write_complete."""
    ck = run / f"checkpoint-{step}"
    ck.mkdir(parents=True)
    (ck / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (ck / "trainer_state.json").write_text(json.dumps({"step": step, "world_size": world, "zero_stage": 0}))
    if complete:
        write_complete(ck, step)
    return ck


def dry(out: Path, *args: str, profile: str = "cpu"):
    return run_cli_here("1", profile, "--dry-run", "--set", f"output_dir='{out}'", *args, env=clean_env())


REFUSED = r"^error: run folder {run} already holds a run \({held}\): a launch {how} would train from scratch over it; "


@pytest.mark.slow
def test_a_finished_run_is_never_trained_over_from_scratch(tmp_path):
    """The issue's case: a real `taehv-launch 1 cpu` run to completion, then the same name again with
    fewer steps and no --resume (or an empty one): refused in one line, exit 2, and every file of the
    run (checkpoints, best_model, final_model, logs) and the `latest` link byte-identical afterwards."""
    proc, run = launch(tmp_path, 1, *overrides("max_train_steps=4 dataloader_num_workers=1"), run_name="x")
    ok(proc)
    for name in ("checkpoint-4", "best_model", "final_model"):
        assert (run / name).is_dir(), sorted(p.name for p in run.iterdir())
    held = ", ".join(
        sorted((p.name for p in run.glob("checkpoint-*")), key=lambda n: -int(n.split("-")[1]))
        + ["best_model", "final_model"]
    )
    before = snapshot(tmp_path / "output")
    for resume, how in (([], "without --resume"), (["--resume", ""], "with --resume ''")):
        expected = REFUSED.format(run=re.escape(str(run)), held=re.escape(held), how=re.escape(how))
        expected += r"continue it with --resume auto, or pick a new --run-name"
        for mode in ([], ["--dry-run"], ["--dry-run", "--json"]):
            proc, _ = launch(tmp_path, 1, "--set", "max_train_steps=2", *resume, *mode, run_name="x")
            assert_one_line_error(proc, expected)
            assert proc.stdout == "", proc.stdout  # not even a plan: nothing of the run is started over
            assert snapshot(tmp_path / "output") == before
    # the way out it names: --resume auto continues it (its dry run; the plan resumes checkpoint-4)
    proc, _ = launch(tmp_path, 1, "--set", "max_train_steps=6", "--resume", "auto", "--dry-run", "--json", run_name="x")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["resume"] == str(run / "checkpoint-4")


def test_a_folder_of_a_run_that_failed_before_its_first_checkpoint_is_reused(tmp_path):
    run = tmp_path / "x"
    (run / "logs").mkdir(parents=True)
    (run / ".tmp-checkpoint-2").mkdir()  # what a launch killed while saving its first checkpoint left
    for name in ("config.py", "accelerate.yaml", "env.json", "launch.log", "manifest.jsonl", "exit_status.json"):
        (run / name).write_text("{}\n")
    for args in ([], ["--resume", ""], ["--resume", "auto"], ["--resume", "this-run"]):
        proc = dry(tmp_path, "--json", "--run-name", "x", *args)
        assert proc.returncode == 0, proc.stderr
        plan = json.loads(proc.stdout)
        assert plan["run_dir"] == str(run) and plan["resume"] is None


@pytest.mark.parametrize(
    "contents,held,way",
    [
        (["checkpoint-6"], "checkpoint-6", "continue it with --resume auto, or pick a new --run-name"),
        (["checkpoint-6", "checkpoint-2?"], "checkpoint-6, checkpoint-2", "continue it with --resume auto"),
        (["checkpoint-2?"], "checkpoint-2", "continue it with --resume auto"),  # damaged: still the run's
        (["best_model"], "best_model", "pick a new --run-name \\(add --set pretrained_model_path={run}/best_model/"),
        (
            ["best_model", "final_model"],
            "best_model, final_model",
            "pick a new --run-name \\(add --set pretrained_model_path={run}/final_model/taehv.safetensors",
        ),
    ],
)
def test_a_folder_with_checkpoints_or_exports_is_refused_naming_it_and_the_ways_out(tmp_path, contents, held, way):
    run = tmp_path / "x"
    for name in contents:
        if name.startswith("checkpoint-"):
            checkpoint(run, int(name.strip("?").split("-")[1]), complete=not name.endswith("?"))
        else:
            (run / name).mkdir(parents=True)
            (run / name / "taehv.safetensors").write_bytes(b"w")
    before = snapshot(tmp_path)
    way = way.format(run=re.escape(str(run)))
    for args, how in (([], "a launch without --resume"), (["--resume", ""], "a launch with --resume ''")):
        expected = rf"^error: run folder {re.escape(str(run))} already holds a run \({held}\): {how} would train "
        for mode in ([], ["--json"]):
            assert_one_line_error(
                dry(tmp_path, "--run-name", "x", *args, *mode), expected + r"from scratch over it; " + way
            )
    if not any(c.startswith("checkpoint-") for c in contents):  # exports only: --resume auto has nothing to continue
        proc = dry(tmp_path, "--run-name", "x", "--resume", "auto")
        assert_one_line_error(
            proc, r"--resume auto finds no checkpoint there to continue, so it would train from scratch"
        )
    assert snapshot(tmp_path) == before


def test_the_launch_refuses_before_writing_anything(tmp_path):
    """Not only the dry run: the launch itself refuses in its plan, before the run folder's files,
    its lock or the `latest` link are touched."""
    out = tmp_path / "output"
    checkpoint(out / "x", 4)
    (out / "x" / "final_model").mkdir()
    before = snapshot(tmp_path)
    proc = run_cli("1", "cpu", "--run-name", "x", "--set", f"output_dir='{out}'", cwd=tmp_path)
    assert_one_line_error(proc, r"already holds a run \(checkpoint-4, final_model\): a launch without --resume")
    assert proc.stdout == "" and snapshot(tmp_path) == before and not os.path.lexists(out / "latest")


def damage(run: Path) -> None:
    """checkpoint-2 interrupted (no COMPLETE), checkpoint-4 truncated, checkpoint-6 a flipped byte."""
    checkpoint(run, 2, complete=False)
    ck4 = checkpoint(run, 4)
    (ck4 / "model.safetensors").write_bytes(b"short")
    ck6 = checkpoint(run, 6)
    data = bytearray((ck6 / "model.safetensors").read_bytes())
    data[100] ^= 1
    (ck6 / "model.safetensors").write_bytes(bytes(data))


@pytest.mark.parametrize("resume", ["auto", "this-run"])
def test_a_named_run_whose_every_checkpoint_is_damaged_is_refused_naming_them(tmp_path, resume):
    run = tmp_path / "x"
    damage(run)
    (run / "best_model").mkdir()
    before = snapshot(tmp_path)
    expected = (
        rf"^error: --resume {resume}: no checkpoint of run {re.escape(str(run))} can be resumed, each is damaged or "
        r"incomplete \(checkpoint-6: model\.safetensors does not match the checksum saved with it \(damaged on disk\); "
        r"checkpoint-4: model\.safetensors changed size since it was saved \(truncated or damaged\); "
        r"checkpoint-2: no COMPLETE marker[^;]*\); continue from an intact copy with "
        r"--resume PATH, or start over under a new --run-name \(add --set "
        rf"pretrained_model_path={re.escape(str(run))}/best_model/taehv\.safetensors to start from its weights\); "
        r"the damaged checkpoints are left as they are$"
    )
    for mode in ([], ["--json"]):
        assert_one_line_error(dry(tmp_path, "--run-name", "x", "--resume", resume, *mode), expected)
    proc = run_cli("1", "cpu", "--run-name", "x", "--resume", resume, "--set", f"output_dir='{tmp_path}'", cwd=tmp_path)
    assert_one_line_error(proc, expected)  # the launch too, before writing
    assert snapshot(tmp_path) == before


def test_one_intact_checkpoint_among_damaged_ones_resumes_with_notes(tmp_path):
    run = tmp_path / "x"
    damage(run)
    (run / "checkpoint-6").rename(run / "checkpoint-8")  # still damaged, now the newest
    checkpoint(run, 6)
    plan = json.loads(dry(tmp_path, "--json", "--run-name", "x", "--resume", "auto").stdout)
    assert plan["resume"] == str(run / "checkpoint-6")
    assert any(n.startswith("skipping checkpoint-8: ") for n in plan["notes"]), plan["notes"]


def test_unnamed_resume_auto_past_damaged_runs_starts_a_new_run_folder(tmp_path):
    """Without a name, --resume auto looks through every run; none usable: a new timestamped run,
    the damaged one left alone (docs/resume.md)."""
    damage(tmp_path / "old")
    plan = json.loads(dry(tmp_path, "--json", "--resume", "auto").stdout)
    assert plan["resume"] is None and plan["run_dir"] != str(tmp_path / "old")
    assert any("no complete checkpoint found; starting from scratch" in n for n in plan["notes"]), plan["notes"]


def test_a_resumes_eta_counts_only_the_steps_left(tmp_path):
    """#35: resuming checkpoint-30 of a 40-step run, the ETA line said "40 steps in" for the 10 left."""
    ck = checkpoint(tmp_path / "g", 30)
    base = tuple(overrides("max_train_steps=40 zero_stage=0"))
    fresh = dry(tmp_path, *base, profile="h100")
    resumed = dry(tmp_path, *base, "--resume", str(ck), profile="h100")
    assert fresh.returncode == 0 and resumed.returncode == 0, (fresh.stderr, resumed.stderr)
    assert re.search(r"of one GPU's: 40 steps in \d", fresh.stdout), fresh.stdout
    assert re.search(r"of one GPU's: 10 steps left \(to 40\) in \d", resumed.stdout), resumed.stdout
    as_json = [
        json.loads(dry(tmp_path, *base, *extra, "--json", profile="h100").stdout)["predicted"]
        for extra in ((), ("--resume", str(ck)))
    ]
    assert as_json[0]["from_step"] == 0 and as_json[1]["from_step"] == 30
    assert as_json[1]["hours"] == pytest.approx(as_json[0]["hours"] * 10 / 40)
    assert (tmp_path / "g" / COMPLETE).exists() is False and sorted(p.name for p in tmp_path.iterdir()) == ["g"]
