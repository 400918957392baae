"""`taehv-launch index DATA_ROOT -o FILE`: list the videos once and write an annotation file.

A scan of millions of files on a shared filesystem takes minutes; an annotation file makes the
next jobs skip it (`--set data_root=DATA_ROOT --set annotation_file=FILE`). Paths are written
relative to DATA_ROOT, sorted, in the format of FILE's extension (.csv, .jsonl, .json, .txt: see
dataindex/listing.py, which says what each format holds). No torch and no OpenCV are imported.
"""

from __future__ import annotations

import os
import shlex
import time
from typing import Annotated

import typer

from ..errors import ConfigError, DataError, one_line
from ..files import write_atomic
from .core import app, exit_with


@app.command(
    "index",
    help="List the videos under DATA_ROOT once and write an annotation file (.csv, .jsonl, "
    ".json or .txt) that later jobs read instead of scanning: --set annotation_file=FILE.",
)
def index_cmd(
    data_root: Annotated[str, typer.Argument(help="the folder of videos (scanned recursively)", show_default=False)],
    output: Annotated[
        str,
        typer.Option(
            "-o", "--output", help="the annotation file to write; its extension picks the format", show_default=False
        ),
    ],
    force: Annotated[bool, typer.Option("--force", help="replace -o FILE if it exists")] = False,
) -> None:
    exit_with(lambda: write_index(data_root, output, force))


def write_index(data_root: str, output: str, force: bool = False) -> int:
    from ..dataindex.listing import (
        ANNOTATION_FORMATS,
        VIDEO_EXTENSIONS,
        annotation_text,
        is_utf8,
        scan,
        unfit,
    )

    root = _check_root(data_root)
    out = os.path.abspath(output)
    fmt = os.path.splitext(out)[1].lower()
    if os.path.isdir(out):
        raise ConfigError(f"-o {output} is a folder: give a file name, e.g. -o {os.path.join(output, 'videos.csv')}")
    if fmt not in ANNOTATION_FORMATS:
        raise ConfigError(f"-o {output}: name the file .csv, .jsonl, .json or .txt (the format follows the extension)")
    if os.path.lexists(out) and not force:
        raise ConfigError(f"-o {output} already exists: pass --force to replace it, or choose another name")
    parent = os.path.dirname(out)
    if not os.path.isdir(parent):
        raise ConfigError(f"-o {output}: folder {parent} does not exist: create it first")
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"-o {output}: folder {parent} is not writable: choose another place")
    start = time.monotonic()
    paths = scan(root)
    if not paths:
        raise DataError(f"no video files ({' '.join(VIDEO_EXTENSIONS)}) under {root}: point DATA_ROOT at your videos")
    rel = [os.path.relpath(p, root) for p in paths]
    bad = [p for p in rel if not is_utf8(p)]
    if bad:  # cv2.VideoCapture crashes on such a name: no annotation file should list it
        raise DataError(
            f"the name {_first(bad)} under {root} is not UTF-8 text (its bytes shown as \\xNN), and "
            f"OpenCV cannot open a file by such a name: rename it to a UTF-8 name, then run index again"
        )
    bad = [p for p in rel if unfit(fmt, p)]
    if bad:
        stem = os.path.splitext(output)[0]
        raise ConfigError(
            f"-o {output} cannot hold the name {_first(bad)}: {unfit(fmt, bad[0])}; "
            f"write {stem}.csv, {stem}.jsonl or {stem}.json instead, which hold every name exactly"
        )
    text = annotation_text(fmt, rel)
    try:
        write_atomic(out, text.encode("utf-8"))
    except OSError as err:
        raise ConfigError(f"cannot write {output} ({err.strerror or err}): choose another place") from None
    print(
        f"index: {len(rel):,} videos under {one_line(root)} listed in {time.monotonic() - start:.1f} s -> {one_line(out)}"
    )
    use = f"--set {shlex.quote('data_root=' + root)} --set {shlex.quote('annotation_file=' + out)}"
    print(f"use it with: {one_line(use)}")
    return 0


def _first(names: list[str]) -> str:
    """`'a\\nb.mp4'` or `'a\\nb.mp4' (and 3 more)`: the first of some names, escaped, for one line."""
    from ..dataindex.listing import name_text

    more = f" (and {len(names) - 1:,} more)" if len(names) > 1 else ""
    return f"'{name_text(names[0])}'{more}"


def _check_root(data_root: str) -> str:
    if not os.path.exists(data_root):
        raise DataError(f"DATA_ROOT {data_root} does not exist: give the folder that holds the videos")
    if not os.path.isdir(data_root):
        raise DataError(f"DATA_ROOT {data_root} is not a folder: give the folder that holds the videos")
    if not os.access(data_root, os.R_OK | os.X_OK):
        raise DataError(f"DATA_ROOT {data_root} cannot be read: check its permissions")
    return os.path.abspath(data_root)
