"""Trackers (#26): TensorBoard (the default), Weights & Biases, MLflow and SwanLab through accelerate's
trackers, chosen with `trackers=...`. Each is tested with its real library in its local mode (wandb
offline, an MLflow file store, SwanLab offline) by reading back what the library wrote: the same scalar
names at the same steps, the validation clip and GIF, the manifest as the run's config.

The libraries come with the extras (pip install 'taehv-launch[trackers]'); their tests are in the slow
job (.ci/run installs the extras there). The fast ones need no tracker library: the `trackers` key's
check, the missing-library line at launch, TensorBoard through the same object.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import assert_one_line_error, clean_env, overrides, run_cli_here
from taehv_launch.errors import ConfigError
from taehv_launch.plan.resolve import TRACKERS, tracker_names
from taehv_launch.run.manifest import build_record
from taehv_launch.run.render import render
from taehv_launch.run.request import Request, build_plan
from taehv_launch.rundir.manifest import append_manifest
from trainrun import launch, ok, scalars

# Logs what the trainer logs, through the real Trackers object: argv = run_dir, trackers, purge step
# ("-": a fresh run). TEST_RESTORE_SIGINT=1 checks the SIGINT handler set before is still there after.
DRIVER = r"""
import os, shutil, signal, sys
from pathlib import Path
import torch
from taehv_launch.errors import UserError
from taehv_launch.plan.schema import make_config
from taehv_launch.train.loop import build
from taehv_launch.train.loop.trackers import Trackers

run, names = Path(sys.argv[1]), sys.argv[2]
purge = None if sys.argv[3] == "-" else int(sys.argv[3])
run.mkdir(parents=True, exist_ok=True)
mine = lambda *a: None
signal.signal(signal.SIGINT, mine)
cfg = make_config({"trackers": names})
acc = build.make_accelerator(cfg, run)
try:
    t = Trackers.create(acc, cfg, run, purge, print)
except UserError as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(err.exit_code)
print("SIGINT kept" if signal.getsignal(signal.SIGINT) is mine else "SIGINT taken")
s = purge - 1 if purge else 0
t.scalars({"train/loss": 1.0, "train/psnr": 20.0}, s + 1)
t.scalar("train/straggler_ratio", 1.5, s + 1)
if os.environ.get("TEST_BREAK_MLFLOW"):  # the store goes away mid-run
    shutil.rmtree(run.parent / "mlruns")
t.scalars({"train/loss": 0.5}, s + 2)
t.scalars({"val/psnr": 21.5, "val/ssim": 0.5}, s + 2)
g = torch.Generator().manual_seed(0)
t.image("val/clip_0", torch.rand(3, 16, 32, generator=g), s + 2)
t.video("val/video_0", torch.rand(4, 3, 16, 32, generator=g), s + 2)
if os.environ.get("TEST_REWIND"):  # a rollback to step s + 1: step s + 2 again, TensorBoard drops the first
    t.rewind(s + 2)
    t.scalars({"train/loss": 0.25}, s + 2)
t.flush()
t.close()
t.close()
print("driver done")
"""

SENT = {"train/loss": [(1, 1.0), (2, 0.5)], "train/psnr": [(1, 20.0)], "train/straggler_ratio": [(1, 1.5)]}
SENT |= {"val/psnr": [(2, 21.5)], "val/ssim": [(2, 0.5)]}


def drive(run: Path, names: str, purge: int | None = None, timeout: float = 240, **env: str):
    """The driver in its own process (accelerate's state and the libraries' globals are per process)."""
    base = clean_env(HOME=str(run.parent / "home"), OMP_NUM_THREADS="1")
    for k in list(base):
        if k.startswith(("WANDB_", "MLFLOW_", "SWANLAB_")):
            del base[k]
    (run.parent / "home").mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, "-c", DRIVER, str(run), names, "-" if purge is None else str(purge)],
        capture_output=True,
        text=True,
        env={**base, **env},
        cwd=run.parent,
        timeout=timeout,
    )


def done(proc) -> None:
    assert proc.returncode == 0 and "driver done" in proc.stdout, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def manifest_record(run: Path, launch: int = 1) -> dict:
    """A real launch record (the plan of `taehv-launch 1 cpu`) in run/manifest.jsonl."""
    plan = build_plan(Request(gpus="1", profile="cpu", sets=["max_train_steps=7"]), env=clean_env())
    argv = ["1", "cpu", "--set", "max_train_steps=7"]
    rec = build_record(plan, render(plan, run), run, launch=launch, argv=argv)
    run.mkdir(parents=True, exist_ok=True)
    append_manifest(run, rec)
    return rec


def log_records(path: Path, ident: bytes) -> list[bytes]:
    """The records of a LevelDB-style log file, the format of W&B's run-<id>.wandb and SwanLab's
    run-<id>.swanlab (7-byte header: checksum, length, type; 32 KiB blocks)."""
    data, block = path.read_bytes(), 32768
    assert data[:4] == ident, data[:8]
    out, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            out.append(pending + chunk)
        else:
            break
    return out


# ---------------------------------------------------------------- the key, the launch check
def test_the_trackers_key_names_each_tracker_once_in_order():
    assert tracker_names("tensorboard") == ["tensorboard"]
    assert tracker_names(" TensorBoard , mlflow,wandb,mlflow,") == ["tensorboard", "mlflow", "wandb"]
    assert tracker_names(",".join(TRACKERS)) == list(TRACKERS)
    for bad in ("tensorbord", "tensorboard,comet_ml", "", " , "):
        with pytest.raises(ConfigError, match="choose from tensorboard, wandb, mlflow, swanlab") as err:
            tracker_names(bad)
        assert "\n" not in str(err.value)


def test_an_unknown_tracker_is_one_line(tmp_path):
    proc = run_cli_here("1", "cpu", "--set", "trackers=tensorboard,neptune", "--dry-run", cwd=tmp_path)
    assert_one_line_error(proc, r"unknown tracker 'neptune'; choose from tensorboard, wandb, mlflow, swanlab")


@pytest.mark.parametrize("name", ["wandb", "mlflow", "swanlab"])
def test_a_missing_tracker_library_is_one_line_naming_the_extra_and_nothing_is_written(name, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, name, None)  # Python's own way to make a module not importable
    out = tmp_path / "output"
    proc = run_cli_here("1", "cpu", *overrides(f"trackers=tensorboard,{name}", f"output_dir='{out}'"))
    assert_one_line_error(proc, rf"trackers={name} needs the {name} library: pip install 'taehv-launch\[{name}\]'$")
    assert not out.exists()


# ---------------------------------------------------------------- the run's config
def test_the_run_config_is_the_newest_manifest_record_flat_or_the_config(tmp_path):
    from taehv_launch.train.loop.trackers import flat, run_config

    run = tmp_path / "run"
    assert run_config(run, {"learning_rate": 1e-4, "size": [1, 2]}) == {
        "config.learning_rate": 1e-4,
        "config.size": "[1, 2]",
    }
    manifest_record(run)
    rec = manifest_record(run, launch=2)  # a second launch: its record is the one attached
    got = run_config(run, {"learning_rate": 1.0})
    assert got == flat(rec) and got["launch"] == 2
    assert got["config.max_train_steps"] == 7 and got["plan.world_size"] == 1 and got["plan.profile"] == "cpu"
    assert json.loads(got["command.argv"])[-2:] == ["--set", "max_train_steps=7"]
    assert all(v is None or isinstance(v, (bool, int, float, str)) for v in got.values())


# ---------------------------------------------------------------- TensorBoard (no extra needed)
def tb(run: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted((run / "logs").glob("events.out.tfevents.*"))
    out: dict = {"scalars": {}, "images": set(), "text": ""}
    for f in files:
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out["scalars"].setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
        out["images"] |= set(acc.Tags()["images"])
        if "config/text_summary" in acc.Tags()["tensors"]:
            out["text"] += acc.Tensors("config/text_summary")[-1].tensor_proto.string_val[0].decode()
    return out


@pytest.mark.slow
def test_tensorboard_in_run_logs_with_the_same_tags_the_config_and_purge_on_resume_and_rollback(tmp_path):
    run = tmp_path / "output" / "tb"
    manifest_record(run)
    proc = drive(run, "tensorboard")
    done(proc)
    assert f"trackers: tensorboard {run / 'logs'}" in proc.stdout
    got = tb(run)
    assert got["scalars"] == SENT
    assert got["images"] == {"val/clip_0", "val/video_0"}
    assert "| config.max_train_steps | 7 |" in got["text"] and "| plan.profile | cpu |" in got["text"]
    # a resume at step 1 (purge_step 2), then a rollback to step 2 (rewind: purge_step 3)
    done(drive(run, "tensorboard", purge=2, TEST_REWIND="1"))
    assert scalars(run)["train/loss"][:2] == [(1, 1.0), (2, 0.5)]  # every event file, as written
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "logs"), size_guidance={"scalars": 0})  # what TensorBoard shows
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 1.0), (2, 1.0), (3, 0.25)]


# ---------------------------------------------------------------- W&B, offline
@pytest.mark.slow
def test_wandb_offline_gets_the_scalars_clips_and_config_and_a_resume_continues_the_run(tmp_path):
    pytest.importorskip("wandb")
    from wandb.proto.wandb_internal_pb2 import Record

    run = tmp_path / "output" / "wb"
    manifest_record(run)
    proc = drive(run, "tensorboard,wandb", WANDB_MODE="offline")
    done(proc)
    assert "trackers: tensorboard" in proc.stdout and "; wandb project taehv, run wb-" in proc.stdout
    assert "offline in" in proc.stdout and "SIGINT kept" in proc.stdout
    (first,) = list((run / "wandb").glob("offline-run-*"))
    rows, config = [], {}
    for raw in log_records(next(first.glob("run-*.wandb")), b":W&B"):
        rec = Record()
        rec.ParseFromString(raw)
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "config":
            config |= {i.key: json.loads(i.value_json) for i in rec.config.update}
    got: dict = {}
    for row in rows:
        for k, v in row.items():
            if not k.startswith("_") and k != "step" and not isinstance(v, dict) and "/" in k and k.count("/") == 1:
                got.setdefault(k, []).append((row["step"], v))
    assert got == SENT
    media = {k.rsplit("/", 1)[0]: v for row in rows for k, v in row.items() if k.endswith("/_type")}
    assert media == {"val/clip_0": "image-file", "val/video_0": "video-file"}
    assert list((first / "files" / "media" / "videos" / "val").glob("video_0_*.gif"))
    assert config["config.max_train_steps"] == 7 and config["plan.profile"] == "cpu"
    assert tb(run)["scalars"] == SENT  # TensorBoard beside it, unchanged
    # the run's next launch resumes the same W&B run (its id is the folder's)
    done(drive(run, "wandb", purge=3, WANDB_MODE="offline"))
    runs = sorted((run / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and runs[0].name.split("-", 3)[-1] == runs[1].name.split("-", 3)[-1]


@pytest.mark.slow
def test_wandb_that_cannot_start_is_one_line(tmp_path):
    pytest.importorskip("wandb")
    proc = drive(tmp_path / "output" / "nologin", "tensorboard,wandb")  # online, no API key, no TTY
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("error: trackers=wandb could not start (") and "WANDB_MODE=offline" in lines[0]


# ---------------------------------------------------------------- MLflow, a file store
@pytest.mark.slow
def test_mlflow_file_store_gets_the_scalars_clips_and_params(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads a file store only with it
    from mlflow.tracking import MlflowClient

    run = tmp_path / "output" / "ml"
    manifest_record(run)
    proc = drive(run, "tensorboard,mlflow")  # no MLFLOW_TRACKING_URI: <output_dir>/mlruns
    done(proc)
    store = (tmp_path / "output" / "mlruns").as_uri()
    assert f"; mlflow {store}, experiment taehv, run " in proc.stdout
    client = MlflowClient(store)
    (exp,) = [e for e in client.search_experiments() if e.name == "taehv"]
    (found,) = client.search_runs([exp.experiment_id])
    assert found.info.run_name == "ml" and found.data.tags["taehv.run_dir"] == str(run)
    got = {k: [(m.step, m.value) for m in client.get_metric_history(found.info.run_id, k)] for k in found.data.metrics}
    assert got == SENT
    params = found.data.params
    assert params["config.max_train_steps"] == "7" and params["plan.profile"] == "cpu"
    arts = {a.path for a in client.list_artifacts(found.info.run_id, "val/video_0")}
    assert arts == {"val/video_0/step_00000002.gif"}
    assert any(
        a.path.startswith("images/val~clip_0+step+2") for a in client.list_artifacts(found.info.run_id, "images")
    )
    # a second launch is a second MLflow run of the experiment
    manifest_record(run, launch=2)
    done(drive(run, "mlflow", purge=3, MLFLOW_TRACKING_URI=store))
    assert {r.info.run_name for r in client.search_runs([exp.experiment_id])} == {"ml", "ml (launch 2)"}


@pytest.mark.slow
def test_mlflow_gone_mid_run_is_one_line_and_tensorboard_goes_on(tmp_path):
    pytest.importorskip("mlflow")
    run = tmp_path / "output" / "gone"
    proc = drive(run, "tensorboard,mlflow", TEST_BREAK_MLFLOW="1")
    done(proc)
    failed = [line for line in proc.stdout.splitlines() if line.startswith("trackers: mlflow failed (")]
    assert len(failed) == 1 and failed[0].endswith("it gets nothing more this run, training goes on"), proc.stdout
    assert tb(run)["scalars"] == SENT


# ---------------------------------------------------------------- SwanLab, offline
@pytest.mark.slow
def test_swanlab_offline_gets_the_scalars_clips_and_config_and_leaves_sigint_to_the_trainer(tmp_path):
    pytest.importorskip("swanlab")
    import yaml
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record

    run = tmp_path / "output" / "sw"
    manifest_record(run)
    proc = drive(run, "tensorboard,swanlab", SWANLAB_MODE="offline")
    done(proc)
    assert f"; swanlab project taehv, offline in {run / 'swanlog'}" in proc.stdout
    assert "SIGINT kept" in proc.stdout  # SwanLab's own SIGINT handler would close its run on a stop signal
    (exp,) = list((run / "swanlog").glob("run-*"))
    got: dict = {}
    media = {}
    for raw in log_records(next(exp.glob("run-*.swanlab")), b":SWL"):
        rec = Record()
        rec.ParseFromString(raw)
        if rec.HasField("scalar"):
            got.setdefault(rec.scalar.key, []).append((rec.scalar.step, rec.scalar.value.number))
        elif rec.HasField("media"):
            media[rec.media.key] = (rec.media.step, [i.filename for i in rec.media.value.items])
    assert got == SENT
    assert media["val/clip_0"][0] == 2 and media["val/clip_0"][1][0].endswith(".png")
    assert media["val/video_0"][0] == 2 and media["val/video_0"][1][0].endswith(".gif")
    assert (exp / "media" / "image" / media["val/video_0"][1][0]).is_file()
    config = yaml.safe_load((exp / "files" / "config.yaml").read_text())
    assert config["config.max_train_steps"]["value"] == 7 and config["plan.profile"]["value"] == "cpu"


@pytest.mark.slow
def test_swanlab_that_cannot_start_is_one_line(tmp_path):
    pytest.importorskip("swanlab")
    proc = drive(tmp_path / "output" / "nologin", "swanlab")  # online, not logged in, no TTY
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("error: trackers=swanlab could not start (") and "SWANLAB_MODE=offline" in lines[0]


# ---------------------------------------------------------------- a real trainer run
@pytest.mark.slow
def test_a_trainer_run_logs_the_same_scalars_to_tensorboard_and_mlflow(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    env = clean_env(TAEHV_CACHE=str(tmp_path.parent / "taehv-cache"), OMP_NUM_THREADS="1")
    env = {k: v for k, v in env.items() if not k.startswith("MLFLOW_")}
    proc, run = launch(tmp_path, 1, *overrides("trackers=tensorboard,mlflow max_train_steps=4"), env=env)
    ok(proc)
    log = (run / "launch.log").read_text()
    store = (tmp_path / "output" / "mlruns").as_uri()
    assert f"trackers: tensorboard {run / 'logs'}; mlflow {store}, experiment taehv, run " in log
    client = MlflowClient(store)
    (exp,) = [e for e in client.search_experiments() if e.name == "taehv"]
    (found,) = client.search_runs([exp.experiment_id])
    board = scalars(run)
    flow = {k: [(m.step, m.value) for m in client.get_metric_history(found.info.run_id, k)] for k in found.data.metrics}
    assert set(flow) == set(board) and {"train/loss", "train/learning_rate", "val/psnr", "val/ssim"} <= set(flow)
    for tag, points in board.items():
        assert [s for s, _ in flow[tag]] == [s for s, _ in points], tag
        assert [v for _, v in flow[tag]] == pytest.approx([v for _, v in points], rel=1e-6), tag
    params = found.data.params
    assert params["config.max_train_steps"] == "4" and params["plan.world_size"] == "1"
    arts = {a.path for a in client.list_artifacts(found.info.run_id, "val/video_0")}
    assert arts == {f"val/video_0/step_{s:08d}.gif" for s, _ in board["val/psnr"]}
    assert os.path.isdir(run / "logs")
