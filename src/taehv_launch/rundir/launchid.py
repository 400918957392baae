"""The launch id: which launch of a run wrote a record.

Each `taehv-launch` invocation that starts a job (run/start.py) makes one (`begin_launch`: the UTC time and
8 random hex digits, `20261126T101502Z-3f9a2c1b`) and puts it in its own environment as TAEHV_LAUNCH_ID;
`accelerate launch`, torchrun and every rank inherit it. `launch_id()` is the one place a process reads
it. Every record the run directory's writers write carries it as "launch_id" (`stamped`, called by each
writer in rundir/): events.jsonl lines, progress.json, validation.json, exit_status[.node<k>].json,
manifest[.node<k>].jsonl, heartbeat/rank<r> and its .hang report, hang_limits.json, requeue.json (when the
requeue check runs inside a launch, which it does not today) and the launcher's .lock[.node<k>]. A
process with no launch id (a trainer started by hand, a test) writes records without one, as every
version before #40 did.

One id per invocation, not per restart attempt: `taehv-launch status` and `diff` tell launches apart by
it. Within a launch the restart in place (run/supervise.py) starts the trainer again; the launcher puts
the attempt's number (0, then 1, 2, ...: the restarts so far in the launch, the same on every node) in
the trainer's environment as TAEHV_LAUNCH_ATTEMPT (run/launch.py), and every record the trainer writes
carries it as "attempt" beside "launch_id" (`stamped`): the launcher tells the new attempt's heartbeats
and progress.json from the failed one's by it (`written_by`), never by a file's time (times
only measure: the recovery time). The launcher's own records carry none (begin_launch drops an inherited
one).

On several nodes each node's launcher is its own invocation with its own id: a reader knows node k's
current one from node k's .lock or newest manifest record (rundir/launches.py).
"""

from __future__ import annotations

import os
import re
import secrets
import time

from .records import Field, Kind

LAUNCH_ID_ENV = "TAEHV_LAUNCH_ID"
LAUNCH_ID = "launch_id"  # the field every record carries
ATTEMPT_ENV = "TAEHV_LAUNCH_ATTEMPT"
ATTEMPT = "attempt"  # the field every record a trainer of a launch writes carries: its attempt in the launch
ID_RE = re.compile(r"[0-9A-Za-z][0-9A-Za-z._:-]{0,79}")  # ours, or one a person or a scheduler set by hand


def valid(value: object) -> str | None:
    """A launch id as written, else None (another type, empty, a control character: not ours)."""
    return value if isinstance(value, str) and ID_RE.fullmatch(value) else None


def valid_attempt(value: object) -> int | None:
    """An attempt number as written (a whole number >= 0, not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31 else None


# A record type's field: a damaged id reads as none (a record is never unusable for it, strict or not)
LAUNCH = Field(LAUNCH_ID, Kind("a launch id", valid))
ATTEMPT_FIELD = Field(ATTEMPT, Kind("an attempt number", valid_attempt))


def new_launch_id() -> str:
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(4)}"


def begin_launch() -> str:
    """The launcher, once per invocation: a new launch id, set in this process's environment so that
    everything it starts inherits it (an id inherited from the caller's environment is replaced, and an
    attempt number inherited is dropped: run/launch.py sets one for each attempt's trainer)."""
    os.environ[LAUNCH_ID_ENV] = lid = new_launch_id()
    os.environ.pop(ATTEMPT_ENV, None)
    return lid


def launch_id() -> str | None:
    """This process's launch id (TAEHV_LAUNCH_ID, set by its launcher), or None."""
    return valid(os.environ.get(LAUNCH_ID_ENV))


def attempt() -> int | None:
    """This process's attempt in its launch (TAEHV_LAUNCH_ATTEMPT, set by the launcher for its trainer), or
    None (the launcher itself, a trainer started by hand)."""
    raw = os.environ.get(ATTEMPT_ENV, "")
    return valid_attempt(int(raw)) if raw.isdigit() and len(raw) < 10 else None


def written_by(record: object, number: int | None, ids: set[str] | None) -> bool:
    """Whether `record` (a heartbeat, progress.json, ... as read) was written by attempt `number` of a launch
    whose id is in `ids` (None: any launch id, or none): the launcher's restart (run/restart.py) and freeze
    watch (run/freeze.py) tell their own trainer's records by it, never by a file's time."""
    if not isinstance(record, dict) or valid_attempt(record.get(ATTEMPT)) != number:
        return False
    return ids is None or valid(record.get(LAUNCH_ID)) in ids


def stamped(record: dict) -> dict:
    """`record` with this process's launch id as "launch_id" and, in a launch's trainer, its attempt as
    "attempt" (a copy; the record itself unchanged). Every record writer of the run directory calls it;
    without a launch id the record is written as it is."""
    lid = launch_id()
    if not lid:
        return dict(record)
    n = attempt()
    return {**record, LAUNCH_ID: lid} | ({ATTEMPT: n} if n is not None else {})
