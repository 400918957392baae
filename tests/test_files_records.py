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


def test_a_checkpoint_marker_or_state_that_is_not_ours_reads_as_incomplete(tmp_path):
    """COMPLETE and trainer_state.json hand-edited or torn: 'incomplete' / one CheckpointError line,
    never a traceback in a resume, `status` or the rotation."""
    from taehv_launch.errors import CheckpointError
    from taehv_launch.rundir.checkpoint import (
        COMPLETE,
        STATE_FILE,
        checkpoint_dir,
        checksum_problem,
        incomplete_reason,
        list_checkpoints,
        read_state,
        write_complete,
    )

    ckpt = checkpoint_dir(tmp_path, 10)
    ckpt.mkdir()
    (ckpt / STATE_FILE).write_text('{"world_size": 1, "zero_stage": 0}')
    write_complete(ckpt, 10)
    assert incomplete_reason(ckpt) is None and checksum_problem(ckpt) == (None, None)
    bad_markers = [
        b"[1]",
        b'{"files": "abc"}',
        b'{"files": [], "sizes": [1]}',
        b'{"files": [1]}',
        b"[" * 100_000,
        b"\xff",
    ]
    for bad in bad_markers:
        (ckpt / COMPLETE).write_bytes(bad)
        assert incomplete_reason(ckpt) == "unreadable COMPLETE marker", bad
        assert checksum_problem(ckpt) == ("unreadable COMPLETE marker", None)
        assert list_checkpoints(tmp_path)[0][2] == "unreadable COMPLETE marker"
    for bad in ("[1]", "[" * 100_000, '{"world_size": "x", "zero_stage": 0}', '{"world_size": 1e999, "zero_stage": 0}'):
        (ckpt / STATE_FILE).write_text(bad)
        with pytest.raises(CheckpointError, match="has no readable trainer_state.json"):
            read_state(ckpt)
