"""Who holds the interpreter lock in a training process (issue #38 item 1), from py-spy's raw samples.

    py-spy record --pid PID --duration 20 --gil --threads --nonblocking --format raw -r 100 -o RAW
    python scripts/gil_share.py RAW --seconds 20 --rate 100 [--top 8]

With --gil, py-spy keeps only the samples in which some thread holds the lock, and --threads names the thread.
Out: the share of the window the lock was held (samples / (rate x seconds)), split by thread group (the
stepping thread "MainThread", the decode threads "video-decode_*", the rest by name), and the innermost Python
frames that held it most for each group. Plain Python, no py-spy needed to read.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

LINE = re.compile(
    r"^(?:process \d+:.*?;)?thread \((?P<tid>[0-9a-fA-Fx]+)\)(?:: (?P<name>[^;]*))?(?P<stack>(;.*)?) (?P<n>\d+)$"
)


def group_of(name: str) -> str:
    if name.startswith("video-decode"):
        return "decode threads (video-decode_*)"
    if name == "MainThread":
        return "stepping thread (MainThread)"
    return re.sub(r"[-_]?\d+\b", "*", name) or "unnamed"


def parse(text: str) -> tuple[list[tuple[str, list[str], int]], int]:
    """(samples as (thread name, stack, count), lines that are not py-spy samples)."""
    rows, other = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        m = LINE.match(line.strip())
        if m:
            stack = [f for f in m["stack"].split(";") if f]
            rows.append((m["name"] or f"thread {m['tid']}", stack, int(m["n"])))
        else:
            other += 1
    return rows, other


def report(rows, seconds: float, rate: float, top: int) -> str:
    if not rows:
        return "no samples (py-spy saw no thread holding the lock, or could not read the process)"
    window = seconds * rate
    total = sum(n for *_, n in rows)
    by_group: Counter = Counter()
    leaves: dict[str, Counter] = defaultdict(Counter)
    threads: dict[str, set] = defaultdict(set)
    for name, stack, n in rows:
        g = group_of(name)
        by_group[g] += n
        threads[g].add(name)
        leaves[g][stack[-1] if stack else "(no Python frame)"] += n
    lines = [
        f"lock held in {total} of ~{window:.0f} samples: {100 * total / window:.0f}% of the window "
        f"({seconds:.0f} s at {rate:.0f} Hz)",
        "",
        "| thread group | threads | share of the window holding the lock |",
        "|---|---|---|",
    ]
    for g, n in by_group.most_common():
        lines.append(f"| {g} | {len(threads[g])} | {100 * n / window:.1f}% |")
    for g, _ in by_group.most_common():
        lines += ["", f"{g}: innermost frames holding the lock", ""]
        for frame, n in leaves[g].most_common(top):
            lines.append(f"- {100 * n / window:.1f}% `{frame}`")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("raw", type=Path)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args(argv)
    try:
        text = args.raw.read_text(errors="replace")
    except OSError as err:
        print(f"error: cannot read {args.raw}: {err.strerror}", file=sys.stderr)
        return 2
    if not (0.001 <= args.seconds < 1e6 and 0.001 <= args.rate < 1e6):
        print("error: --seconds and --rate must be positive", file=sys.stderr)
        return 2
    rows, other = parse(text)
    if other and not rows:
        print(
            f"error: {args.raw}: none of its {other} lines is a py-spy raw sample (record with --format raw)",
            file=sys.stderr,
        )
        return 2
    print(report(rows, args.seconds, args.rate, args.top))
    if other:
        print(f"\n({other} lines were not py-spy samples and are not counted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
