"""Helpers for tests that run the real launcher + trainer (accelerate launch subprocesses): in the
foreground (launch) or in the background (start: a conftest.Proc to wait for, signal and read)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import CLI, Proc, clean_env, free_port, overrides, run_cli
from conftest import start as start_process

# Small, fast demo settings: a few steps, every feature exercised.
FAST = overrides(
    "log_every=1 validation_steps=2 checkpointing_steps=2 dataloader_num_workers=0 max_validation_batches=1",
    "max_restarts=0",  # a test of one failure checks its exit code; tests/test_restart.py turns restarts on
)


def trainer_env(tmp: Path, **extra: str) -> dict[str, str]:
    """A trainer run's environment: clean_env(), the demo data cached beside tmp (made once), one thread."""
    return clean_env(TAEHV_CACHE=str(tmp.parent / "taehv-cache"), OMP_NUM_THREADS="1", **extra)


def launch_args(tmp: Path, gpus: int, *args: str, run_name: str = "t", fast: bool = True) -> list[str]:
    """`GPUS cpu --run-name NAME --master-port <free> --set output_dir='<tmp>/output'`, FAST unless fast=False, ARGS."""
    head = [str(gpus), "cpu", "--run-name", run_name, "--master-port", str(free_port())]
    return [*head, *overrides(f"output_dir='{tmp / 'output'}'"), *(FAST if fast else []), *args]


def launch(tmp: Path, gpus: int, *args: str, run_name: str = "t", timeout: float = 600, env=None):
    """Run `taehv-launch GPUS cpu ...` with output under tmp; returns (proc, run_dir)."""
    argv = launch_args(tmp, gpus, *args, run_name=run_name)
    proc = run_cli(*argv, env=env or trainer_env(tmp), cwd=tmp, timeout=timeout)
    return proc, tmp / "output" / run_name


def start_launch(
    tmp: Path, gpus: int, *args: str, run_name: str = "t", fast: bool = True, env=None, wrapper=(), **kw
) -> Proc:
    """launch()'s command in the background (`wrapper` before it, e.g. GNU timeout), cwd tmp: a Proc whose
    `run` is the run directory; conftest.start's output options (out, err, start_new_session...) in kw."""
    argv = [*wrapper, *CLI, *launch_args(tmp, gpus, *args, run_name=run_name, fast=fast)]
    return start_process(argv, env=env or trainer_env(tmp), cwd=tmp, run=tmp / "output" / run_name, **kw)


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
