"""CPU time of the trainer's threads while it runs (issue #38 item 1: does the stepping thread get its core?).

    python scripts/cpu_threads.py --out FILE [--every 1] [--match train/main.py] &   # then kill it (SIGTERM)

Every `--every` seconds it reads /proc for each process whose command line holds `--match`: the CPU share of its
main thread (the one that launches the step's kernels), of the busiest other thread, of all its threads, its
thread count, and the whole machine's busy share. On SIGTERM or SIGINT it writes one line per process (medians over the
samples taken after its first 60 s: compile warm-up left out) to FILE. Linux only; plain Python.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def thread_ticks(pid: int) -> dict[int, int]:
    """tid -> utime + stime (clock ticks) of each thread of `pid`; {} once it is gone."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        out[int(tid)] = int(fields[11]) + int(fields[12])
    return out


def machine_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all cores since boot."""
    parts = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return sum(parts) - idle, sum(parts)


def matching(match: str) -> dict[int, str]:
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if match in cmd and "cpu_threads.py" not in cmd:
            found[int(name)] = cmd.replace("\n", " ")
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--every", type=float, default=1.0)
    ap.add_argument("--match", default="train/main.py")
    ap.add_argument("--skip", type=float, default=60.0, help="seconds of each process left out (warm-up)")
    args = ap.parse_args(argv)
    if not (0 < args.every < 3600 and 0 <= args.skip < 1e6):  # nan fails both
        print("error: --every must be positive and --skip at least 0", file=sys.stderr)
        return 2
    try:
        args.out.write_text("")  # writable before sampling, not at the end
    except OSError as err:
        print(f"error: cannot write {args.out}: {err.strerror}", file=sys.stderr)
        return 2
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))  # Ctrl-C writes the lines too
    seen: dict[int, dict] = {}  # pid -> {cmd, first, last ticks, samples}
    last_machine = machine_ticks()
    while not stop:
        time.sleep(args.every)
        now = time.monotonic()
        busy, total = machine_ticks()
        machine = (busy - last_machine[0]) / max(1, total - last_machine[1])
        last_machine = (busy, total)
        for pid, cmd in matching(args.match).items():
            ticks = thread_ticks(pid)
            state = seen.setdefault(pid, {"cmd": cmd, "first": now, "prev": ticks, "at": now, "samples": []})
            dt = (now - state["at"]) * TICK
            if dt <= 0 or now - state["first"] < args.skip:
                state["prev"], state["at"] = ticks, now
                continue
            delta = {t: v - state["prev"].get(t, 0) for t, v in ticks.items()}
            others = [v for t, v in delta.items() if t != pid]
            state["samples"].append(
                (delta.get(pid, 0) / dt, max(others, default=0) / dt, sum(delta.values()) / dt, len(ticks), machine)
            )
            state["prev"], state["at"] = ticks, now
    lines = []
    for pid, state in seen.items():
        got = state["samples"]
        if not got:
            continue
        med = [statistics.median(col) for col in zip(*got)]
        lines.append(
            f"pid {pid} ({len(got)} samples after {args.skip:.0f} s): main thread {100 * med[0]:.0f}% of a core, "
            f"busiest other thread {100 * med[1]:.0f}%, all {med[3]:.0f} threads {100 * med[2]:.0f}%; machine "
            f"{100 * med[4]:.0f}% busy | {state['cmd'][-160:]}"
        )
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
