"""nvdec_skip's pure parts on the CPU: which packets a clip needs (the GPU check is scripts/nvdec_skip_check.py)."""

from __future__ import annotations

import pytest
from conftest import testdata_videos

from taehv_launch.train.data.nvdec_skip import NOPTS, Table, Tables, nal_ref_idc, plan_feed


def annexb(*nals: bytes) -> bytes:
    return b"".join(b"\x00\x00\x00\x01" + n for n in nals)


def avcc(*nals: bytes) -> bytes:
    return b"".join(len(n).to_bytes(4, "big") + n for n in nals)


SEI, SPS, PPS = bytes([0x06, 5, 1]), bytes([0x67, 66, 0]), bytes([0x68, 0xCE])
IDR, P_REF, B_REF, B_NONREF = bytes([0x65, 0x88]), bytes([0x41, 0x9A]), bytes([0x21, 0x9E]), bytes([0x01, 0x9E])


@pytest.mark.parametrize("wrap", [annexb, avcc])
def test_nal_ref_idc_reads_the_first_slice_after_parameter_sets_and_sei(wrap):
    assert nal_ref_idc(wrap(SPS, PPS, SEI, IDR)) == 3
    assert nal_ref_idc(wrap(P_REF)) == 2
    assert nal_ref_idc(wrap(B_REF)) == 1
    assert nal_ref_idc(wrap(SEI, B_NONREF)) == 0
    assert nal_ref_idc(wrap(SEI)) is None  # no slice header in the bytes read: the packet is decoded
    assert nal_ref_idc(b"") is None


def test_nal_ref_idc_three_byte_start_codes_and_a_zero_length_prefix():
    assert nal_ref_idc(b"\x00\x00\x01" + SEI + b"\x00\x00\x01" + B_NONREF) == 0
    assert nal_ref_idc(b"\x00\x00\x00\x00\x06") is None  # a zero length: not a stream this reads


def test_real_files_non_reference_pictures_where_the_encoder_wrote_b_frames():
    """OpenCV's raw packets of the test videos: x264 streams with B-frames have non-reference pictures,
    an IPPP stream (fire2.mp4) has none, and every packet has a slice header within the bytes read."""
    cv2 = pytest.importorskip("cv2")
    seen = {}
    for name in ("chaplin.mp4", "example2.mp4", "fire2.mp4"):
        path = testdata_videos() / name
        cap = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG, [cv2.CAP_PROP_FORMAT, -1])
        refs = []
        while len(refs) < 48 and cap.grab():
            ok, data = cap.retrieve()
            assert ok
            refs.append(nal_ref_idc(bytes(data.reshape(-1)[:4096])))
        cap.release()
        seen[name] = refs
    assert all(r is not None for refs in seen.values() for r in refs)
    assert seen["chaplin.mp4"][0] == 3 and seen["chaplin.mp4"].count(0) >= 10
    assert seen["example2.mp4"].count(0) >= 10
    assert seen["fire2.mp4"].count(0) == 0


def ibbp(frames: int, keys_at: tuple[int, ...] = (0,)) -> Table:
    """A decode-order table as x264 writes 3 B-frames: display I0 B1 B2 B3 P4 ... coded I0 P4 B2 B1 B3 ...;
    pts = 10 x the display index."""
    order, k = [], 0
    while k < frames:
        order.append(k)
        group = [k + 4, k + 2, k + 1, k + 3] if k + 4 < frames else list(range(k + 1, frames))
        order += [g for g in group if g < frames]
        k += 4
    seen, dec = set(), []
    for g in order:
        if g not in seen:
            seen.add(g)
            dec.append(g)
    table = Table.of([10 * g for g in dec], [g in keys_at for g in dec])
    assert table is not None
    return table


def test_plan_feed_starts_at_the_last_keyframe_not_after_the_clip_and_maps_timestamps_to_frames():
    table = ibbp(48, keys_at=(0, 24))
    start, want = plan_feed(table, (30, 31, 32))
    assert table.pts[start] == 240 and table.keys[start]
    assert want == {300: 30, 310: 31, 320: 32}
    start, want = plan_feed(table, (5, 7, 9))
    assert start == 0 and want == {50: 5, 70: 7, 90: 9}
    start, _ = plan_feed(table, (24,))
    assert table.pts[start] == 240


def test_plan_feed_refuses_what_the_table_cannot_give():
    table = ibbp(20)
    assert plan_feed(table, (19, 20)) is None  # past the last frame
    assert plan_feed(table, (-1, 0)) is None
    assert plan_feed(table, ()) is None
    late_key = Table.of([0, 10, 20], [False, True, False])  # a file whose first packets are no keyframe
    assert plan_feed(late_key, (0, 1)) is None
    assert plan_feed(late_key, (1, 2))[0] == 1


def test_table_refuses_timestamps_that_number_no_frames():
    assert Table.of([0, 10, 10], [True, False, False]) is None  # repeated
    assert Table.of([0, NOPTS, 20], [True, False, False]) is None  # missing
    assert Table.of([0, 10], [False, False]) is None  # no keyframe
    assert Table.of([], []) is None
    assert Table.of([20, 0, 10], [True, False, False]).order == (0, 10, 20)


def test_tables_keep_the_most_recently_used():
    cache, built = Tables(limit=2), []

    def build(name):
        return lambda: built.append(name) or name

    for name in ("a", "b", "a", "c", "a", "b"):
        assert cache.get(name, build(name)) == name
    assert built == ["a", "b", "c", "b"]  # "b" was dropped when "c" came (a was used after b)
    assert list(cache.items) == ["a", "b"]
