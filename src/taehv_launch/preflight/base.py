"""What every preflight check returns: a Check with PASS / WARN / FAIL, one line of evidence and,
when it fails, what to do (checks.py and decoder.py both build them)."""

from __future__ import annotations

from dataclasses import dataclass

from ..plan.resolve import Plan

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""


def _gpu_plan(plan: Plan) -> bool:
    return plan.profile.device == "cuda"
