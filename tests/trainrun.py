"""Helpers for tests that run the real launcher + trainer (accelerate launch subprocesses)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import clean_env, free_port, run_cli

# Small, fast demo settings: a few steps, every feature exercised.
FAST = [
    "--set",
    "log_every=1",
    "--set",
    "validation_steps=2",
    "--set",
    "checkpointing_steps=2",
    "--set",
    "dataloader_num_workers=0",
    "--set",
    "max_validation_batches=1",
    "--set",
    "max_restarts=0",  # a test of one failure checks its exit code; tests/test_restart.py turns restarts on
]


def launch(tmp: Path, gpus: int, *args: str, run_name: str = "t", timeout: float = 600, env=None):
    """Run `taehv-launch GPUS cpu ...` with output under tmp; returns (proc, run_dir)."""
    env = env or clean_env(TAEHV_CACHE=str(tmp.parent / "taehv-cache"), OMP_NUM_THREADS="1")
    argv = [
        str(gpus),
        "cpu",
        "--run-name",
        run_name,
        "--master-port",
        str(free_port()),
        "--set",
        f"output_dir='{tmp / 'output'}'",
        *FAST,
        *args,
    ]
    proc = run_cli(*argv, env=env, cwd=tmp, timeout=timeout)
    return proc, tmp / "output" / run_name


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every TensorBoard scalar in run_dir/logs as {tag: [(step, value), ...]} (all event files)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    for f in sorted((run_dir / "logs").glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out


def trainer_state(ckpt: Path) -> dict:
    return json.loads((ckpt / "trainer_state.json").read_text())


def ok(proc) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nSTDOUT\n{proc.stdout[-4000:]}\nSTDERR\n{proc.stderr[-4000:]}"
