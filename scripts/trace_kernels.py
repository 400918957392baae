"""Where the GPU's time goes in a `--profile` trace (issue #38 item 3): kernels by kind and by name, and the
GPU's idle time inside the traced steps.

    python scripts/trace_kernels.py RUN_DIR/logs/profile/*.pt.trace.json [--top 25] [--skip 0]

Reads the Chrome trace torch.profiler's tensorboard_trace_handler writes (the trainer's --profile). Over the
traced steps (the "ProfilerStep#N" spans): wall time, the time at least one kernel or copy runs on the GPU
(the union of their spans: busy), idle = wall - busy, and kernel time summed by kind (convolution through
cuDNN/CUTLASS, Triton from Inductor, GEMM, reduction/norm, copies, other) and by name. Plain JSON in, a
Markdown report out: no torch needed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

KINDS = [  # first match wins: (kind, pattern on the kernel's name)
    ("copy / memset", r"^memcpy|^memset"),
    ("convolution (cuDNN/CUTLASS)", r"conv(?!ert)|fprop|dgrad|wgrad|implicit|xmma_fprop|cudnn|nhwc|sm\d+_xmma"),
    ("GEMM", r"gemm|cutlass|matmul|sm\d+_"),
    ("Triton (Inductor fused)", r"^triton_"),
    ("reduction / norm", r"reduce|norm|softmax"),
    ("optimizer (fused AdamW)", r"adam|multi_tensor"),
    ("elementwise (ATen)", r"elementwise|vectorized|unrolled"),
]


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, pat in KINDS:
        if re.search(pat, low):
            return kind
    return "other"


def load(path: Path) -> list[dict]:
    """The trace's complete events ("ph": "X") with numeric ts and dur; ValueError when it holds no event list."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError("no list of trace events in it")
    number = (int, float)
    return [
        e
        for e in events
        if isinstance(e, dict)
        and e.get("ph") == "X"
        and isinstance(e.get("ts"), number)
        and isinstance(e.get("dur"), number)
        and e["dur"] >= 0
    ]


def union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def report(events: list[dict], top: int, skip: int = 0) -> str:
    """The report; ValueError when the trace has no steps to read (none, or --skip leaves none)."""
    # the stepping thread's spans only: Kineto also copies each one onto the GPU's timeline
    # ("gpu_user_annotation"), which counted every step twice before 2026-11-28
    steps = [
        e
        for e in events
        if e.get("cat", "user_annotation") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    if not steps:
        raise ValueError("no ProfilerStep spans in it: was it written by --profile?")
    if skip >= len(steps):
        raise ValueError(f"--skip {skip} leaves none of its {len(steps)} traced steps")
    steps = sorted(steps, key=lambda e: e["ts"])[skip:]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    t0 = min(e["ts"] for e in steps)
    t1 = max(e["ts"] + e["dur"] for e in steps)
    wall = t1 - t0
    if wall <= 0:
        raise ValueError("its traced steps last no time")
    inside = [e for e in gpu if e["ts"] < t1 and e["ts"] + e["dur"] > t0]
    busy = union([(max(e["ts"], t0), min(e["ts"] + e["dur"], t1)) for e in inside])
    by_kind: dict[str, float] = defaultdict(float)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in inside:
        name = str(e.get("name", "?"))
        kind = "copy / memset" if e["cat"] != "kernel" else kind_of(name)  # kind_of says so by name too
        by_kind[kind] += e["dur"]
        by_name[name][0] += e["dur"]
        by_name[name][1] += 1
    summed = sum(by_kind.values()) or 1.0
    n = len(steps)
    lines = [
        f"{n} traced steps: {wall / 1e3 / n:.1f} ms per step; GPU busy {busy / 1e3 / n:.1f} ms "
        f"({100 * busy / wall:.1f}%), idle {(wall - busy) / 1e3 / n:.1f} ms ({100 * (wall - busy) / wall:.1f}%); "
        f"{len(inside) / n:.0f} kernels and copies per step",
        "",
        "| kind | ms per step | share of kernel time |",
        "|---|---|---|",
    ]
    for kind, us in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {kind} | {us / 1e3 / n:.1f} | {100 * us / summed:.1f}% |")
    lines += ["", f"| top {top} kernels | kind | calls per step | ms per step | share |", "|---|---|---|---|---|"]
    for name, (us, calls) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]:
        short = name if len(name) <= 90 else name[:87] + "..."
        lines.append(
            f"| `{short}` | {kind_of(name)} | {calls / n:.0f} | {us / 1e3 / n:.2f} | {100 * us / summed:.1f}% |"
        )
    return "\n".join(lines + streams(inside, events, steps, t0, t1))


def streams(inside: list[dict], events: list[dict], steps: list[dict], t0: float, t1: float) -> list[str]:
    """Per CUDA stream: busy time (union of its kernels and copies, `inside` the window) per step; and the stepping
    thread's CPU time in CUDA calls that wait for the GPU (synchronize; a blocking copy) and in launches. The step's
    stream is the one with the most busy time: its idle is what the step loses to the CPU side (launches, the
    interpreter lock)."""
    n = len(steps)
    wall = t1 - t0
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    multi = len({e.get("pid") for e in inside if e.get("cat") == "kernel"}) > 1  # several GPUs: "device:stream"
    for e in (e for e in inside if e["dur"] > 0):  # an instant has no span to add
        pid, tid = e.get("pid", "?"), e.get("tid", "?")  # a stream is (device, stream)
        spans[f"{pid}:{tid}" if multi else str(tid)].append((max(e["ts"], t0), min(e["ts"] + e["dur"], t1)))
    if not spans:
        return []
    busy = {s: union(v) for s, v in spans.items()}
    lines = [
        "",
        "| CUDA stream | kernels and copies per step | busy ms per step | busy share of the steps' wall |",
        "|---|---|---|---|",
    ]
    for s, us in sorted(busy.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {s} | {len(spans[s]) / n:.0f} | {us / 1e3 / n:.1f} | {100 * us / wall:.1f}% |")
    main_tid = steps[0].get("tid")
    wait = launch = 0.0
    launches = 0
    calls: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])  # CUDA API calls of the other threads
    for e in events:
        if e.get("cat") not in ("cuda_runtime", "cuda_driver") or not (t0 <= e["ts"] < t1):
            continue
        name = str(e.get("name", "?"))
        if e.get("tid") != main_tid:
            calls[name][0] += e["dur"]
            calls[name][1] += 1
        elif "Synchronize" in name or name.startswith("cudaMemcpy") and "Async" not in name:
            wait += e["dur"]
        elif "Launch" in name:
            launch += e["dur"]
            launches += 1
    step = max(busy, key=busy.get)
    cpu = (
        f"the stepping thread waits on the GPU {wait / 1e3 / n:.1f} ms per step, launches {launches / n:.0f} kernels "
        f"in {launch / 1e3 / n:.1f} ms per step"
        if wait or launches
        else f"no CUDA API calls recorded on the stepping thread (tid {main_tid}) in this trace"
    )
    lines += [
        "",
        f"step's stream {step}: idle {(wall - busy[step]) / 1e3 / n:.1f} ms per step "
        f"({100 * (wall - busy[step]) / wall:.1f}%); {cpu}",
    ]
    if calls:  # the decode threads' allocations, frees and synchronisations (PyNvVideoCodec's too, as CUPTI sees them)
        lines += ["", "| CUDA API call of the other threads | calls per step | ms per step |", "|---|---|---|"]
        for name, (us, count) in sorted(calls.items(), key=lambda kv: -kv[1][0])[:12]:
            lines.append(f"| {name} | {count / n:.1f} | {us / 1e3 / n:.2f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path, nargs="+")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--skip", type=int, default=0, help="traced steps left out at the start (warm-up)")
    args = ap.parse_args(argv)
    if args.top < 0 or args.skip < 0:
        print("error: --top and --skip must be at least 0", file=sys.stderr)
        return 2
    for path in args.trace:
        try:
            events = load(path)
        except (OSError, ValueError, KeyError) as err:
            print(f"error: cannot read {path} as a Chrome trace: {err}", file=sys.stderr)
            return 2
        try:
            text = report(events, args.top, args.skip)
        except ValueError as err:
            print(f"error: {path}: {err}", file=sys.stderr)
            return 2
        print(f"## {path.name}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
