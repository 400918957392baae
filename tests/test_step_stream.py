"""#38 item 1: the step on the highest-priority CUDA stream (`step_stream_priority`), so the NVDEC decode threads'
kernels take only the SMs the step leaves. The GPU rows come from scripts/gpu_step_priority.sh (docs/benchmarks.md);
here: the key, and what the switch does where it can run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from conftest import assert_one_line_error, run_cli_here


@pytest.mark.parametrize(
    "value, match",
    [
        ("highest", "step_stream_priority='highest' in --set step_stream_priority=highest is not one of high, default"),
        ("-3", "step_stream_priority must be str"),
    ],
)
def test_a_priority_that_is_not_high_or_default_is_one_line(value, match, tmp_path):
    proc = run_cli_here("1", "h100", "--dry-run", "--set", f"step_stream_priority={value}", cwd=tmp_path)
    assert_one_line_error(proc, match)


def test_every_profile_runs_the_step_on_the_high_priority_stream_by_default():
    from taehv_launch.plan.profiles import PROFILES, get_profile
    from taehv_launch.plan.schema import KEYS

    assert KEYS["step_stream_priority"].default == "high"
    assert tuple(KEYS["step_stream_priority"].choices) == ("high", "default")
    for name in PROFILES:
        assert get_profile(name).config.get("step_stream_priority", "high") == "high", name


def test_on_the_cpu_the_switch_does_nothing_and_says_nothing():
    from taehv_launch.plan.schema import make_config
    from taehv_launch.train.loop.build import use_step_stream

    for priority in ("high", "default"):
        acc = SimpleNamespace(device=torch.device("cpu"), state=SimpleNamespace(deepspeed_plugin=None))
        assert use_step_stream(make_config({"step_stream_priority": priority}), acc) == ""


@pytest.mark.parametrize(
    "sets, nvdec, deepspeed, why",
    [
        ({}, True, False, ""),
        ({}, True, True, ""),  # ZeRO-2 (the default stage) with bf16: measured on two H100s
        ({"zero_stage": 3}, True, True, ""),  # bf16: DeepSpeed's fp16 overflow check does not run
        ({"step_stream_priority": "default"}, True, False, "step_stream_priority=default"),
        ({}, False, False, "no NVDEC decode threads to yield to"),
        ({"zero_stage": 3, "mixed_precision": "fp16"}, True, True, "ZeRO-3 with fp16"),
        ({"zero_stage": 3, "mixed_precision": "fp16"}, True, False, ""),  # no DeepSpeed engine: plain DDP
    ],
)
def test_the_step_leaves_the_default_stream_only_where_it_pays_and_is_safe(sets, nvdec, deepspeed, why):
    """NVDEC decode threads are what the step outranks (OpenCV decodes in the workers: nothing to yield to);
    DeepSpeed's ZeRO-3 fp16 overflow check makes the default stream wait for its flag, then all-reduces it on
    the current stream, so that combination keeps the default stream."""
    from taehv_launch.plan.schema import make_config
    from taehv_launch.train.loop.build import why_default_stream

    got = why_default_stream(make_config(sets), nvdec, deepspeed)
    assert got.startswith(why) and bool(got) == bool(why), got


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_step_thread_alone_moves_to_the_highest_priority_stream():
    code = textwrap.dedent(
        """
        import threading, torch
        from unittest import mock
        from accelerate import Accelerator
        from taehv_launch.plan.schema import make_config
        from taehv_launch.train.loop.build import use_step_stream
        dev = torch.device("cuda", 0)
        top = torch.cuda.Stream(dev, priority=-64).priority
        high, default = make_config({}), make_config({"step_stream_priority": "default"})
        acc = Accelerator()  # one process: its device is the GPU, no DeepSpeed
        assert use_step_stream(default, acc).startswith("; the step on the default CUDA stream")
        assert torch.cuda.current_stream(dev) == torch.cuda.default_stream(dev)
        with mock.patch("taehv_launch.train.data.nvdec.choose", return_value=("nvdec", "")):
            line = use_step_stream(high, acc)
        assert torch.cuda.current_stream(dev).priority == top < 0, line
        assert f"highest priority ({top})" in line
        seen = []
        t = threading.Thread(target=lambda: seen.append(torch.cuda.current_stream(dev) == torch.cuda.default_stream(dev)))
        t.start(); t.join()
        assert seen == [True]  # the current stream is per thread: decode threads keep theirs
        x = torch.ones(1 << 20, device=dev)
        assert float((x * 2).sum()) == 2 * (1 << 20)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
