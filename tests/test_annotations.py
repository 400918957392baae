"""The annotation round trip of hostile names (#35 item 3) and annotation errors (item 4), on real files.

Real video files (one tiny clip written with OpenCV, copied to every name) whose names hold what a file
system allows and line-based formats trip on: CR, LF, U+2028, U+2029, NEL, VT/FF/FS, tab, quotes,
commas, a leading space or dash, ESC, a backslash, %d, a header look-alike, in a hostile sub-folder too.
`taehv-launch index` (the real CLI) writes each annotation format; the trainer's reader must give every
path back exactly and OpenCV must open it (the trainer's own start-up probe), or `index` refuses the
name in one line that names it (escaped) and the formats that hold it.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest

from conftest import assert_one_line_error, clean_env, overrides, run_cli
from taehv_launch.dataindex.index import build_index
from taehv_launch.dataindex.listing import read_annotation, scan
from taehv_launch.errors import DataError
from taehv_launch.train.data.probe import usable_entries

LINE_BREAKS = ["cr\rx.mp4", "lf\nx.mp4", "crlf\r\nx.mp4", "sub,dir\n/inner\r.mp4", "sub,dir\n/ok.mp4"]  # not in .txt
HOSTILE = [
    "ls\u2028x.mp4",
    "ps\u2029x.mp4",
    "nel\u0085x.mp4",
    "vt\x0bff\x0cfs\x1cgs\x1drs\x1ex.mp4",  # str.splitlines() breaks at each of these
    "tab\tx.mp4",
    'dq"x.mp4',
    '"quoted".mp4',
    "sq'x.mp4",
    "comma,x.mp4",
    " lead space.mp4",
    "-dash.mp4",
    "--force.mp4",
    "#hash.mp4",
    "esc\x1b[31mx.mp4",
    "back\\slash.mp4",
    "pct%03d.mp4",
    "视频 ü.mp4",
    '{"path": 1}.mp4',
    "path/x.mp4",  # a folder named like the CSV header
    "sub, dir\u2028\t/ok.mp4",
    "plain.mp4",
]
NOT_UTF8 = b"bad\xff\xfe.mp4"
FORMATS = (".csv", ".json", ".jsonl", ".txt")


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    """A real 3-frame 32x32 video (written under a plain name: cv2.VideoWriter crashes on a name that is
    not UTF-8, so the hostile names are copies)."""
    path = tmp_path_factory.mktemp("clip") / "clip.mp4"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 8, (32, 32))
    assert writer.isOpened()
    for k in range(3):
        writer.write(np.full((32, 32, 3), 60 * k, np.uint8))
    writer.release()
    return path


def _tree(root: Path, clip: Path, names: list[str], raw: list[bytes] = ()) -> Path:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(clip, root / name)
    for name in raw:
        shutil.copy(clip, os.path.join(os.fsencode(root), name))
    return root


def _index(root: Path, out: Path):
    return run_cli("index", str(root), "-o", str(out), env=clean_env(), timeout=120)


def _round_trips(root: Path, out: Path, tmp_path: Path) -> None:
    """What the trainer reads from `out` is exactly the scan of `root`, and OpenCV opens every path."""
    scanned = scan(str(root))
    listed, counts = read_annotation(str(out))
    assert listed == [os.path.relpath(p, root) for p in scanned] and counts == [-1] * len(scanned)
    index = build_index(str(root), str(out), str(tmp_path / f"cache{out.suffix}"))
    assert [e.path for e in index] == scanned and index.missing == 0
    assert usable_entries(index, 3) == list(index)  # the trainer's start-up probe: every file decodes
    out.read_bytes().decode("utf-8")  # valid UTF-8: other tools read it too


@pytest.mark.parametrize("fmt", [".csv", ".json", ".jsonl"])
def test_index_round_trips_every_hostile_name(tmp_path: Path, clip: Path, fmt: str):
    root = _tree(tmp_path / "data", clip, HOSTILE + LINE_BREAKS)
    out = tmp_path / f"videos{fmt}"
    done = _index(root, out)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert f"index: {len(HOSTILE + LINE_BREAKS)} videos under {root}" in done.stdout
    _round_trips(root, out, tmp_path)
    text = out.read_bytes().decode("utf-8")  # not read_text(): that would turn a CR into LF
    want = sorted(os.path.relpath(p, root) for p in scan(str(root)))
    if fmt == ".csv":  # RFC 4180 quoting: the stdlib's reader (as other tools) reads the same names
        assert [row[0] for row in csv.reader(io.StringIO(text, newline=""))][1:] == want
    if fmt == ".jsonl":  # U+2028, NEL ... escaped: a reader that splits at every Unicode line break still works
        assert [json.loads(line)["path"] for line in text.splitlines()] == want
    if fmt == ".json":
        assert len(text.splitlines()) == 1 and [e["path"] for e in json.loads(text)["list"]] == want


def test_txt_refuses_a_line_break_in_one_line_and_round_trips_the_rest(tmp_path: Path, clip: Path):
    root = _tree(tmp_path / "data", clip, HOSTILE + LINE_BREAKS)
    out = tmp_path / "videos.txt"
    assert_one_line_error(
        _index(root, out),
        r"^error: -o .*videos\.txt cannot hold the name 'cr\\rx\.mp4' \(and 4 more\): a line break in the "
        r"name, and \.txt is one path per line; write .*videos\.csv, .*videos\.jsonl or .*videos\.json instead",
    )
    assert not out.exists()
    for name in LINE_BREAKS:
        os.remove(root / name)
    done = _index(root, out)
    assert done.returncode == 0, done.stderr
    _round_trips(root, out, tmp_path)
    out.write_bytes(out.read_bytes().replace(b"\n", b"\r\n"))  # saved by a Windows editor: the same names
    assert read_annotation(str(out))[0] == [os.path.relpath(p, root) for p in scan(str(root))]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_name_that_is_not_utf8_is_refused_in_one_line(tmp_path: Path, clip: Path, fmt: str):
    """OpenCV cannot open such a name (cv2.VideoCapture crashed the process on one: SIGSEGV), so no format
    lists it: one line naming it with its bytes as \\xNN, nothing written."""
    root = _tree(tmp_path / "data", clip, ["ok.mp4", "sub/ok2.mp4"], [NOT_UTF8])
    out = tmp_path / f"videos{fmt}"
    assert_one_line_error(
        _index(root, out),
        r"^error: the name 'bad\\xff\\xfe\.mp4' under .* is not UTF-8 text .* OpenCV cannot open a file by such "
        r"a name: rename it to a UTF-8 name",
    )
    assert not out.exists()


def test_listed_names_that_are_not_utf8_are_left_out_with_one_line(tmp_path: Path, clip: Path, caplog):
    """Hand-written lists with such a name (raw bytes in .txt/.csv, a \\udcff escape in JSON): left out with
    one escaped warning line; the trainer never hands the name to OpenCV."""
    root = _tree(tmp_path / "data", clip, ["ok.mp4"], [NOT_UTF8])
    files = {
        "a.txt": b"ok.mp4\n" + NOT_UTF8 + b"\n",
        "a.csv": b"path\nok.mp4\n" + NOT_UTF8 + b"\n",
        "a.json": b'{"list": [{"path": "ok.mp4"}, {"path": "bad\\udcff\\udcfe.mp4"}]}',
        "a.jsonl": b'{"path": "ok.mp4"}\n{"path": "bad\\udcff\\udcfe.mp4"}\n',
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        caplog.clear()
        with caplog.at_level("WARNING", logger="taehv_launch.dataindex.index"):
            index = build_index(str(root), str(tmp_path / name), "")
        assert [e.path for e in index] == [str(root / "ok.mp4")], name
        (line,) = [r.getMessage() for r in caplog.records]
        assert "1 of 2 videos listed in" in line and "bad\\xff\\xfe.mp4" in line and line.isprintable(), line


CONTROL = "gone\x1b[31mRED\x00nul\nnl\r\x7f.mp4"  # ESC, NUL, LF, CR, DEL: what a terminal must not get raw


def _no_raw_control(text: str) -> None:
    assert all(c.isprintable() or c == "\n" for c in text), repr(text)
    assert "\\x1b[31mRED\\x00nul\\nnl\\r\\x7f.mp4" in text, text


def test_annotation_error_lines_escape_control_characters(tmp_path: Path, clip: Path, caplog):
    root = _tree(tmp_path / "data", clip, ["ok.mp4"])
    ann = tmp_path / "ann.json"
    ann.write_text(json.dumps({"list": [{"path": "ok.mp4"}, {"path": CONTROL}]}))
    with caplog.at_level("WARNING", logger="taehv_launch.dataindex.index"):
        assert len(build_index(str(root), str(ann), "")) == 1
    (line,) = [r.getMessage() for r in caplog.records]
    _no_raw_control(line)
    ann.write_text(json.dumps({"list": [{"path": CONTROL}]}))
    with pytest.raises(DataError) as err:  # validate-env prints this message as it is
        build_index(str(root), str(ann), "")
    _no_raw_control(str(err.value))
    ann.write_text(json.dumps({"list": [{"file": CONTROL}]}))
    with pytest.raises(DataError, match=r'entry 0 is \{"file": "gone\\u001b') as err:
        build_index(str(root), str(ann), "")
    assert str(err.value).isprintable()
    bad = tmp_path / "ann.csv"
    bad.write_text("path,frame_count\nok.mp4,1\x1b[31m\x00x\n")
    with pytest.raises(DataError, match=r"line 2 has frame count '1\\x1b\[31m\\x00x'") as err:
        build_index(str(root), str(bad), "")
    assert str(err.value).isprintable()


def _cache_dry_run(tmp_path: Path, root: Path, ann: Path):
    return run_cli(
        "cache",
        "1",
        "cpu",
        "--dry-run",
        *overrides(
            f"data_root={root}",
            f"annotation_file={ann}",
            f"latent_cache={tmp_path / 'lat'}",
            f"output_dir={tmp_path / 'output'}",
        ),
        env=clean_env(),
        cwd=tmp_path,
        timeout=120,
    )


def test_the_left_out_line_is_escaped_on_the_console(tmp_path: Path, clip: Path):
    """Through the CLI: the warning about listed files that are gone is one escaped line on stderr."""
    root = _tree(tmp_path / "data", clip, ["ok.mp4"])
    ann = tmp_path / "ann.jsonl"
    ann.write_text(json.dumps({"path": "ok.mp4"}) + "\n" + json.dumps({"path": CONTROL}) + "\n")
    done = _cache_dry_run(tmp_path, root, ann)
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if "do not exist" in x]
    _no_raw_control(line)
    assert "\x1b" not in done.stderr + done.stdout and "\x00" not in done.stderr + done.stdout


DEEP = 100_000


@pytest.mark.parametrize(
    "name,text,message",
    [
        ("deep.json", '{"list": ' + "[" * DEEP + "]" * DEEP + "}", r"deep\.json nests too deeply"),
        ("deep.jsonl", '{"path": "ok.mp4"}\n' + "[" * DEEP + "]" * DEEP + "\n", r"deep\.jsonl: line 2 nests too"),
        ("cr.csv", "path\nok.mp4\nbare\rcr.mp4\n", r"cr\.csv: line 3 is not CSV \(new-line character seen"),
        ("big.json", '{"list": [{"path": "ok.mp4", "frame_count": 10000000000}]}', r"frame_count 10000000000"),
        ("big.csv", "ok.mp4,10000000000\n", r"line 1 has frame count '10000000000'"),
    ],
)
def test_bad_annotation_files_are_one_line_exit_2(tmp_path: Path, clip: Path, name: str, text: str, message: str):
    """A deeply nested JSON was a RecursionError (exit 1), a bare CR in a CSV field a _csv.Error traceback,
    a frame count past int32 an OverflowError: now each is one error line, exit 2."""
    root = _tree(tmp_path / "data", clip, ["ok.mp4"])
    (tmp_path / name).write_text(text, newline="")
    with pytest.raises(DataError, match=message):
        build_index(str(root), str(tmp_path / name), "")
    assert_one_line_error(_cache_dry_run(tmp_path, root, tmp_path / name), r"^error: annotation_file .*" + message)


def test_a_byte_order_mark_is_not_part_of_the_first_path(tmp_path: Path):
    files = {
        "a.csv": "path\nok.mp4\nb.mp4\n",
        "a.txt": "ok.mp4\nb.mp4\n",
        "a.jsonl": '{"path": "ok.mp4"}\n{"path": "b.mp4"}\n',
        "a.json": '{"list": [{"path": "ok.mp4"}, {"path": "b.mp4"}]}',
    }
    for name, text in files.items():  # as a Windows editor saves them
        (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + text.encode())
        assert read_annotation(str(tmp_path / name))[0] == ["ok.mp4", "b.mp4"], name


@pytest.mark.slow
def test_the_trainer_refuses_a_deeply_nested_annotation_in_one_line(tmp_path: Path, clip: Path):
    """Through `accelerate launch` and the trainer (which listed the annotation file with a RecursionError
    traceback, exit 1): the trainer's one line, the launcher's one error line, exit 2."""
    from trainrun import launch

    root = _tree(tmp_path / "data", clip, ["ok.mp4"])
    ann = tmp_path / "deep.json"
    ann.write_text('{"list": ' + "[" * DEEP + "]" * DEEP + "}")
    proc, _ = launch(tmp_path, 1, *overrides(f"data_root={root}", f"annotation_file={ann}"))
    assert_one_line_error(proc, r"^error: annotation_file .*deep\.json nests too deeply")
    assert "[rank 0] error: annotation_file" in proc.stdout and "Traceback" not in proc.stdout
