"""files.read_json / read_json_lines: the run directory's small records, whatever a crash, a full disk or a
hand edit left in their place (the readers of status, requeue-check, resume build on them)."""

from __future__ import annotations

import os

import pytest

from taehv_launch.files import BadRecord, read_json, read_json_lines, read_json_or_none


def test_a_record_and_what_is_wrong_with_a_bad_one(tmp_path):
    p = tmp_path / "r.json"
    p.write_text('{"step": 3}')
    assert read_json(p) == {"step": 3}
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "missing.json")
    cases = {
        b"": "not JSON",
        b"{trunc": "not JSON",
        b"\xff\xfe": "not UTF-8",
        b"[1, 2]": "holds a JSON array, not an object",
        b"null": "holds a JSON null, not an object",
        b'"x"': "holds a JSON string, not an object",
        b"[" * 200_000 + b"]" * 200_000: "nests too deeply",
    }
    for data, words in cases.items():
        p.write_bytes(data)
        with pytest.raises(BadRecord, match=words):
            read_json(p)
        assert read_json_or_none(p) is None
    p.write_text("[1]")
    assert read_json(p, want=list) == [1] and read_json(p, want=None) == [1]
    p.write_text(" " * 100)
    with pytest.raises(BadRecord, match="more than a record ever is"):
        read_json(p, limit=10)


def test_special_files_neither_block_nor_fill_memory(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # nobody writes it: a blocking open would wait forever
    with pytest.raises(BadRecord, match="not a regular file"):
        read_json(fifo)
    with pytest.raises(BadRecord, match="not a regular file"):
        read_json_lines(fifo)
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    assert read_json_or_none(zero) is None
    with pytest.raises(BadRecord):
        read_json_lines(zero)
    (tmp_path / "dir.json").mkdir()
    assert read_json_or_none(tmp_path / "dir.json") is None


def test_json_lines_skip_and_count_what_they_cannot_read(tmp_path):
    p = tmp_path / "e.jsonl"
    assert read_json_lines(p) == ([], 0)
    p.write_bytes(b'{"a": 1}\n\nnot json\n[1]\n\xff\xfe\n' + b"[" * 100_000 + b'\n{"a": 2}\n{"a": 3')
    assert read_json_lines(p) == ([{"a": 1}, {"a": 2}], 5)
    big = tmp_path / "big.jsonl"
    big.write_text("".join(f'{{"i": {i}}}\n' for i in range(1000)))
    recs, skipped = read_json_lines(big, limit=100)
    assert recs[-1] == {"i": 999} and skipped == 0 and len(recs) < 20  # the tail, from a whole line on
