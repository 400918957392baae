"""The measurement scripts that read a --profile trace (scripts/trace_kernels.py) and py-spy's samples
(scripts/gil_share.py): what they report on small hand-made inputs, and one line and exit 2 on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / script), *args], capture_output=True, text=True, timeout=60
    )


def x(name, ts, dur, tid, cat, pid=1):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "pid": pid, "cat": cat}


def test_trace_streams_idle_and_other_threads_calls(tmp_path):
    events = []
    for k in range(3):  # three 1000-us steps; the step's stream busy 600 us of each, a decode stream 100 us
        t = 1000 * k
        events += [
            x(f"ProfilerStep#{k}", t, 1000, 11, "user_annotation"),
            x(f"ProfilerStep#{k}", t + 100, 1000, 7, "gpu_user_annotation", pid=0),  # Kineto's copy: not a step
            x("conv_fprop", t + 100, 600, 7, "kernel", pid=0),
            x("_nv12_clip", t + 200, 100, 9, "kernel", pid=0),
            x("cudaLaunchKernel", t + 50, 5, 11, "cuda_runtime"),
            x("cudaStreamSynchronize", t + 710, 200, 11, "cuda_runtime"),
            x("cuMemFree_v2", t + 300, 40, 23, "cuda_driver"),
        ]
    events[0]["dur"] = 1000
    events.insert(0, x("warm-up kernel", 0, 10, 7, "kernel", pid=0))
    path = tmp_path / "t.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    got = run("trace_kernels.py", str(path), "--skip", "1")
    assert got.returncode == 0, got.stderr
    out = got.stdout
    assert "2 traced steps" in out  # --skip 1 left the first out; the GPU timeline's copies are not steps
    assert "| 7 | 1 | 0.6 | 60.0% |" in out
    assert "| 9 | 1 | 0.1 | 10.0% |" in out
    assert "step's stream 7: idle 0.4 ms per step (40.0%)" in out
    assert "waits on the GPU 0.2 ms per step, launches 1 kernels" in out
    assert "| cuMemFree_v2 | 1.0 | 0.04 |" in out


def test_trace_without_the_stepping_threads_calls_says_so(tmp_path):
    events = [x("ProfilerStep#1", 0, 1000, 11, "user_annotation"), x("k", 0, 500, 7, "kernel", pid=0)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(events))  # the bare list form torch also writes
    got = run("trace_kernels.py", str(path))
    assert got.returncode == 0, got.stderr
    assert "no CUDA API calls recorded on the stepping thread (tid 11)" in got.stdout


def test_trace_bad_input_is_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for path in (bad, tmp_path / "missing.json"):
        got = run("trace_kernels.py", str(path))
        assert got.returncode == 2
        assert got.stderr.startswith("error: cannot read") and got.stderr.count("\n") == 1
        assert "Traceback" not in got.stderr
    step = {"ph": "X", "name": "ProfilerStep#1", "ts": 0, "dur": 10, "cat": "user_annotation"}
    for doc, args, says in (
        ({"traceEvents": 5}, [], "no list of trace events"),
        ([1, 2, "x", {"ph": "X", "name": "ProfilerStep#1", "ts": "a", "dur": 1}], [], "no ProfilerStep spans"),
        ([{**step, "dur": 0}], [], "last no time"),
        ([step], ["--skip", "1"], "--skip 1 leaves none of its 1 traced steps"),
        ([step], ["--top", "-1"], "must be at least 0"),
    ):
        bad.write_text(json.dumps(doc))
        got = run("trace_kernels.py", str(bad), *args)
        assert got.returncode == 2 and says in got.stderr and got.stderr.count("\n") == 1, (doc, got.stderr)


RAW = """\
process 41:"python3 main.py";thread (41): MainThread;fit (run.py:10);step (trainer.py:20) 30
process 41:"python3 main.py";thread (52): video-decode_0;_clip (nvdec.py:300);_surfaces (nvdec.py:120) 50
thread (53): video-decode_1;_clip (nvdec.py:300);_surfaces (nvdec.py:120) 20
thread (54): Thread-3 (_pin_memory_loop);_pin_memory_loop (pin_memory.py:50) 10
thread (0x7f12);f (x.py:2) 0
not a sample line
"""


def test_gil_share_groups_threads_and_frames(tmp_path):
    raw = tmp_path / "spy.txt"
    raw.write_text(RAW)
    got = run("gil_share.py", str(raw), "--seconds", "2", "--rate", "100")
    assert got.returncode == 0, got.stderr
    out = got.stdout
    assert "lock held in 110 of ~200 samples: 55% of the window" in out
    assert "| decode threads (video-decode_*) | 2 | 35.0% |" in out
    assert "| stepping thread (MainThread) | 1 | 15.0% |" in out
    assert "- 35.0% `_surfaces (nvdec.py:120)`" in out
    assert "_pin_memory_loop" in out
    assert "thread 0x7f*" in out  # a thread without a name is still counted
    assert "(1 lines were not py-spy samples and are not counted)" in out


def test_gil_share_bad_input(tmp_path):
    got = run("gil_share.py", str(tmp_path / "none.txt"), "--seconds", "2")
    assert got.returncode == 2 and got.stderr.startswith("error: cannot read") and "Traceback" not in got.stderr
    raw = tmp_path / "spy.txt"
    raw.write_text(RAW)
    got = run("gil_share.py", str(raw), "--seconds", "0")
    assert got.returncode == 2 and got.stderr.strip() == "error: --seconds and --rate must be positive"
    raw.write_text("")
    got = run("gil_share.py", str(raw), "--seconds", "2")
    assert got.returncode == 0 and got.stdout.startswith("no samples")
    raw.write_text("garbage\n\x00\x01 binary\n")
    got = run("gil_share.py", str(raw), "--seconds", "2")
    assert got.returncode == 2 and "is a py-spy raw sample" in got.stderr and "Traceback" not in got.stderr
    got = run("gil_share.py", str(tmp_path / "spy.txt"), "--seconds", "nan")
    assert got.returncode == 2 and "must be positive" in got.stderr


def test_cpu_threads_bad_input(tmp_path):
    got = run("cpu_threads.py", "--out", str(tmp_path / "no" / "such" / "cpu.txt"))
    assert got.returncode == 2 and got.stderr.startswith("error: cannot write") and "Traceback" not in got.stderr
    got = run("cpu_threads.py", "--out", str(tmp_path / "cpu.txt"), "--every", "0")
    assert got.returncode == 2 and "--every must be positive" in got.stderr
