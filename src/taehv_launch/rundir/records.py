"""One declarative reader for the run directory's JSON records.

A record type declares its fields once: each field's name, its kind (what a value must be, and what the
reader gets), whether the record is unusable without it, and its default. Reading returns the checked
record, or None and one line that says why:

    PROGRESS = Record("progress.json", (Field("step", Whole(), required=True), Field("time", TIME), ...))
    rec, why = PROGRESS.read(run_dir / "progress.json")   # ({"step": 3, "time": 1.7e9, ...}, "")

A required field that is missing or of another kind makes the record unusable (`why` names the field,
what it holds and what it should be: `lr_factor is NaN, not a number in (0, 1]`). An optional one reads
as its default, unless the record is `strict` (a record we must be sure we wrote ourselves: requeue.json,
a checkpoint's COMPLETE marker): then a value of another kind makes the record unusable too (null
included, unless the field's kind is OrNull(...)).
`loose()` is the same type with every field optional (`status` shows what it can of a damaged record).
Fields the type does not declare are left out. A file is read by files.read_json (a FIFO, a device or a
huge file never blocks nor fills memory); a missing file is (None, "").

The values' checks (number, count, timestamp) are the same ones every reader uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, NamedTuple

from ..files import RECORD_LIMIT, read_json, show_field

LATEST_TIME = 1e10  # seconds since the epoch (year 2286): a later "time" is no clock's reading
LONGEST_S = 1e9  # seconds (about 30 years): a longer ETA or age is no estimate


def number(value: Any, most: float = math.inf) -> float | None:
    """A finite number from 0 to `most` (a JSON number: not a bool, a string, NaN or Infinity), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and 0 <= value <= most else None


def count(value: Any) -> int | None:
    """A whole number 0 or more (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def timestamp(value: Any) -> float | None:
    """Seconds since the epoch that a clock could show, else None."""
    return number(value, LATEST_TIME)


BAD = object()  # what a kind's check returns for a value of another kind


@dataclass(frozen=True)
class Kind:
    """What a field's value must be: `check` returns the value as readers get it, or BAD; `what` names
    it in a reason ("a whole number >= 0")."""

    what: str
    check: Callable[[Any], Any]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def Whole(low: int | None = 0, below: int | None = None, what: str | None = None) -> Kind:
    """A whole number (not a bool) from `low` (None: any) to under `below` (None: no bound)."""
    what = what or ("a whole number" if low is None else f"a whole number >= {low}")
    return Kind(what, lambda v: v if _is_int(v) and (low is None or v >= low) and (below is None or v < below) else BAD)


def Number(low: float = 0.0, high: float = math.inf, what: str | None = None, above: bool = False) -> Kind:
    """A finite number (not a bool, NaN or Infinity) from `low` (`above`: over it) to `high`, as a float."""

    def check(v: Any) -> Any:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        return float(v) if ok and (v > low if above else v >= low) and v <= high else BAD

    return Kind(what or f"a number from {low:g} to {high:g}", check)


def Text(cut: int | None = None, what: str = "text") -> Kind:
    """A string; readers get its first `cut` characters."""
    return Kind(what, lambda v: v[:cut] if isinstance(v, str) else BAD)


def ListOf(kind: Kind) -> Kind:
    """A list whose every item is of `kind`."""

    def check(v: Any) -> Any:
        items = [kind.check(x) for x in v] if isinstance(v, list) else [BAD]
        return BAD if any(x is BAD for x in items) else items

    return Kind(f"a list of {kind.what}", check)


def MapOf(kind: Kind) -> Kind:
    """A JSON object whose every value is of `kind`."""

    def check(v: Any) -> Any:
        items = {k: kind.check(x) for k, x in v.items()} if isinstance(v, dict) else {"": BAD}
        return BAD if any(x is BAD for x in items.values()) else items

    return Kind(f"an object of {kind.what}", check)


def OrNull(kind: Kind) -> Kind:
    """`kind`, or null (read as None): for a strict record's field that may be null."""
    return Kind(kind.what, lambda v: None if v is None else kind.check(v))


ANY = Kind("a JSON value", lambda v: v)
TRUE = Kind("true", lambda v: True if v is True else BAD)  # a flag written only when set
TIME = Kind("a time (seconds since the epoch)", lambda v: BAD if (t := timestamp(v)) is None else t)


@dataclass(frozen=True)
class Field:
    name: str
    kind: Kind
    required: bool = False
    default: Any = None


class Parsed(NamedTuple):
    record: dict | None  # the checked record: every declared field, in declaration order
    why: str  # "" when read (or, from read(), when there is no file); else one line


@dataclass(frozen=True)
class Record:
    name: str  # the file or record, for people
    fields: tuple[Field, ...]
    strict: bool = False

    def loose(self) -> Record:
        """The same type with every field optional: what can be read of a damaged record."""
        return replace(self, fields=tuple(replace(f, required=False) for f in self.fields), strict=False)

    def parse(self, raw: Any) -> Parsed:
        """`raw` (a decoded JSON value) checked against the fields."""
        if not isinstance(raw, dict):
            return Parsed(None, f"{self.name} is not a JSON object")
        out: dict[str, Any] = {}
        for f in self.fields:
            value = f.kind.check(raw[f.name]) if f.name in raw else BAD
            if value is BAD:
                if f.required or (self.strict and f.name in raw):
                    return Parsed(None, f"{f.name} is {show_field(raw, f.name)}, not {f.kind.what}")
                value = _fresh(f.default)
            out[f.name] = value
        return Parsed(out, "")

    def read(self, path: Path, limit: int = RECORD_LIMIT) -> Parsed:
        """The file's record; (None, "") when there is no file, (None, "<path>: why") when it is no record
        of this type (unreadable, not JSON, a FIFO, too large, a field of another kind: "its <field> is ...")."""
        try:
            raw = read_json(path, dict, limit)
        except FileNotFoundError:
            return Parsed(None, "")
        except ValueError as exc:  # BadRecord: its message names the file
            return Parsed(None, str(exc))
        except OSError as exc:
            return Parsed(None, f"{path}: {exc.strerror or exc}")
        rec, why = self.parse(raw)
        return Parsed(rec, f"{path}: its {why}" if why else "")


def _fresh(default: Any) -> Any:
    """A new copy of a mutable default ([] or {}), so no two records share one."""
    return type(default)() if isinstance(default, (list, dict)) and not default else default
