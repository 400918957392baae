"""Where a run's time and memory go: the --profile phase table and the steady-state speed.json."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import torch

from ...files import disk_errors, write_atomic
from ...plan.schema import Config, global_batch
from ...plan.flops import ClipFlops, Rate
from ...rundir.progress import write_progress
from .flops import current_rate
from .speed import speed_record


class PeakMemory:
    """The GPU's peak allocated (and reserved) memory per log interval and over speed.json's window.

    torch keeps one peak counter per device, and resetting it is the only way to see a later
    interval's peak; so every reset goes through here (`restart`), which first folds the counter into
    both measures: a reset for one (the interval, a --profile phase) loses nothing for the other.
    `read` and `reset` stand in for torch's calls in tests. Without CUDA every measure is None."""

    def __init__(
        self,
        device: torch.device,
        read: Callable[[], tuple[int, int]] | None = None,
        reset: Callable[[], None] | None = None,
    ):
        self.enabled = device.type == "cuda" or read is not None
        self._read = read or (lambda: (torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)))
        self._reset = reset or (lambda: torch.cuda.reset_peak_memory_stats(device))
        self._interval = self._window = (0, 0)  # bytes (allocated, reserved) before the last reset

    def restart(self) -> None:
        """Reset torch's counter, keeping what it held in the interval's and the window's peaks."""
        if self.enabled:
            now = self._read()
            self._interval, self._window = _peak(self._interval, now), _peak(self._window, now)
            self._reset()

    def interval_gib(self) -> float | None:
        """Peak allocated GiB since the previous call (the log line's `mem`); starts the next interval."""
        if not self.enabled:
            return None
        self.restart()
        peak, self._interval = self._interval, (0, 0)
        return peak[0] / 2**30

    def start_window(self) -> None:
        self.restart()
        self._window = (0, 0)

    def window_gib(self) -> tuple[float, float] | None:
        """Peak (allocated, reserved) GiB since start_window."""
        if not self.enabled:
            return None
        allocated, reserved = _peak(self._window, self._read())
        return allocated / 2**30, reserved / 2**30


def _peak(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return max(a[0], b[0]), max(a[1], b[1])


_PEAKS: dict[str, PeakMemory] = {}


def peak_memory(device: torch.device) -> PeakMemory:
    """The one PeakMemory of `device` in this process (torch's counter is one per device too)."""
    return _PEAKS.setdefault(str(device), PeakMemory(device))


class PhaseTimer:
    """Wall time per phase of a step (synchronising CUDA), for --profile's table.

    With TAEHV_MEMORY_LOG=N in the environment, the first N micro-batches also print the GPU
    memory allocated after each phase and the peak within it (for finding what does not fit)."""

    def __init__(self, enabled: bool, device: torch.device):
        self.enabled, self.device = enabled, device
        self.totals: dict[str, float] = defaultdict(float)
        self.memory_log = int(os.environ.get("TAEHV_MEMORY_LOG", "0") or 0) if device.type == "cuda" else 0
        self.steady: tuple[int, float] | None = None  # (first step of the steady window, its start time)
        self.steady_end: tuple[int, float] | None = None

    def at_step(self, step: int, steady_from: int, last: int) -> None:
        """After optimizer step `step`: the table covers the steady window (SpeedLog's: compile
        warm-up left out) and ends at the last step, before the final validation and checkpoint."""
        if not self.enabled or step not in (steady_from, last):
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if step == steady_from:
            self.totals.clear()
            self.steady = (step, time.perf_counter())
        if step == last and self.steady is not None and step > self.steady[0]:
            self.steady_end = (step, time.perf_counter())

    @contextlib.contextmanager
    def __call__(self, name: str):
        if self.memory_log > 0:
            peak_memory(self.device).restart()
        if not self.enabled:
            yield
            self._memory(name)
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        with torch.profiler.record_function(name):
            yield
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.totals[name] += time.perf_counter() - t0
        self._memory(name)

    def _memory(self, name: str) -> None:
        if self.memory_log > 0:
            print(
                f"memory: {name:<28} allocated {torch.cuda.memory_allocated(self.device) / 2**30:6.2f} GiB, "
                f"peak in phase {torch.cuda.max_memory_allocated(self.device) / 2**30:6.2f} GiB",
                flush=True,
            )
            if name.startswith("backward"):
                self.memory_log -= 1

    def table(self, steps: int) -> str:
        """ms per optimizer step and share, per phase; over the steady window when the run reached its
        end (then also the wall time outside every phase: EMA, logging, launching the next step)."""
        totals = dict(self.totals)
        if self.steady is not None and self.steady_end is not None:
            (first, t0), (last, t1) = self.steady, self.steady_end
            steps = last - first
            totals["outside the phases"] = max(0.0, t1 - t0 - sum(totals.values()))
            what = f"steps {first + 1}-{last}, after the warm-up"
        else:
            what = f"{steps} steps, warm-up included"
        total = sum(totals.values()) or 1.0
        lines = [f"where a step's time goes ({what}; ms per optimizer step):"]
        for name, secs in sorted(totals.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {name:<22} {1000 * secs / max(1, steps):9.1f} ms  {100 * secs / total:5.1f}%")
        return "\n".join(lines)


class SpeedLog:
    """Steady-state throughput and memory of a run, written to <run>/speed.json at the end.

    The first steps (compile warm-up, cuDNN autotuning) are left out: the window starts after
    10 steps, or half the run when it is shorter than 20 steps. One CUDA sync at each end of
    the window; `taehv-launch bench --compare` reads the file."""

    def __init__(self, run_dir: Path, device: torch.device, world: int, cfg: Config, main: bool):
        self.run_dir, self.device, self.world, self.cfg, self.main = run_dir, device, world, cfg, main
        self.begin_step = self.t0 = None
        self.last_step, self.t1 = None, None
        self.min_free_gib = float("inf")
        self.memory = peak_memory(device)  # the log line's interval peak and this window's peak
        self.flops: tuple[ClipFlops, Rate] | None = None

    def count_flops(self, ref, log: Callable[[str], None]) -> None:
        """Once at start-up (the trainer's one call): one clip's FLOPs (train/loop/flops.py), said in one line,
        and this process's Rate, which the log line, the trackers, progress.json and speed.json use."""
        from .flops import run_rate, set_rate

        self.flops = run_rate(self.cfg, ref, self.device, self.world, log)
        set_rate(self.flops[1] if self.flops else None)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def start(self, step: int) -> None:
        remaining = self.cfg.max_train_steps - step
        self.begin_step = step + (10 if remaining >= 20 else max(1, remaining // 2))

    def restart(self, step: int) -> None:
        """After a rollback to `step`: the window starts again, after the same warm-up."""
        self.t0 = self.t1 = None
        self.start(step)

    def step(self, step: int) -> None:
        if step == self.begin_step:
            self._sync()
            self.t0 = time.perf_counter()
            self.memory.start_window()
        if self.device.type == "cuda" and step % self.cfg.log_every == 0:
            free, _ = torch.cuda.mem_get_info(self.device)
            self.min_free_gib = min(self.min_free_gib, free / 2**30)
        self.last_step = step
        if step == self.cfg.max_train_steps and self.t0 is not None:  # before the final validation
            self._sync()
            self.t1 = time.perf_counter()

    def write(self, phases: str | None) -> dict[str, Any] | None:
        if self.t0 is None or self.last_step is None or self.last_step <= self.begin_step:
            return None
        if self.t1 is None:
            self._sync()
            self.t1 = time.perf_counter()
        secs = self.t1 - self.t0
        steps = self.last_step - self.begin_step
        clips = steps * global_batch(self.cfg, self.world)
        out: dict[str, Any] = {
            "steps": steps,
            "from_step": self.begin_step,
            "seconds": secs,
            "clips_per_s": clips / secs,
            "clips_per_s_per_gpu": clips / secs / self.world,
            "world_size": self.world,
            "device": str(self.device),
            "phases": phases,
            **speed_record(self.cfg),  # what the figure was measured on: a resume uses it only there (plan/scaling.py)
        }
        if self.flops is not None:  # TFLOP/s per GPU and MFU over the window (plan/flops.py)
            clip, rate = self.flops
            out |= {"flops_per_clip": clip.record(), **rate.record(clips / secs)}
        if self.device.type == "cuda":
            stats = torch.cuda.memory_stats(self.device)
            _, total = torch.cuda.mem_get_info(self.device)
            peak_allocated, peak_reserved = self.memory.window_gib()
            out |= {
                "gpu": torch.cuda.get_device_name(self.device),
                "torch": torch.__version__,
                "peak_allocated_gib": peak_allocated,
                "peak_reserved_gib": peak_reserved,
                "min_free_gib": None if self.min_free_gib == float("inf") else self.min_free_gib,
                "total_gib": total / 2**30,
                "alloc_retries": stats.get("num_alloc_retries", 0),
                "cuda_malloc_ooms": stats.get("num_ooms", 0),
            }
        if self.main:
            with disk_errors("speed.json", self.run_dir, "then continue with --resume auto"):
                write_atomic(self.run_dir / "speed.json", json.dumps(out, indent=2))
        return out


class ProgressFile:
    """<run>/progress.json (rundir/progress.py), rewritten by rank 0 at each log line: one small file, no
    sync. `started` and samples_per_s_avg count from the start of this launch's training loop."""

    def __init__(self, run_dir: Path, main: bool, global_batch: int, launch_ids: list[str] | None = None):
        self.run_dir, self.main, self.global_batch = run_dir, main, global_batch
        self.started, self.t0, self.samples = time.time(), time.perf_counter(), 0
        self.launch_ids = launch_ids or []  # every node's launcher's launch id (Stragglers.start gathers them)

    def write(self, step: int, total: int, samples_per_s: float, samples: int) -> float:
        """Adds the window's samples; returns the ETA in seconds (at the window's rate, as the log line)."""
        self.samples += samples
        eta = (total - step) * self.global_batch / max(samples_per_s, 1e-9)
        if self.main:
            record = {
                "step": step,
                "total": total,
                "samples_per_s": samples_per_s,
                "samples_per_s_avg": self.samples / max(time.perf_counter() - self.t0, 1e-9),
                "global_batch": self.global_batch,
                "eta_s": eta,
                "time": time.time(),
                "started": self.started,
            }
            if self.launch_ids:
                record["launch_ids"] = self.launch_ids
            if (rate := current_rate()) is not None:  # tflops_per_gpu, mfu (null without a peak), ...
                record |= rate.record(samples_per_s)
            with contextlib.suppress(OSError):  # a full disk is said once, by the next checkpoint
                write_progress(self.run_dir, record)
        return eta


def window_line(means: dict[str, float], lr: float, samples_per_s: float, mem: float, eta: float, step, total) -> str:
    """The log line of a window; with the run's FLOP count (flops.py), its TFLOP/s per GPU and MFU."""
    nan = float("nan")
    rate = current_rate()
    flops = f" | {rate.text(samples_per_s)}" if rate is not None else ""
    return (
        f"step {step}/{total} | loss {means.get('loss', nan):.4f} | rec {means.get('reconstruction_loss', nan):.4f}"
        f" | enc {means.get('encoder_loss', nan):.4f} | seraena {means.get('seraena_loss', 0):.4f} | psnr "
        f"{means.get('psnr', nan):.2f} dB | lr {lr:.2e} | {samples_per_s:.1f} samples/s{flops} | mem {mem:.1f} GiB | "
        f"ETA {hms(eta)}"
    )


def progress_bar(main: bool, start: int, total: int):
    """A tqdm bar on rank 0 at a terminal (TAEHV_TTY=1, set by the launcher); else None: the log lines carry
    loss, samples/s and ETA, the bar is for a person watching."""
    if not main or os.environ.get("TAEHV_TTY") != "1":
        return None
    import sys

    from tqdm.auto import tqdm

    return tqdm(
        total=total, initial=start, desc="train", unit="step", dynamic_ncols=True, file=sys.stdout, mininterval=2.0
    )


def hms(seconds: float) -> str:
    """Seconds as H:MM:SS (for ETAs)."""
    s = int(max(0, seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def profiler(run_dir, cfg, device):
    """torch.profiler for --profile: a few steps traced into <run>/logs/profile (TensorBoard)."""
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    steps = cfg.profile_steps
    return profile(
        activities=activities,
        schedule=schedule(wait=1, warmup=1, active=steps, repeat=1),
        on_trace_ready=tensorboard_trace_handler(str(run_dir / "logs" / "profile")),
        record_shapes=False,
        # CUDA memory only: on CPU it warns about every block allocated before the trace began
        profile_memory=device.type == "cuda",
    )
