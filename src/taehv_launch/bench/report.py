"""`bench compare`'s report: the table it prints and the versions it records."""

from __future__ import annotations

from typing import Any


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"bench --compare  {report['date']}  {report['device']}  torch {report['torch']}  "
        f"({', '.join(f'{k} {v}' for k, v in report['versions'].items())})",
        f"  {report['shape']}, {report['ref_vae_type']} reference VAE; TFLOP/s = clips/s x FLOPs per clip of what "
        f"the row runs (torch's counter, as the trainer counts: TAEHV forward + backward, Seraena, the reference "
        f"encode; the cache job: the encode only; training from the cache: no encode); MFU = TFLOP/s / "
        + (
            f"{peak:g} TFLOP/s (BF16 dense peak)"
            if (peak := report.get("peak_tflops"))
            else "peak (n/a: no peak known)"
        ),
        f"  {'row':<30} {'detail':<30} {'clips/s':>8} {'vs naive':>8} {'TFLOP/s':>8} {'MFU':>6} {'peak GiB':>9} "
        f"{'used GiB':>9}",
    ]
    for r in report["rows"]:
        peak = r.get("peak_allocated_gib")
        used = (
            r.get("used_gib")
            if "used_gib" in r
            else (r["total_gib"] - r["min_free_gib"] if r.get("min_free_gib") is not None else None)
        )
        if r.get("clips_per_s") is None:  # a run from the cache that was not measured (bench/runs.py cached_run)
            lines.append(f"  {r['what']:<30} {r.get('detail', ''):<30} not measured: {r.get('not_measured')}")
            continue
        lines.append(
            f"  {r['what']:<30} {r.get('detail', ''):<30} {r['clips_per_s']:8.2f} "
            f"{r['ratio_vs_naive']:7.2f}x {_num(r.get('tflops'), '.1f'):>8} {_num(r.get('mfu'), '.1%'):>6} "
            f"{_gib(peak):>9} {_gib(used):>9}"
        )
    naive = report["rows"][0]
    lines.append(
        f"  naive per micro-batch: encode {naive['encode_s'] * 1000:.1f} ms, TAEHV + Seraena step "
        f"{naive['step_s'] * 1000:.1f} ms"
    )
    ours = next((r for r in report["rows"] if r["what"] == "ours (real trainer)"), {})  # none with --no-online
    if ours.get("phases"):
        lines.append("  ours, --profile phases:")
        lines += ["    " + ln for ln in ours["phases"].splitlines()]
    return "\n".join(lines)


def _gib(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _num(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("accelerate", "deepspeed", "diffusers"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out
