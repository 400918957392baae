#!/usr/bin/env python3
"""Regenerate configs/, accelerate_configs/ and docs/config.md from the tables (tests check they match)."""

from pathlib import Path

from taehv_launch.gen.shipped import expected_files

root = Path(__file__).resolve().parents[1]
for stale in [*(root / "configs").glob("*.py"), *(root / "accelerate_configs").glob("*")]:
    stale.unlink()
for rel, text in sorted(expected_files().items()):
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(text)
    print(rel)
