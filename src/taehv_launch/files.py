"""Writing files that other processes read while we write them (one rule for the whole package)."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path


def write_atomic(path: str | Path, text: str) -> None:
    """Readers see the old file or the new one, never a part of it: the text goes to a temporary
    file beside `path` (unique per process and thread), which then replaces it. A failed write
    leaves no temporary file behind and raises the OSError."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
