"""The video index, the split, the clip dataset and the CPU demo assets, on real files.

Real-world videos come from shared/testdata/videos (beside the repo; TAEHV_TESTDATA
overrides). Videos whose exact content matters are written here with FFV1 (lossless),
with the frame index coded in the red channel, so the tests can read back which frames
a clip holds.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from taehv_launch.errors import DataError
from taehv_launch.train.data.clips import (
    VideoClipDataset,
    collate,
    plan_crop,
    plan_frames,
    worker_init_fn,
)
from taehv_launch.train.data.probe import probe_first_usable
from taehv_launch.dataindex.index import VideoEntry, build_index, split_train_val
from taehv_launch.train.data.synthetic import ensure_demo_assets

TESTDATA = Path(os.environ.get("TAEHV_TESTDATA") or Path(__file__).resolve().parents[2] / "shared/testdata/videos")
# What each file is expected to do (README.md beside them says what they are).
USABLE = {
    "big_buck_bunny_432_433.webm",
    "chaplin.mp4",
    "example2.mp4",
    "fire2.mp4",
    "no_duration.webm",
    "smpte-2997.mp4",
    "transparent.webm",
}
BROKEN = {
    "empty.webm": "0 bytes: cannot be opened",
    "test_video.mp4": "1x1 pixels: opens and decodes 5 frames, but < 8 px is treated as broken",
}
H, W, T = 48, 80, 12  # non-square crop


def _videos() -> list[Path]:
    return sorted(p for p in TESTDATA.glob("*") if p.is_file() and p.suffix != ".md") if TESTDATA.is_dir() else []


def test_testdata_present():
    assert TESTDATA.is_dir(), (
        f"test videos not found at {TESTDATA}: clone shared/ beside the repo or set TAEHV_TESTDATA"
    )
    assert {p.name for p in _videos()} >= USABLE | set(BROKEN)


# --- every real file ------------------------------------------------------------------


@pytest.mark.parametrize("train", [True, False], ids=["train", "val"])
@pytest.mark.parametrize("name", sorted(USABLE))
def test_usable_file(name, train):
    ds = VideoClipDataset([VideoEntry(str(TESTDATA / name))], H, W, T, 1, 3, True, seed=0, train=train)
    item = ds[0]
    assert item["frames"].shape == (T, 3, H, W) and item["frames"].dtype == torch.uint8
    assert item["skipped"] == []
    assert item["frames"].float().std() > 1  # real picture content, not a constant fill


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_file_alone_raises(name):
    ds = VideoClipDataset([str(TESTDATA / name)], H, W, T, 1, 2, False, seed=0)
    with pytest.raises(DataError, match="no usable video among 1 files"):
        ds[0]


def test_no_duration_header_is_bogus_but_file_works():
    cap = cv2.VideoCapture(str(TESTDATA / "no_duration.webm"))
    assert cap.get(cv2.CAP_PROP_FRAME_COUNT) <= 0  # the trap this file exists for
    cap.release()
    ds = VideoClipDataset([str(TESTDATA / "no_duration.webm")], H, W, 24, 3, 3, False, seed=1)
    assert ds[0]["frames"].shape == (24, 3, H, W)  # 69-frame span of a 74-frame file: needs the real length


def test_only_broken_files_raise():
    ds = VideoClipDataset([str(TESTDATA / n) for n in sorted(BROKEN)], H, W, T, 1, 2, False, seed=0)
    with pytest.raises(DataError, match="no usable video among 2 files"):
        ds[1]


def test_all_files_through_a_dataloader():
    """Every index yields a clip; broken files are skipped and reported; workers change nothing."""
    entries = [VideoEntry(str(p)) for p in _videos()]
    ds = VideoClipDataset(entries, H, W, T, 1, 3, True, seed=3)
    loader = DataLoader(ds, batch_size=3, num_workers=2, collate_fn=collate, worker_init_fn=worker_init_fn)
    batches = list(loader)
    assert sum(len(b["frames"]) for b in batches) == len(entries)
    assert all(b["frames"].shape[1:] == (T, 3, H, W) and b["frames"].dtype == torch.uint8 for b in batches)
    skipped = {Path(p).name for b in batches for p in b["skipped"]}
    assert skipped == set(BROKEN)
    in_process = [ds[i]["frames"] for i in range(len(entries))]
    assert torch.equal(torch.cat([b["frames"] for b in batches]), torch.stack(in_process))


def test_smaller_than_crop_in_both_sides_is_upscaled():
    ds = VideoClipDataset([str(TESTDATA / "transparent.webm")], 240, 320, T, 1, 2, True, seed=0)  # 200x200 source
    assert ds[0]["frames"].shape == (T, 3, 240, 320)


def test_seek_reads_the_same_frames_as_grabbing():
    from taehv_launch.train.data.decode import SEEK_MIN, _decode_path

    wanted = [SEEK_MIN + 50 + 2 * k for k in range(4)]  # chaplin.mp4 has 241 frames
    seeked, _ = _decode_path(str(TESTDATA / "chaplin.mp4"), wanted, allow_seek=True)
    grabbed, _ = _decode_path(str(TESTDATA / "chaplin.mp4"), wanted, allow_seek=False)
    assert all(np.array_equal(seeked[k], grabbed[k]) for k in wanted)
    # no_duration.webm accepts a seek and silently stays at frame 0: detected, read forward instead
    frames, _ = _decode_path(str(TESTDATA / "no_duration.webm"), [60], allow_seek=True)
    forward, _ = _decode_path(str(TESTDATA / "no_duration.webm"), [60], allow_seek=False)
    assert np.array_equal(frames[60], forward[60])


def test_probe_first_usable():
    entries = [VideoEntry(str(TESTDATA / n)) for n in ("empty.webm", "test_video.mp4", "chaplin.mp4")]
    position, broken = probe_first_usable(entries, T, max_tries=8)
    assert position == 2 and [Path(p).name for p in broken] == ["empty.webm", "test_video.mp4"]
    with pytest.raises(DataError, match="none of the first 2 videos"):
        probe_first_usable(entries, T, max_tries=2)


# --- clip content: frame indices, colour, flips ---------------------------------------


def _coded_video(path: Path, n_frames: int, h: int = 24, w: int = 32, split: bool = False) -> str:
    """FFV1 video whose frame k is RGB (10 + 5k, 0, 255 - 5k); split=True: right half black."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"FFV1"), 10, (w, h))
    assert writer.isOpened()
    for k in range(n_frames):
        frame = np.zeros((h, w, 3), np.uint8)
        frame[..., 2], frame[..., 0] = 10 + 5 * k, 255 - 5 * k  # BGR order on disk
        if split:
            frame[:, w // 2 :] = 0
        writer.write(frame)
    writer.release()
    return str(path)


def _indices(clip: torch.Tensor) -> list[int]:
    """Frame indices coded in the red channel of a TCHW RGB clip."""
    return [round((float(f[0].float().mean()) - 10) / 5) for f in clip]


def test_clip_frames_strides_and_rgb(tmp_path):
    ds = VideoClipDataset([_coded_video(tmp_path / "long.avi", 48)], 16, 24, T, 1, 3, False, seed=0)
    strides = set()
    for i in range(12):
        clip = ds[i * len(ds)]["frames"]  # i >= len: fresh clips of the same video
        idx = _indices(clip)
        steps = {b - a for a, b in zip(idx, idx[1:])}
        assert len(steps) == 1 and 1 <= steps.pop() <= 3 and 0 <= idx[0] and idx[-1] < 48, idx
        strides.add(idx[1] - idx[0])
        assert clip[:, 2].float().mean() > clip[:, 1].float().mean()  # blue stays blue: BGR -> RGB
    assert strides == {1, 2, 3}


def test_short_video_falls_back_to_smaller_stride(tmp_path):
    ds = VideoClipDataset([_coded_video(tmp_path / "25.avi", 25)], 16, 24, T, 3, 3, False, seed=0)
    idx = _indices(ds[0]["frames"])
    assert [b - a for a, b in zip(idx, idx[1:])] == [2] * 11  # stride 3 needs 34 frames: 2 fits


def test_video_shorter_than_clip_is_skipped(tmp_path):
    """A clip shorter than n_frames used to freeze on its last frame silently (#29 item 9): now the video is
    skipped like a broken file (the item's "skipped" list, its reason in "why") and another is used."""
    short, exact = _coded_video(tmp_path / "5.avi", 5), _coded_video(tmp_path / "12.avi", T)
    for train in (True, False):
        ds = VideoClipDataset([short, exact], 16, 24, T, 1, 2, False, seed=0, train=train)
        item = ds[0]
        assert item["skipped"] == [short] and _indices(item["frames"]) == list(range(T))  # exactly T frames: used
    with pytest.raises(DataError, match=r"no usable video among 1 files: .*shorter than n_frames=12 frames"):
        VideoClipDataset([short], 16, 24, T, 1, 2, False, seed=0)[0]


def test_short_video_reason_goes_with_the_item_not_to_the_log(tmp_path, caplog, capfd):
    """A skipped video's reason travels in the item's "why" (the trainer prints the one line per video and
    rank, #35 item 10): the dataset prints nothing itself, in the process or in any DataLoader worker."""
    short = _coded_video(tmp_path / "11.avi", T - 1)
    ds = VideoClipDataset([short, _coded_video(tmp_path / "40.avi", 40)], 16, 24, T, 1, 2, False, seed=0)
    with caplog.at_level("WARNING"):
        item = ds[0]
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    assert item["skipped"] == [short] and item["why"] == {short: "11 frames, fewer than n_frames=12"}
    loader = DataLoader(ds, batch_size=2, num_workers=2, collate_fn=collate, worker_init_fn=worker_init_fn)
    batches = list(loader)
    assert {p: w for b in batches for p, w in b["why"].items()} == {short: "11 frames, fewer than n_frames=12"}
    assert "11.avi" not in capfd.readouterr().err  # the workers' stderr: no line of their own


def test_a_short_header_count_is_checked_before_skipping(tmp_path):
    """The header is only a hint: a file whose header claims fewer frames than it has is counted, not skipped."""
    from unittest import mock

    ds = VideoClipDataset([_coded_video(tmp_path / "40.avi", 40)], 16, 24, T, 1, 2, False, seed=0)
    with mock.patch("taehv_launch.train.data.clips.header_frame_count", return_value=3):
        assert ds[0]["skipped"] == [] and ds[0]["frames"].shape[0] == T


def test_probe_and_validation_leave_out_short_videos(tmp_path):
    from taehv_launch.train.data.probe import usable_entries

    short, good = VideoEntry(_coded_video(tmp_path / "5.avi", 5)), VideoEntry(_coded_video(tmp_path / "24.avi", 24))
    assert probe_first_usable([short, good], T) == (1, [short.path])
    assert usable_entries([short, good], T) == [good]
    with pytest.raises(
        DataError,
        match=r"none of the first 1 videos gives a usable clip of n_frames=12 frames .*"
        r"at least 12 frames long",
    ):
        probe_first_usable([short], T)


def test_validation_is_the_centre_clip(tmp_path):
    ds = VideoClipDataset([_coded_video(tmp_path / "v.avi", 40)], 16, 24, T, 2, 3, True, seed=0, train=False)
    assert _indices(ds[0]["frames"]) == list(range(14, 26))
    assert torch.equal(ds[0]["frames"], ds[5]["frames"])


def test_random_flip(tmp_path):
    def left_is_bright(clip):  # the coded video's right half is black; its blue channel is bright
        return bool(clip[0, 2, :, :8].float().mean() > clip[0, 2, :, -8:].float().mean() + 100)

    ds = VideoClipDataset([_coded_video(tmp_path / "f.avi", 16, 24, 32, split=True)], 24, 32, 4, 1, 1, True, seed=0)
    flags = [left_is_bright(ds[i]["frames"]) for i in range(16)]
    assert any(flags) and not all(flags)
    no_flip = VideoClipDataset(ds.entries, 24, 32, 4, 1, 1, False, seed=0)
    assert all(left_is_bright(no_flip[i]["frames"]) for i in range(8))


def test_plan_crop_scales():
    rng = np.random.default_rng(0)
    sizes = [plan_crop(rng, 2160, 3840, 480, 720) for _ in range(200)]
    assert all(480 <= c.h <= 2160 and c.y + c.h <= 2160 and c.x + c.w <= 3840 for c in sizes)
    assert min(c.h for c in sizes) < 700 and max(c.h for c in sizes) > 1500  # native detail ... whole frame
    small = plan_crop(rng, 200, 200, 480, 720)  # upscale just enough to cover 480x720
    assert (small.h, small.w) == (133, 200)
    assert plan_crop(None, 1080, 1920, 480, 720) == plan_crop(None, 1080, 1920, 480, 720)


def test_plan_frames_rules():
    assert plan_frames(None, 100, 12, 1, 2) == list(range(44, 56))
    assert plan_frames(None, 3, 5, 1, 1) == [0, 1, 2, 2, 2]
    rng = np.random.default_rng(0)
    assert all(max(plan_frames(rng, 30, 12, 1, 4)) < 30 for _ in range(50))


# --- determinism --------------------------------------------------------------------


def test_same_seed_same_clips():
    entries = [VideoEntry(str(TESTDATA / n)) for n in ("chaplin.mp4", "empty.webm", "transparent.webm")]
    a = VideoClipDataset(entries, H, W, T, 1, 3, True, seed=11)
    b = VideoClipDataset(entries, H, W, T, 1, 3, True, seed=11)
    order = [4, 1, 0, 2, 7]
    first = [a[i] for i in order]
    for i in (5, 3, 8):  # b serves other items first: per-worker caches must not change the clips
        b[i]
    second = [b[i] for i in order]
    for x, y in zip(first, second):
        assert torch.equal(x["frames"], y["frames"]) and x["skipped"] == y["skipped"]
    assert first[1]["skipped"] == [entries[1].path]  # index 1 is empty.webm: another video stands in
    other = VideoClipDataset(entries, H, W, T, 1, 3, True, seed=12)
    assert not torch.equal(other[0]["frames"], first[2]["frames"])
    assert not torch.equal(a[0]["frames"], a[3]["frames"])  # same video, next pass: a fresh clip


# --- the index ------------------------------------------------------------------------


@pytest.fixture
def video_tree(tmp_path) -> Path:
    """data/a.webm, data/sub/b.mp4, data/x.mp4/ (a directory), data/notes.txt."""
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    (root / "x.mp4").mkdir()
    shutil.copy(TESTDATA / "transparent.webm", root / "a.webm")
    shutil.copy(TESTDATA / "test_video.mp4", root / "sub" / "b.MP4")
    (root / "notes.txt").write_text("not a video")
    return root


def test_scan_skips_directories_named_like_videos(video_tree, tmp_path):
    index = build_index(str(video_tree), "", str(tmp_path / "cache"))
    assert [Path(e.path).relative_to(video_tree).as_posix() for e in index] == ["a.webm", "sub/b.MP4"]
    assert all(e.frame_count == -1 for e in index)  # stat only, by default


def test_index_cache_is_reused(video_tree, tmp_path):
    cache = tmp_path / "cache"
    first = build_index(str(video_tree), "", str(cache))
    files = list(cache.glob("index-*.npz"))
    assert len(files) == 1 and not first.from_cache
    mtime = files[0].stat().st_mtime_ns
    time.sleep(0.01)
    second = build_index(str(video_tree), "", str(cache))
    assert second.from_cache and list(second) == list(first) and files[0].stat().st_mtime_ns == mtime
    (video_tree / "c.mkv").write_bytes(b"")  # a new top-level file changes data_root's mtime: rescan
    assert len(build_index(str(video_tree), "", str(cache))) == 3


def test_probe_frame_counts(video_tree):
    from taehv_launch.train.data.decode import header_frame_count

    counts = {
        Path(e.path).name: e.frame_count
        for e in build_index(str(video_tree), "", "", probe_frame_counts=header_frame_count)
    }
    assert counts == {"a.webm": 150, "b.MP4": 5}


def _annotation(tmp_path: Path, doc) -> str:
    path = tmp_path / "ann.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


def test_annotation_file(video_tree, tmp_path):
    absolute = str(TESTDATA / "chaplin.mp4")
    ann = _annotation(
        tmp_path, {"list": [{"path": "a.webm"}, {"path": "gone.mp4"}, {"path": "x.mp4"}, {"path": absolute}]}
    )
    index = build_index(str(video_tree), ann, str(tmp_path / "cache"))
    assert [e.path for e in index] == [str(video_tree / "a.webm"), absolute]
    assert index.missing == 2  # gone.mp4 and the directory x.mp4
    again = build_index(str(video_tree), ann, str(tmp_path / "cache"))
    assert again.from_cache and again.missing == 2 and list(again) == list(index)


@pytest.mark.parametrize(
    "doc,message",
    [
        ("{not json", "is not valid JSON"),
        ([{"path": "a.webm"}], 'no "list" array'),
        ({"list": [{"file": "a.webm"}]}, "entry 0 is"),
        ({"list": []}, "lists no videos"),
        ({"list": [{"path": "gone.mp4"}, {"path": "x.mp4"}]}, "none of the 2 videos listed"),
    ],
)
def test_annotation_errors(video_tree, tmp_path, doc, message):
    with pytest.raises(DataError, match=message):
        build_index(str(video_tree), _annotation(tmp_path, doc), str(tmp_path / "cache"))


def test_data_root_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        build_index(str(tmp_path / "nope"), "", "")
    (tmp_path / "file.mp4").write_bytes(b"")
    with pytest.raises(DataError, match="is not a folder"):
        build_index(str(tmp_path / "file.mp4"), "", "")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no video files"):
        build_index(str(tmp_path / "empty"), "", "")
    with pytest.raises(DataError, match="annotation_file .* not found"):
        build_index(str(tmp_path / "empty"), str(tmp_path / "missing.json"), "")


# --- the split ------------------------------------------------------------------------


def test_split_train_val():
    entries = [VideoEntry(f"/v/{i}.mp4") for i in range(100)]
    train, val = split_train_val(entries, 0.05, 64, seed=1)
    assert len(val) == 5 and len(train) == 95 and not set(train) & set(val)
    assert split_train_val(list(reversed(entries)), 0.05, 64, seed=1)[1] == list(reversed(val))  # order-free
    assert len(split_train_val(entries, 0.5, 8, seed=1)[1]) == 8
    assert split_train_val(entries[:2], 0.01, 64, seed=1)[1] and len(split_train_val(entries[:2], 0.9, 64, 1)[0]) == 1
    assert split_train_val(entries[:1], 0.05, 64, seed=1) == (entries[:1], entries[:1])  # one video: reused
    assert split_train_val(entries, 0.0, 64, seed=1) == (entries, [])


# --- the CPU demo assets --------------------------------------------------------------


def test_demo_assets_made_once(tmp_path):
    cache = str(tmp_path / "demo")
    with ThreadPoolExecutor(3) as pool:  # concurrent callers: one build, same answer
        results = list(
            pool.map(
                lambda _: ensure_demo_assets(cache, n_videos=3, size=(32, 48), n_frames=12, ref_vae_type="wan"),
                range(3),
            )
        )
    assert len(set(results)) == 1
    data_root, ref_path = results[0]
    marker = Path(data_root) / ".complete"
    mtime = marker.stat().st_mtime_ns
    started = time.perf_counter()
    assert ensure_demo_assets(cache, n_videos=3, size=(32, 48), n_frames=12, ref_vae_type="wan") == results[0]
    assert time.perf_counter() - started < 0.5 and marker.stat().st_mtime_ns == mtime  # a no-op
    assert not list(Path(cache).rglob(".tmp-*"))
    videos = sorted(Path(data_root).glob("*.mp4"))
    assert len(videos) == 3
    firsts = []
    for path in videos:
        cap = cv2.VideoCapture(str(path))
        frames = []
        while True:
            ok, frame = cap.read()
            if not ok:
                break
            frames.append(frame)
        cap.release()
        assert len(frames) == 12 and frames[0].shape == (32, 48, 3)
        assert np.abs(frames[0].astype(int) - frames[-1].astype(int)).mean() > 1  # things move
        firsts.append(frames[0].astype(int))
    assert np.abs(firsts[0] - firsts[1]).mean() > 5  # videos differ
    assert (Path(ref_path) / "vae" / "config.json").is_file()
    clip = VideoClipDataset(build_index(data_root, "", ""), 32, 32, 12, 1, 1, True, seed=0)[0]["frames"]
    assert clip.shape == (12, 3, 32, 32)
