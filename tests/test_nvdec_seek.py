"""nvdec_seek on the CPU: which packets a clip needs, and how the cutter feeds them (the GPU check, against
SimpleDecoder byte for byte, is scripts/nvdec_seek_check.py; docs/benchmarks.md has its runs). The feeding tests
stand a scripted demuxer and decoder in for PyNvVideoCodec, which needs NVDEC: they check what reaches the decoder
(which packets, flagged how), not the decoding."""

from __future__ import annotations

import ctypes
import types

import pytest
import torch

from taehv_launch.train.data import nvdec_seek
from taehv_launch.train.data.nvdec_seek import NOPTS, SeekCutter, Table, Tables, nal_ref_idc, plan_feed


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


def test_nal_ref_idc_three_byte_start_codes_a_zero_length_prefix_and_lengths_that_look_like_start_codes():
    assert nal_ref_idc(b"\x00\x00\x01" + SEI + b"\x00\x00\x01" + B_NONREF) == 0
    assert nal_ref_idc(b"\x00\x00\x00\x00\x06") is None  # a zero length: not a stream this reads
    long_p = P_REF + bytes(255)  # 257 bytes: its length prefix 00 00 01 01 reads as a start code and a B slice
    assert nal_ref_idc(avcc(long_p)) is None  # the two readings disagree: not known, so the packet is decoded
    assert nal_ref_idc(avcc(SEI + bytes(300), B_NONREF)) is None  # 00 00 01 2f...: Annex B finds no slice
    assert nal_ref_idc(annexb(long_p)) == 2
    # a 3-byte start code, SEI, then a reference P, 266 bytes: its first 4 bytes also read as a length to the end
    three = b"\x00\x00\x01" + bytes([0x06, 1, 4, 0, 0, 0, 0, 0x80]) + b"\x00\x00\x01" + P_REF
    assert nal_ref_idc(three + b"\x55" * (266 - len(three))) is None and nal_ref_idc(three + b"\x55" * 9) == 2


def test_real_files_non_reference_pictures_where_the_encoder_wrote_b_frames(videos):
    """OpenCV's raw packets of the test videos: x264 streams with B-frames have non-reference pictures, an IPPP
    stream (fire2.mp4) has none, and every packet has a slice header within the bytes the cutter reads."""
    cv2 = pytest.importorskip("cv2")
    seen = {}
    for name in ("chaplin.mp4", "example2.mp4", "fire2.mp4"):
        cap = cv2.VideoCapture(str(videos / name), cv2.CAP_FFMPEG, [cv2.CAP_PROP_FORMAT, -1])
        refs = []
        while len(refs) < 48 and cap.grab():
            ok, data = cap.retrieve()
            assert ok
            refs.append(nvdec_seek._nal_ref(Packet(0, False, bytes(data.reshape(-1)))))
        cap.release()
        seen[name] = refs
    assert all(r is not None for refs in seen.values() for r in refs)
    assert seen["chaplin.mp4"][0] == 3 and seen["chaplin.mp4"].count(0) >= 10
    assert seen["example2.mp4"].count(0) >= 10
    assert seen["fire2.mp4"].count(0) == 0


def ibbp(frames: int, keys_at: tuple[int, ...] = (0,)) -> tuple[list[int], list[bytes], list[bool]]:
    """x264's 3 B-frames with a pyramid, display I0 B1 B2 B3 P4 ... coded I0 P4 B2 B1 B3 ... (B2 a reference, B1
    and B3 not), each group before a keyframe closed (its last picture a P coded first), as x264's closed GOPs:
    display indices in decode order, each packet's slice, and key flags."""
    order, kind, g = [0], {0: IDR}, 0
    while g + 1 < frames:
        key = min((k for k in keys_at if g < k <= g + 4), default=None)
        if key is not None:  # close the group: P (key - 1) first, the B-frames between, then the keyframe
            if key - 1 > g:
                order.append(key - 1)
                kind[key - 1] = P_REF
                order += range(g + 1, key - 1)
            order.append(key)
            kind[key], g = IDR, key
        elif g + 4 < frames:
            order += [g + 4, g + 2, g + 1, g + 3]
            kind.update({g + 4: P_REF, g + 2: B_REF})
            g += 4
        else:
            order.append(frames - 1)
            kind[frames - 1] = P_REF
            order += range(g + 1, frames - 1)
            g = frames
    kinds = [kind.get(d, B_NONREF) for d in order]
    assert sorted(order) == list(range(frames))
    return order, kinds, [d in keys_at for d in order]


def table_of(frames=48, keys_at=(0, 24), size=(1080, 1920)) -> Table:
    order, _, keys = ibbp(frames, keys_at)
    table = Table.of([10 * g for g in order], keys, size)
    assert table is not None
    return table


def test_plan_feed_starts_at_the_last_keyframe_not_after_the_clip_and_maps_timestamps_to_frames():
    table = table_of()
    start, want = plan_feed(table, (30, 31, 32))
    assert table.pts[start] == 240 and start in table.keyat
    assert want == {300: 30, 310: 31, 320: 32}
    start, want = plan_feed(table, (5, 7, 9))
    assert start == 0 and want == {50: 5, 70: 7, 90: 9}
    start, _ = plan_feed(table, (24,))
    assert table.pts[start] == 240


def test_plan_feed_refuses_what_the_table_cannot_give():
    table = table_of(20, (0,))
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
    assert Table.of([0, 10], [True]) is None  # flags that do not match the packets
    assert Table.of([], []) is None
    table = Table.of([20, 0, 10], [True, False, False])
    assert list(table.order) == [0, 10, 20] and list(table.keyat) == [0] and len(table) == table.frames() == 3
    assert Table.of(list(range(100)), [True] * 100, complete=False).frames() == 100 - nvdec_seek.REORDER


def test_tables_keep_the_most_recently_used_within_their_frames():
    cache, built = Tables(frames=4), []

    def build(name, frames):
        return lambda: built.append(name) or Table.of(list(range(frames)), [True] * frames)

    for name in ("a", "b", "a", "c", "a", "b"):
        assert cache.get(name, build(name, 2)) is not None
    assert built == ["a", "b", "c", "b"]  # "b" was dropped when "c" came ("a" was used after "b")
    assert list(cache.items) == ["a", "b"] and cache.held == 4
    assert cache.get("big", build("big", 9)) is not None  # larger than the budget alone: kept, the rest dropped
    assert list(cache.items) == ["big"] and cache.held == 9
    assert cache.get("none", lambda: None) is None and "none" in cache.items  # "not H.264" is remembered too


# A scripted PyNvVideoCodec: packets with real bytes behind bsl_data; a decoder that returns pictures in display
# order two packets late, never the ones flagged discardable, and flushes on an empty packet.


class Packet:
    def __init__(self, pts: int, key: bool, data: bytes):
        self._buf = ctypes.create_string_buffer(data, len(data))
        self.pts, self.key, self.bsl, self.discardable = pts, int(key), len(data), False
        self.bsl_data = ctypes.addressof(self._buf)


class Frame:
    """An NV12 surface (h * 3 / 2 rows of w bytes) whose first 8 bytes hold its timestamp."""

    def __init__(self, pts: int, size: tuple[int, int], dtype=torch.uint8):
        self.pts, self.tensor = pts, torch.zeros((size[0] * 3 // 2, size[1]), dtype=dtype)
        self.tensor[0, :8] = torch.tensor(list(pts.to_bytes(8, "little")), dtype=dtype)

    def getPTS(self):
        return self.pts

    def __dlpack__(self, *args, **kwargs):
        return self.tensor.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()


def stamp(plane: torch.Tensor) -> int:
    return int.from_bytes(bytes(plane[0, :8].tolist()), "little")


class Decoder:
    def __init__(self, nvc):
        self.nvc, self.held = nvc, []
        self.size = nvc.opened["size"]  # the stream its demuxer was opened on

    def Decode(self, pkt):
        if not pkt.bsl:
            out, self.held = sorted(self.held), []
        else:
            self.nvc.fed.append((pkt.pts, pkt.discardable))
            self.held.append((pkt.pts, pkt.discardable))
            out = []
            if len(self.held) > 2:
                self.held.sort()
                out = [self.held.pop(0)]
        return [Frame(p, self.size, self.nvc.dtype) for p, discard in out if not discard and p not in self.nvc.lose]


class Demuxer:
    def __init__(self, nvc, path):
        self.nvc, self.file = nvc, nvc.files[path]
        nvc.opened = self.file

    def __iter__(self):
        yield Packet(0, False, b"")  # a packet without data (as the demuxer gives at times): not counted
        yield from (Packet(pts, key, data) for pts, key, data in self.file["packets"])

    def GetNvCodecId(self):
        return self.file.get("codec", 4)  # cudaVideoCodec_H264

    def Height(self):
        return self.file["size"][0]

    def Width(self):
        return self.file["size"][1]


STREAM = types.SimpleNamespace(cuda_stream=0)  # what CreateDecoder is given: the thread's stream


def scripted(tmp_path, **files):
    nvc = types.SimpleNamespace(files={}, fed=[], lose=set(), made=0, cudaVideoCodec=types.SimpleNamespace(H264=4))
    nvc.dtype, nvc.decoders = torch.uint8, []
    nvc.CreateDemuxer = lambda path: Demuxer(nvc, path)
    nvc.PacketData = lambda: Packet(0, False, b"")

    def create(**kwargs):
        nvc.made += 1
        nvc.decoders.append(Decoder(nvc))
        return nvc.decoders[-1]

    nvc.CreateDecoder = create
    paths = {}
    for name, spec in files.items():
        path = tmp_path / f"{name}.mp4"
        path.write_bytes(name.encode())  # the table cache keys on the file's size and time
        order, kinds, keys = ibbp(spec.get("frames", 48), spec.get("keys_at", (0, 24)))
        packets = [(10 * g, key, avcc(SEI, kind) if key else avcc(kind)) for g, kind, key in zip(order, kinds, keys)]
        nvc.files[str(path)] = {"packets": spec.get("packets", packets), "size": spec.get("size", (720, 1280))}
        nvc.files[str(path)].update({k: v for k, v in spec.items() if k == "codec"})
        paths[name] = str(path)
    return nvc, paths


@pytest.fixture(autouse=True)
def fresh_bookkeeping(monkeypatch):
    """Each test with the process-wide give-ups and notes empty."""
    monkeypatch.setattr(nvdec_seek, "GIVEN_UP", {})
    monkeypatch.setattr(nvdec_seek, "_notes", [])
    monkeypatch.setattr(nvdec_seek, "_reasons", set())


def test_the_cutter_maps_only_the_clips_pictures_and_leaves_unused_non_reference_ones_out(tmp_path):
    nvc, paths = scripted(tmp_path, a={})
    cutter = SeekCutter(nvc, 0, STREAM)
    table = cutter.table(paths["a"])
    planes, size = cutter.planes(paths["a"], table, (29, 30, 31))
    assert size == (720, 1280) and all(p.shape == (1080, 1280) for p in planes)
    assert [stamp(p) for p in planes] == [290, 300, 310]
    fed = dict(nvc.fed)
    assert min(fed) == 240  # from the keyframe before the clip, nothing before it
    assert all(not fed[p] for p in (290, 300, 310))  # the clip's pictures: mapped
    assert all(fed[p] for p in fed if p not in (290, 300, 310))  # every other picture fed: discardable
    nonref = {10 * g for g, kind in zip(*ibbp(48, (0, 24))[:2]) if kind == B_NONREF}
    assert not (nonref & set(fed) - {290, 300, 310})  # unused non-reference pictures never reach NVDEC
    assert 250 not in fed and 260 in fed and 280 in fed  # B1 left out; the reference B2 and the P4 fed
    assert max(fed) <= 360  # stops once the clip's frames are out: no packet of the groups after it
    assert not nvc.decoders[0].held  # and drains the session with an empty packet: the next clip starts clean
    assert cutter.sent == len(fed) and nvc.made == 1
    cutter.planes(paths["a"], table, (2, 3))
    assert nvc.made == 1  # the session is kept for the next clip of that size


def test_the_cutter_hands_back_what_it_cannot_plan_and_fails_loudly_on_a_file_unlike_its_table(tmp_path, monkeypatch):
    nvc, paths = scripted(tmp_path, a={}, odd={}, small={"size": (480, 720)}, vp9={"codec": 10})
    cutter = SeekCutter(nvc, 0, STREAM)
    assert cutter.table(paths["small"]) is None and cutter.table(paths["vp9"]) is None  # SimpleDecoder's files
    table = cutter.table(paths["a"])
    assert table.complete and table.frames() == 48
    assert cutter.planes(paths["a"], table, (47, 48)) is None  # past the end: SimpleDecoder's to refuse
    monkeypatch.setattr(nvdec_seek, "SCAN_LIMIT", 10)
    assert cutter.planes(paths["a"], table, (30, 31)) is None  # its keyframe too far in to demux up to
    assert not nvc.fed
    monkeypatch.undo()
    odd = cutter.table(paths["odd"])
    nvc.files[paths["odd"]]["packets"][26] = (999, False, avcc(P_REF))  # the file changed under its table
    with pytest.raises(nvdec_seek.PathFailed, match="packet 26"):
        cutter.planes(paths["odd"], odd, (30, 31))
    assert not cutter.decoders  # a failed session is not reused
    nvc.lose.add(300)
    with pytest.raises(nvdec_seek.PathFailed, match="gave 1 of the 2 frames"):
        cutter.planes(paths["a"], table, (29, 30))
    nvc.lose.clear()
    nvc.dtype = torch.int16  # surfaces of another depth: SimpleDecoder refuses such files, so does this path
    with pytest.raises(nvdec_seek.PathFailed, match="not 8-bit 4:2:0"):
        cutter.planes(paths["a"], table, (29, 30))


def test_decoding_starts_at_idr_pictures_only(tmp_path):
    """An open GOP's keyframe (an I picture, not IDR) is no start: its packet may lack the parameter sets."""
    nvc, paths = scripted(tmp_path, open={})
    order, kinds, keys = ibbp(48, (0, 24))
    nvc.files[paths["open"]]["packets"] = [
        (10 * g, key, avcc(SEI, IDR if g == 0 else bytes([0x61, 0x88])) if key else avcc(kind))
        for g, kind, key in zip(order, kinds, keys)
    ]
    cutter = SeekCutter(nvc, 0, STREAM)
    table = cutter.table(paths["open"])
    assert list(table.keyat) == [0]
    planes, _ = cutter.planes(paths["open"], table, (30, 31))
    assert [stamp(p) for p in planes] == [300, 310] and min(dict(nvc.fed)) == 0


def test_a_picture_that_never_comes_stops_the_feed_past_the_table(tmp_path, monkeypatch):
    monkeypatch.setattr(nvdec_seek, "SCAN_LIMIT", 40)
    monkeypatch.setattr(nvdec_seek, "REORDER", 8)
    nvc, paths = scripted(tmp_path, long={"frames": 400, "keys_at": (0, 24)})
    cutter = SeekCutter(nvc, 0, STREAM)
    table = cutter.table(paths["long"])
    nvc.lose.add(370)
    with pytest.raises(nvdec_seek.PathFailed, match="gave 1 of the 2 frames"):
        cutter.planes(paths["long"], table, (36, 37))
    assert max(dict(nvc.fed)) < 10 * (48 + 8 + 4)  # not the rest of the file's 400 pictures


def test_a_long_file_is_read_only_as_far_as_the_path_can_use_it(tmp_path, monkeypatch):
    """Its table stops SCAN_LIMIT + REORDER packets in: frames the table cannot number go to SimpleDecoder."""
    monkeypatch.setattr(nvdec_seek, "SCAN_LIMIT", 40)
    monkeypatch.setattr(nvdec_seek, "REORDER", 8)
    nvc, paths = scripted(tmp_path, long={"frames": 200, "keys_at": (0, 24, 100)})
    cutter = SeekCutter(nvc, 0, STREAM)
    table = cutter.table(paths["long"])
    assert len(table) == 48 and not table.complete and table.frames() == 40
    assert list(table.order)[:40] == [10 * g for g in range(40)]  # the frames it numbers, numbered right
    planes, _ = cutter.planes(paths["long"], table, (36, 37, 38, 39))
    assert [stamp(p) for p in planes] == [360, 370, 380, 390]
    assert cutter.planes(paths["long"], table, (38, 40)) is None  # frame 40: past what the table numbers
    assert cutter.planes(paths["long"], table, (150, 151)) is None


def test_the_decoder_takes_the_path_where_it_pays_and_gives_a_file_up_for_good_once(tmp_path, monkeypatch):
    from taehv_launch.train.data.nvdec import NvdecDecoder

    nvc, paths = scripted(tmp_path, big={}, small={"size": (360, 640)}, broken={}, broken2={})
    dec = object.__new__(NvdecDecoder)  # the decoder without its CUDA stream: the path's choice only
    dec.nvc, dec.device, dec.stream, dec.dec, dec.seek = nvc, torch.device("cpu"), STREAM, None, None
    monkeypatch.delenv("TAEHV_NVDEC_SEEK", raising=False)
    planes, size = dec._seeking(paths["big"], (3, 4))
    assert size == (720, 1280) and [stamp(p) for p in planes] == [30, 40]
    fed = len(nvc.fed)
    assert dec._seeking(paths["small"], (3, 4)) is None and len(nvc.fed) == fed  # 360p: SimpleDecoder's
    nvc.lose.update({40, 41})  # the decoder never gives frame 4 of these files
    assert dec._seeking(paths["broken"], (3, 4)) is None  # given up, for good, in every thread
    assert "gave 1 of the 2 frames" in nvdec_seek.GIVEN_UP[paths["broken"]]
    note = nvdec_seek.take_note()
    assert note.startswith(f"data: NVDEC's low-level path gave up on {paths['broken']} (the decoder gave 1 of")
    assert "SimpleDecoder from now on (this line once per reason)" in note
    assert dec._seeking(paths["broken2"], (3, 4)) is None and nvdec_seek.take_note() == ""  # the same reason
    nvc.lose.clear()
    fed = len(nvc.fed)
    other = object.__new__(NvdecDecoder)
    other.nvc, other.device, other.stream, other.dec, other.seek = nvc, torch.device("cpu"), STREAM, None, None
    assert other._seeking(paths["broken"], (3, 4)) is None and len(nvc.fed) == fed  # another thread: not retried
    monkeypatch.setenv("TAEHV_NVDEC_SEEK", "0")
    assert dec._seeking(paths["big"], (3, 4)) is None and len(nvc.fed) == fed
    dec.output = "rgbp"
    monkeypatch.setenv("TAEHV_NVDEC_SEEK", "1")
    assert dec._seeking(paths["big"], (3, 4)) is None  # NVDEC's own RGB: SimpleDecoder


@pytest.mark.parametrize(
    "value, says",
    [
        ("", "only their own pictures"),
        ("1", "only their own pictures"),
        ("0", "every decoded picture mapped (SimpleDecoder: TAEHV_NVDEC_SEEK=0)"),
        (" 0 ", "TAEHV_NVDEC_SEEK=0"),
        ("yes", "TAEHV_NVDEC_SEEK='yes' is neither 0 nor 1, taken as 1"),
    ],
)
def test_the_log_says_which_way_clips_are_cut(monkeypatch, value, says):
    monkeypatch.setenv("TAEHV_NVDEC_SEEK", value)
    assert says in nvdec_seek.how()
