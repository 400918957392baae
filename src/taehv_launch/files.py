"""Writing files that other processes read while we write them (one rule for the whole package)."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path


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
