"""Writing files that other processes read while we write them (one rule for the whole package).

write_atomic replaces one file; publish_dir builds a folder under a temporary name and renames it into
place; disk_errors turns a failed write (disk full, quota, `ulimit -f`) into DiskWriteError, one line
that says what to do. read_json and read_json_lines read the small JSON records that run directories
hold (written by us, but also by a crash mid-write, a full disk or a hand edit). Stdlib only."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import shutil
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

from .errors import EXIT_FAILED, UserError


RECORD_LIMIT = 16 << 20  # bytes: no record of ours comes near; /dev/zero or a stray 1 GB file stops here


class BadRecord(ValueError):
    """A file that exists but is no usable record: not a regular file, too large, not UTF-8 JSON,
    nested too deeply, or (read_json with want=dict) JSON of another type. str() says which."""


def _read_text(path: Path, limit: int) -> str:
    """The text of a regular file up to limit bytes. OSError: missing or unreadable; BadRecord otherwise.
    Never blocks on a FIFO (opened non-blocking, then checked) nor reads a device."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadRecord(f"{path} is not a regular file")
        if st.st_size > limit:
            raise BadRecord(f"{path} is {st.st_size} bytes, more than a record ever is ({limit})")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise BadRecord(f"{path} grew past {limit} bytes while read")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise BadRecord(f"{path} is not UTF-8 text") from None


def _parse(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise BadRecord(f"{where} nests too deeply to be a record") from None
    except ValueError as exc:
        raise BadRecord(f"{where} is not JSON ({exc})") from None


def read_json(path: str | Path, want: type | None = dict, limit: int = RECORD_LIMIT) -> Any:
    """One JSON record. OSError: missing or unreadable (FileNotFoundError when absent); BadRecord:
    present but unusable (see BadRecord), including a value that is not a `want` (default: an object)."""
    path = Path(path)
    value = _parse(_read_text(path, limit), str(path))
    if want is not None and not isinstance(value, want):
        raise BadRecord(f"{path} holds a JSON {_json_kind(value)}, not {_JSON_KINDS.get(want, want.__name__)}")
    return value


_JSON_KINDS = {
    dict: "an object",
    list: "an array",
    str: "a string",
    bool: "a boolean",
    int: "a number",
    float: "a number",
}


def _json_kind(value: Any) -> str:
    return "null" if value is None else _JSON_KINDS.get(type(value), type(value).__name__).split()[-1]


def show_field(rec: dict, key: str) -> str:
    """A record's field as a one-line message shows it: `missing`, `a JSON list`/`a JSON object`, or its
    JSON text cut at 40 characters (a hand-edited value can be anything)."""
    if key not in rec:
        return "missing"
    value = rec[key]
    if isinstance(value, (list, dict)):
        return f"a JSON {'list' if isinstance(value, list) else 'object'}"
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_json_or_none(path: str | Path, limit: int = RECORD_LIMIT) -> dict | None:
    """A JSON object, or None whatever is wrong with the file (missing, unreadable, not an object)."""
    try:
        return read_json(path, dict, limit)
    except (OSError, ValueError):
        return None


def read_json_lines(path: str | Path, limit: int = RECORD_LIMIT) -> tuple[list[dict], int]:
    """(the JSON objects of a .jsonl file, oldest first; how many non-empty lines were left out as
    unreadable: a torn last write, a hand edit, another type). Missing or unusable file: ([], 0) for a
    missing one, OSError / BadRecord otherwise. A file over limit bytes is read from its last limit
    bytes (its first, partial line left out)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (FileNotFoundError, NotADirectoryError):
        return [], 0
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadRecord(f"{path} is not a regular file")
        cut = st.st_size > limit
        if cut:
            f.seek(st.st_size - limit)
        data = f.read(limit)
    lines = data.decode(errors="replace").splitlines()
    if cut and lines:
        lines = lines[1:]
    out, skipped = [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            rec = None
        if isinstance(rec, dict):
            out.append(rec)
        else:
            skipped += 1
    return out, skipped


def write_atomic(path: str | Path, text: str | bytes, durable: bool = False) -> None:
    """Readers see the old file or the new one, never a part of it: the text (or bytes) goes to a
    temporary file beside `path` (unique per process and thread), which then replaces it. A failed
    write leaves no temporary file behind and raises the OSError. durable: fsync before the rename,
    so a machine that crashes right after cannot leave a renamed but empty file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(text.encode("utf-8") if isinstance(text, str) else text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


class DiskWriteError(UserError):
    """A file or folder could not be written (disk full, quota, file size limit, I/O error)."""

    exit_code = EXIT_FAILED


def _free_space(where: Path) -> str:
    try:
        return f"{shutil.disk_usage(where).free / 2**30:.1f} GiB free"
    except OSError:
        return "free space unknown"


def _what_failed(exc: OSError) -> str:
    """The OS error in words, and the file size limit (`ulimit -f`) where one is set."""
    what = exc.strerror or str(exc) or "a write failed"
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
        if soft != resource.RLIM_INFINITY:
            most = f"{soft / 2**20:.0f} MiB" if soft >= 2**20 else f"{soft} bytes"
            what += f"; this process may write files of at most {most} (ulimit -f)"
    except (ImportError, OSError, ValueError):
        pass
    return what


def disk_error_message(what: str, where: Path, exc: OSError, then: str = "") -> str:
    """The one line for a write that failed: what, where, why, the free space, and what to do."""
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = f"make {where} writable"
    else:
        fix = "free disk space, or raise the quota / file size limit (`ulimit -f`)"
    return f"could not write {what} in {where} ({_what_failed(exc)}; {_free_space(where)}): {fix}" + (
        f", {then}" if then else ""
    )


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


@contextlib.contextmanager
def disk_errors(
    what: str,
    where: str | Path,
    then: str | Callable[[], str] = "",
    remove: str | Path | None = None,
    error: type[UserError] = DiskWriteError,
) -> Iterator[None]:
    """An OSError inside (disk full, quota, `ulimit -f`, I/O error) becomes `error` with one line that
    says what to do; `remove` (a temporary file or folder) is deleted first, so the space comes back.
    `then`: what to do once the disk has room (a callable is asked after the removal)."""
    try:
        yield
    except OSError as exc:
        if remove is not None:
            _remove(Path(remove))
        then_text = then() if callable(then) else then
        raise error(disk_error_message(what, Path(where), exc, then_text)) from None


@contextlib.contextmanager
def publish_dir(
    final: str | Path,
    *,
    what: str | None = None,
    then: str | Callable[[], str] = "",
    tmp: str | Path | None = None,
    marker: str | None = None,
    error: type[UserError] = DiskWriteError,
) -> Iterator[Path]:
    """Build a folder under a temporary name; rename it to `final` only once it is whole.

        with publish_dir(run_dir / "best_model") as tmp:
            (tmp / "taehv.safetensors").write_bytes(data)

    Readers see the previous `final` or the new one, never a part of it. `tmp` (default
    `.tmp-<name>` beside `final`; one left by a killed attempt is removed first) is made empty and
    yielded. When the block ends, `marker` (an empty file, if named) is written in it last and it
    replaces `final`; a `final` that already holds `marker` (made meanwhile by another process) is
    kept and ours dropped. An OSError in the block or the rename (disk full ...) removes `tmp`, leaves
    `final` as it was and raises `error` in one line (disk_errors); any other exception removes
    `tmp` and goes on."""
    final = Path(final)
    tmp = Path(tmp) if tmp is not None else final.with_name(f".tmp-{final.name}")
    with disk_errors(what or final.name, final.parent, then, remove=tmp, error=error):
        try:
            _remove(tmp)
            tmp.mkdir(parents=True)
            yield tmp
            if marker is not None:
                (tmp / marker).touch()
            _swap_in(tmp, final, marker)
        finally:
            _remove(tmp)  # gone already when renamed


def _swap_in(tmp: Path, final: Path, marker: str | None) -> None:
    """Rename `tmp` to `final`. A previous `final` is first renamed aside (and put back if the rename
    fails), so it is never deleted before the new one is in place."""
    if marker is not None and (final / marker).is_file():
        return
    old = final.with_name(f".old-{final.name}") if final.exists() else None
    if old is not None:
        _remove(old)
        os.replace(final, old)
    try:
        os.replace(tmp, final)
    except OSError:
        if old is not None:
            os.replace(old, final)
        if marker is not None and (final / marker).is_file():
            return  # another process (without the lock) published it meanwhile: keep its copy
        raise
    if old is not None:
        _remove(old)
