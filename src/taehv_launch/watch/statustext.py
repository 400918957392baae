"""`taehv-launch status` for people: one run as a block of labelled lines, several as a table (one row
a run). The facts are status.collect()'s; times are said as ages ("3 min ago") and clock times."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any

from ..plan.flops import record_text

MAX_RANK_LINES = 8  # more ranks than this: only the ones that look wrong get a line (--json has all)


def shown(text: Any) -> str:
    """A name or message on one line as typed: control characters (a newline in a run name) escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def link_text(path: Path, where: str) -> str | None:
    """What a path that Path.exists() calls absent is, when it is a link: "is a loop of symbolic links
    ...", "points to X, which does not exist ..." (then what to do: `where`, and how); else None."""
    try:
        to = os.readlink(path) if path.is_symlink() else None
    except OSError:
        to = None
    try:
        os.stat(path)
        loop = False
    except OSError as exc:
        loop = exc.errno == errno.ELOOP
    if loop and to is not None:
        return f"is a loop of symbolic links (it points to {shown(to)}, which leads back to it): {where}, or remove or repoint the link"
    if loop:
        return f"goes through a loop of symbolic links (a folder on its way): {where}, or remove or repoint the link"
    if to is not None:
        return f"points to {shown(to)}, which does not exist (removed or moved): {where}, or launch again to repoint it"
    return None


def duration(seconds: float) -> str:
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min" if s % 3600 >= 60 else f"{s // 3600} h"
    return f"{s // 86400} d {s % 86400 // 3600} h" if s % 86400 >= 3600 else f"{s // 86400} d"


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return "just now" if seconds < 1 else f"{duration(seconds)} ago"


def clock(at: float, now: float) -> str:
    same_day = time.localtime(at)[:3] == time.localtime(now)[:3]
    return time.strftime("%H:%M" if same_day else "%Y-%m-%d %H:%M", time.localtime(at))


def rate(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def ranks_text(ranks: list[int]) -> str:
    """[0, 1, 2, 3, 6] -> 'ranks 0-3, 6'."""
    if not ranks:
        return "no rank"
    spans, start, prev = [], ranks[0], ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        spans.append(f"{start}-{prev}" if prev > start else str(start))
        if r is not None:
            start = prev = r
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(spans)}"


def step_text(f: dict) -> str:
    if f["step"] is None:
        return f"-/{f['total']}" if f["total"] else "-"
    if f["total"]:
        return f"{f['step']}/{f['total']} ({100 * f['step'] / f['total']:.0f}%)"
    return str(f["step"])


def state_text(f: dict) -> str:
    state = f["state"]
    code = f["exit_code"]
    message = next((text(e.get("message")) for e in f["exit"] if e["node"] == 0 and e.get("message")), None)
    if state == "unreadable":
        return f"unreadable: {text(f['unreadable'][0])}" if f["unreadable"] else state
    if state == "running":
        return f"running (heartbeat {ago(f['heartbeat_age_s'])})" if f["heartbeat_age_s"] is not None else "running"
    if state == "hung":
        silent = [r for r in f["heartbeat_ranks"] if r.get("not_responding")]
        oldest = max((r["age_s"] for r in silent), default=f["heartbeat_age_s"] or 0)
        limit = next((r["limit_s"] for r in silent if r.get("limit_s") is not None), None)
        over = f", past the hang limit of {duration(limit)}" if limit is not None else ""
        return (
            f"hung: {ranks_text([r['rank'] for r in silent])} not responding (heartbeat {ago(oldest)}{over}): "
            f"frozen (SIGSTOP, a debugger, a native call holding the GIL), or its node is gone"
        )
    if state == "starting":
        return f"starting (launch log written {ago(f['log_age_s'])}; no rank heartbeat yet)"
    if state == "ended":
        return f"ended {ago(f['log_age_s'])}: exit 0 ({message or 'ok'})"
    if state == "stopped":
        how = "requeue it, or run it again with --resume auto" if code == 75 else "run it again with --resume auto"
        return f"stopped {ago(f['log_age_s'])}: exit {code} ({message or 'stopped by a signal'}); {how}"
    if state == "failed":
        return f"failed {ago(f['log_age_s'])}: exit {code}" + (f" ({message})" if message else "")
    if state == "lost":
        last = f["heartbeat_age_s"] if f["heartbeat_age_s"] is not None else f["log_age_s"]
        return (
            f"lost: no exit status, nothing written for {duration(last or 0)} (killed, or its node was lost); "
            f"--resume auto continues from the newest complete checkpoint"
        )
    return f"{state}: rendered, never launched" if state == "not started" else state


def run_block(f: dict[str, Any]) -> list[str]:
    now = f["now"]
    out = [f"run {shown(f['run'])}  {shown(f['run_dir'])}", f"  state      {state_text(f)}"]
    if f["state"] == "unreadable":
        return out
    if u := f.get("unstarted"):  # its .lock, no manifest record (rundir/launches.py): what follows is the one before
        how = (
            "it ended before it started"
            if u.get("ended")
            else f"it ended before it started, or is starting on {shown(u.get('host'))}"
        )
        before = "shown: the launch before it" if f["launches"] else "no launch before it"
        out.append(
            f"  newest     launch {shown(u.get('launch_id'))} (since {shown(u.get('since'))}) wrote no manifest record: {how} (launch.log says why); {before}"
        )
    if f["hang"]:
        out.append(f"  hang       {text(f['hang'])}")
    if f["step"] is None and f["total"]:
        out.append(f"  step       none logged yet, of {f['total']} (config.py)")
    elif f["progress_of"] == "previous launch":
        ago_ = f" (its last log line {ago(now - f['progress_time'])})" if f["progress_time"] else ""
        resume = f"resumes from {shown(f['resume_from'])}, " if f["resume_from"] else ""
        out.append(
            f"  step       {step_text(f)} where the previous launch got to{ago_}; this launch {resume}"
            f"has logged no step yet"
        )
    elif f["step"] is not None:
        when = ""
        if f["progress_time"]:
            at = f" (step {f['logged_step']})" if f["logged_step"] != f["step"] else ""
            when = f"; last log line{at} {ago(now - f['progress_time'])}"
        out.append(f"  step       {step_text(f)}{when}")
    if f["clips_per_s"] is not None:
        avg = ""
        if f["clips_per_s_avg"] is not None:
            since = f" since this launch started {ago(now - f['launch_started'])}" if f["launch_started"] else ""
            avg = f", {rate(f['clips_per_s_avg'])} average{since}"
        flops = record_text(f.get("flops"))  # the last log window's TFLOP/s and MFU (plan/flops.py)
        out.append(f"  speed      {rate(f['clips_per_s'])} clips/s now{avg}" + (f"; {flops}" if flops else ""))
    if f["eta_s"] is not None:
        out.append(f"  ETA        {duration(f['eta_s'])}, at {clock(f['ends_at'], now)}")
    ck = f["checkpoint"]
    out.append(f"  checkpoint {ck['name']}, saved {ago(ck['age_s'])}" if ck else "  checkpoint none complete yet")
    if f.get("validation"):  # absent from a record of an older status: no line
        out.append(f"  validation {validation_text(f['validation'], now)}")
    if f["nodes"] is not None:
        procs = f", {f['processes']} process{'es' if f['processes'] != 1 else ''}" if f["processes"] else ""
        out.append(f"  nodes      {f['nodes']} node{'s' if f['nodes'] != 1 else ''}{procs}")
    ranks = f["heartbeat_ranks"]
    live = f["state"] in ("running", "starting", "hung")
    beats = live or f["state"] == "lost" or any(r["dead"] for r in ranks)  # ended: the heartbeats say nothing
    for n in f["heartbeat_nodes"] if beats else []:
        spread = f" (oldest {ago(n['oldest_age_s'])})" if n["oldest_age_s"] - n["newest_age_s"] > 10 else ""
        out.append(
            f"  node {known(n['node']):<5} {known(n['host'])}: {ranks_text(n['ranks'])}, heartbeat "
            f"{ago(n['newest_age_s'])}{spread}"
        )
    listed = (
        []
        if not beats
        else ranks
        if len(ranks) <= MAX_RANK_LINES
        else [r for r in ranks if r["dead"] or r.get("not_responding") or (live and r["stale"] and not r["done"])]
    )
    for r in listed:
        what = [f"step {r['step']}" if r["step"] is not None else None, r["phase"] and shown(r["phase"])]
        if r["done"]:
            what.append("done")
        if r["dead"]:
            what.append(f"dead: {text(r['dead'])}")
        if r.get("not_responding"):
            what.append("not responding")
        words = ", ".join(w for w in what if w) or "step and phase unknown"
        where = f"node {known(r['node'])} ({known(r['host'])})"
        out.append(f"  rank {r['rank']!s:<5} {where}: {words}; heartbeat {ago(r['age_s'])}")
    if beats and len(listed) < len(ranks):
        out.append(
            f"  ranks      {len(ranks)} with heartbeats, {len(ranks) - len(listed)} not listed (all fresh): --json lists each"
        )
    limits = next((r["hang_limits"] for r in ranks if r.get("hang_limits")), None)  # rundir/hanglimits.py
    if live and limits:
        out.append(f"  hang limit {text(limits['text'])} (hang_limits.json)")
    if len(f["exit"]) > 1 or (f["exit"] and f["exit"][0]["node"] != 0):
        for e in f["exit"]:
            out.append(f"  exit       node {e['node']}: {e['code']} ({text(e['message'])})")
    messages = [e["message"] for e in f["exit"] if e.get("message")]
    said = f["last_error"] and any(f["last_error"].endswith(f"error: {m}") for m in messages)
    if f["last_error"] and f["state"] not in ("ended", "running", "starting") and not said:
        out.append(f"  error      {text(f['last_error'])}")
    rq = f["requeues"]
    line = str(rq["count"])
    if rq["without_progress"]:
        line += f", {rq['without_progress']} in a row without a new checkpoint"
    if rq["stopped"]:
        line += f"; stopped: {text(rq['stopped'])}"
    out.append(f"  requeues   {line}")
    if f.get("restarts"):
        out.append(f"  restarts   {restart_text(f['restarts'], now)}")
    rb = f["rollbacks"]
    if rb["count"] or rb["stopped"]:
        out.append(f"  rollbacks  {rollback_text(rb, now)}")
    manifest = next((u for u in f["unreadable"] if isinstance(u, str) and u.startswith("manifest.jsonl: ")), None)
    if f["launches"]:
        first = f", first {clock(f['first_launch'], now)}" if f["first_launch"] else ""
        out.append(f"  launches   {f['launches']}{first} (manifest.jsonl; plan {shown(f['plan_hash'] or '?')})")
    elif manifest:
        out.append(f"  launches   unknown: {text(manifest.replace(': ', ' unreadable (', 1))})")
    for what in f["unreadable"]:
        if what != manifest:
            out.append(f"  unreadable {text(what)}")
    return out


def known(value: Any) -> str:
    """A field from a record as typed, "?" where it was missing or of another type (read as None)."""
    return "?" if value is None else shown(value)


def one_line(value: Any) -> str:
    return " ".join(str(value).split())


def text(value: Any) -> str:
    """A message from a file, on one line, control characters escaped."""
    return shown(one_line(value))


def rollback_text(rb: dict[str, Any], now: float) -> str:
    """`2; last at step 1234 (loss spike ...), back to checkpoint-1000, 3h ago`, then any stop."""
    line = str(rb["count"])
    last = rb["last"]
    if last:
        back = f", back to {text(last['checkpoint'])}" if last.get("checkpoint") else ""
        when = f", {ago(now - last['time'])}" if isinstance(last.get("time"), (int, float)) else ""
        line += f"; last at step {known(last.get('step'))}{why(last)}{back}{when} (events.jsonl)"
    stop = rb["stopped"]
    if stop:
        line += f"; stopped: diverged again at step {known(stop.get('step'))}{why(stop)}"
    return line


def restart_text(rs: dict[str, Any], now: float) -> str:
    """`1 in the job; last 5m ago after exit 1: ...; time lost 41 s (events.jsonl)`: in-job restarts
    (run/restart.py), counted apart from the scheduler's requeues."""
    when = f" {ago(now - rs['last_time'])}" if isinstance(rs.get("last_time"), (int, float)) else ""
    lost = f"; time lost {duration(rs['lost_s'])}" if rs.get("lost_s") is not None else ""
    ended = f"; stopped restarting: {text(rs['ended'])}" if rs.get("ended") else ""
    return f"{rs['count']} in the job; last{when} after {text(rs['last_reason'])}{lost}{ended} (events.jsonl)"


def validation_text(v: dict[str, Any], now: float) -> str:
    """`step 40: PSNR 11.20 dB, SSIM 0.2678, flicker 0.0123, LPIPS n/a (EMA model, 2 clips, 3 min ago;
    validation.json); best PSNR 11.20 dB at step 40`. A run whose trainer measured no flicker or LPIPS
    (before #37: read from launch.log's validation line) says n/a for them."""

    def num(x: Any, digits: int) -> str:
        return "n/a" if x is None else f"{x:.{digits}f}"

    what = ["EMA model" if v.get("model") == "ema" else f"model {known(v.get('model'))}"]
    if v.get("clips"):
        what.append(f"{v['clips']} clip{'s' if v['clips'] != 1 else ''}")
    if isinstance(v.get("time"), (int, float)):
        what.append(ago(now - v["time"]))
    line = (
        f"step {v['step']}: PSNR {num(v.get('psnr'), 2)} dB, SSIM {num(v.get('ssim'), 4)}, flicker "
        f"{num(v.get('flicker'), 4)}, LPIPS {num(v.get('lpips'), 4)} ({', '.join(what)}; {known(v.get('from'))})"
    )
    if v.get("best_step") is not None and v.get("best_psnr") is not None:
        line += f"; best PSNR {v['best_psnr']:.2f} dB at step {v['best_step']}"
    return line


def why(event: dict[str, Any]) -> str:
    """ " (its reason)", or nothing when the event names none."""
    return f" ({text(event['reason'])})" if event.get("reason") is not None else ""


def table(facts: list[dict[str, Any]]) -> list[str]:
    head = ("RUN", "STATE", "STEP", "CLIPS/S NOW/AVG", "ETA", "CHECKPOINT", "HEARTBEAT", "REQUEUES")
    rows = [head]
    for f in facts:
        state = f["state"] + (f" ({f['exit_code']})" if f["state"] in ("failed", "stopped") else "")
        speed = "-" if f["clips_per_s"] is None else f"{rate(f['clips_per_s'])}/{rate(f['clips_per_s_avg'])}"
        ck = f["checkpoint"]
        rows.append(
            (
                shown(f["run"]),
                state,
                step_text(f),
                speed,
                duration(f["eta_s"]) if f["eta_s"] is not None else "-",
                f"{ck['name']}, {ago(ck['age_s'])}" if ck else "-",
                ago(f["heartbeat_age_s"]) if f["state"] in ("running", "starting", "hung") else "-",
                str(f["requeues"]["count"]),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def render(facts: list[dict[str, Any]], now: float) -> str:
    if len(facts) == 1:
        return "\n".join(run_block(facts[0]))
    return "\n".join([*table(facts), "", "(taehv-launch status RUN: one run in full)"])
