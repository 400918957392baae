"""The flat-array index (#27) against the list of VideoEntry it replaces, on the real test videos.

The old index was a list of VideoEntry built from the sorted scan and split by sorting every
path's sha1(seed:path); the reference below is that code, so the flat index must give the same
entries, in the same order, and the same train/validation split.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader, Dataset

from taehv_launch.train.data.clips import VideoClipDataset
from taehv_launch.train.data.probe import probe_first_usable, usable_entries
from taehv_launch.dataindex.flat import FlatIndex
from taehv_launch.dataindex.index import VideoEntry, build_index, split_train_val
from taehv_launch.dataindex.listing import scan as _scan


def old_split(entries: list[VideoEntry], fraction: float, max_val: int, seed: int):
    """split_train_val as it was before the flat index (the list version)."""
    n = len(entries)
    if fraction <= 0 or max_val <= 0:
        return list(entries), []
    if n == 1:
        return list(entries), list(entries)
    k = min(max(1, round(fraction * n)), max_val, n - 1)
    ranked = sorted(range(n), key=lambda i: hashlib.sha1(f"{seed}:{entries[i].path}".encode()).digest())
    held = set(ranked[:k])
    return [e for i, e in enumerate(entries) if i not in held], [e for i, e in enumerate(entries) if i in held]


@pytest.fixture
def tree(videos: Path, tmp_path: Path) -> Path:
    """The test videos, several times over in nested folders (so the split has something to choose)."""
    root = tmp_path / "data"
    for k, sub in enumerate(["", "a", "a/b", "c", "ü-ñ"]):
        (root / sub).mkdir(parents=True, exist_ok=True)
        for f in sorted(videos.iterdir()):
            if f.suffix.lower() in (".mp4", ".webm"):
                shutil.copy(f, root / sub / f"{k}-{f.name}")
    return root


def test_flat_index_equals_the_old_list_on_the_testdata(tree: Path, tmp_path: Path):
    old = [VideoEntry(p) for p in _scan(str(tree))]
    flat = build_index(str(tree), "", str(tmp_path / "cache"))
    assert isinstance(flat, FlatIndex) and len(flat) == len(old) == 45
    assert list(flat) == old and [flat[i] for i in range(len(flat))] == old
    assert flat[-1] == old[-1] and list(flat[3:17:2]) == old[3:17:2]
    again = build_index(str(tree), "", str(tmp_path / "cache"))  # read back from the .npz cache
    assert again.from_cache and list(again) == old
    for seed in (0, 1, 42):
        for fraction, max_val in ((0.05, 64), (0.3, 5), (0.0, 64), (0.9, 64)):
            train, val = split_train_val(again, fraction, max_val, seed)
            old_train, old_val = old_split(old, fraction, max_val, seed)
            assert list(train) == old_train and list(val) == old_val, (seed, fraction)


def test_annotation_index_and_split_equal_the_old_list(tree: Path, tmp_path: Path, videos: Path):
    rel = [os.path.relpath(p, tree) for p in _scan(str(tree))][::-1]  # annotation order is kept, not sorted
    outside = str(videos / "chaplin.mp4")  # an absolute path outside data_root
    ann = tmp_path / "ann.json"
    ann.write_text(json.dumps({"list": [{"path": p} for p in rel] + [{"path": outside}]}))
    flat = build_index(str(tree), str(ann), str(tmp_path / "cache"))
    old = [VideoEntry(os.path.normpath(os.path.join(tree, p))) for p in rel] + [VideoEntry(outside)]
    assert list(flat) == old
    common = os.path.commonpath([e.path for e in old])  # the folder stored once (where the checkout is decides it)
    assert flat.prefix == (common.rstrip("/") + "/")
    assert [list(x) for x in split_train_val(flat, 0.2, 64, 7)] == list(old_split(old, 0.2, 64, 7))


def test_the_dataset_and_its_helpers_read_the_flat_index(tree: Path, tmp_path: Path):
    train, val = split_train_val(build_index(str(tree), "", str(tmp_path / "cache")), 0.1, 64, 3)
    first, broken = probe_first_usable(train, 12)
    assert not any(Path(p).name.endswith("empty.webm") for p in broken[1:]) or first > 0
    ok = usable_entries(val, 12)
    assert all(isinstance(e, VideoEntry) for e in ok) and set(ok) <= set(val)
    ds = VideoClipDataset(train, 32, 32, 4)
    assert ds.entries is train  # not copied into a list
    assert ds[first]["frames"].shape == (4, 3, 32, 32)


class Paths(Dataset):
    def __init__(self, entries):
        self.entries = entries

    def __len__(self):
        return len(self.entries)

    def __getitem__(self, i):
        return self.entries[i].path


def test_forked_workers_read_the_same_paths(tree: Path, tmp_path: Path):
    flat = build_index(str(tree), "", str(tmp_path / "cache"))
    got = [p for batch in DataLoader(Paths(flat), batch_size=3, num_workers=2) for p in batch]
    assert got == [e.path for e in _scan_entries(tree)]


def _scan_entries(tree: Path) -> list[VideoEntry]:
    return [VideoEntry(p) for p in _scan(str(tree))]


def test_names_that_are_not_utf8_are_left_out_of_the_index(tmp_path: Path, videos: Path, caplog):
    """cv2.VideoCapture crashes the process on a name that is not UTF-8 (measured: SIGSEGV), so the index
    leaves such files out with one warning line (escaped), or refuses in one line when nothing is left;
    the flat arrays themselves still store any name exactly."""
    from taehv_launch.errors import DataError

    root = tmp_path / "d"
    root.mkdir()
    name = os.fsdecode(b"bad-\xff-name.mp4")  # not UTF-8: a surrogate escape
    shutil.copy(videos / "chaplin.mp4", os.path.join(root, name))
    shutil.copy(videos / "chaplin.mp4", root / "ok.mp4")
    with caplog.at_level("WARNING", logger="taehv_launch.dataindex.index"):
        flat = build_index(str(root), "", str(tmp_path / "cache"))
    assert [e.path for e in flat] == [str(root / "ok.mp4")]
    (line,) = [r.getMessage() for r in caplog.records]
    assert "1 of 2 videos under" in line and "bad-\\xff-name.mp4" in line and "not UTF-8" in line, line
    assert line.isprintable(), line
    again = build_index(str(root), "", str(tmp_path / "cache"))
    assert again.from_cache and list(again) == list(flat)
    os.remove(root / "ok.mp4")
    os.utime(root, (1, 1))  # a new key: the cached index is not used
    with pytest.raises(DataError, match=r"1 of 1 videos under .* not UTF-8 text \(e\.g\. .*bad-\\xff-name\.mp4\)"):
        build_index(str(root), "", str(tmp_path / "cache"))
    stored = FlatIndex.from_paths([os.path.join(str(root), name)])
    assert stored[0].path == os.path.join(str(root), name)


def test_frame_counts_and_subsets_share_the_arrays():
    paths = [f"/data/v/{i:05d}.mp4" for i in range(1000)]
    flat = FlatIndex.from_paths(paths, range(1000))
    assert flat.prefix == "/data/v/" and flat.buf.nbytes == 9 * 1000  # the folder is stored once
    assert flat[10] == VideoEntry("/data/v/00010.mp4", 10) and flat[-1].frame_count == 999
    sub = flat.take(np.array([5, 3, 900]))
    assert sub.buf is flat.buf and [e.frame_count for e in sub] == [5, 3, 900]
    assert list(sub[1:]) == [flat[3], flat[900]] and sub.take([2])[0] == flat[900]
    with pytest.raises(IndexError):
        flat[1000]
    assert len(FlatIndex.from_paths([])) == 0 and list(flat.take([])) == []


@pytest.mark.slow  # two fresh interpreters with torch and forked workers: ~20 s
def test_bench_index_measures_both_indexes_side_by_side():
    """`taehv-launch bench index` (#27 item 2) at a small N: the flat index's workers stay flat, the old list's grow."""
    import subprocess

    from conftest import CLI, clean_env

    done = subprocess.run(
        [*CLI, "bench", "index", "--files", "200000", "--workers", "2", "--json"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rows = {r["variant"]: r for r in json.loads(done.stdout)}
    old, flat = rows["list"], rows["flat"]
    assert flat["files"] == old["files"] == 200000 and flat["train_entries"] == old["train_entries"] == 200000 - 64
    assert flat["paths_read"] == flat["train_entries"]  # one epoch of reads
    # the old list's workers grow ~110 MB per million entries (~22 MB here), the flat index's stay at 0.4-2.5 MB
    # (page noise: 2.5 MB was seen on a loaded CI machine); bounds with room for that
    assert old["worker_growth_max"] > 12e6 and old["worker_growth_max"] > 3 * flat["worker_growth_max"]
    assert flat["worker_growth_max"] < 6e6 and flat["rank_index_bytes"] < old["rank_index_bytes"]


def test_bench_index_bad_input_is_one_line():
    import subprocess

    from conftest import CLI, clean_env

    done = subprocess.run([*CLI, "bench", "index", "--files", "1"], capture_output=True, text=True, env=clean_env())
    assert done.returncode == 2 and done.stderr.strip() == (
        "error: --files 1: give at least 2 synthetic videos (e.g. --files 3000000)"
    )


# --- listing millions of files (#27 item 3) ---------------------------------------------------


def test_parallel_scan_equals_a_walk_and_follows_a_symlink_loop_once(tree: Path, capsys):
    (tree / "a" / "b" / "loop").symlink_to(tree / "a", target_is_directory=True)
    (tree / "c" / "x.mp4").mkdir()  # a folder named like a video
    walked = sorted(os.path.join(d, f) for d, _, fs in os.walk(tree) for f in fs if f.endswith((".mp4", ".webm")))
    assert _scan(str(tree), threads=4, progress_s=60) == walked and len(walked) == 45
    for parallel in (True, False):  # the thread pool (a slow filesystem) and the loop (a local disk)
        assert _scan(str(tree), threads=4, progress_s=60, parallel=parallel) == walked
    assert capsys.readouterr().err == ""  # quick scans print nothing
    _scan(str(tree), threads=4, progress_s=0.0001)
    err = capsys.readouterr().err
    assert f"index: listing {tree}: 45 files in" in err and "files/s)" in err


def test_listed_files_are_checked_the_same_with_or_without_the_pool(tree: Path):
    from taehv_launch.dataindex.listing import existing

    paths = _scan(str(tree)) + [str(tree / "gone.mp4"), str(tree / "a")]  # a missing file, a folder
    want = [True] * 45 + [False, False]
    assert existing(paths) == existing(paths, parallel=True) == existing(paths, parallel=False) == want


@pytest.mark.parametrize(
    "name,text",
    [
        ("a.csv", 'path,frame_count\n0-chaplin.mp4,120\n"a/1-fire2.mp4",\n0-example2.mp4,7\n'),
        (
            "a.jsonl",
            '{"path": "0-chaplin.mp4", "frame_count": 120}\n{"path": "a/1-fire2.mp4"}\n\n'
            '{"path": "0-example2.mp4", "frame_count": 7}\n',
        ),
        (
            "a.json",
            '{"list": [{"path": "0-chaplin.mp4", "frame_count": 120}, {"path": "a/1-fire2.mp4"}, '
            '{"path": "0-example2.mp4", "frame_count": 7}]}',
        ),
        ("a.txt", "0-chaplin.mp4\na/1-fire2.mp4\n0-example2.mp4\n"),
    ],
)
def test_annotation_formats(tree: Path, tmp_path: Path, name: str, text: str):
    ann = tmp_path / name
    ann.write_text(text)
    index = build_index(str(tree), str(ann), str(tmp_path / "cache"))
    assert [e.path for e in index] == [
        str(tree / "0-chaplin.mp4"),
        str(tree / "a/1-fire2.mp4"),
        str(tree / "0-example2.mp4"),
    ]  # the file's order
    counts = [e.frame_count for e in index]
    assert counts == ([-1, -1, -1] if name.endswith(".txt") else [120, -1, 7])


@pytest.mark.parametrize(
    "name,text,message",
    [
        ("b.csv", "x.mp4,many\n", "line 1 has frame count 'many', expected a whole number"),
        ("b.jsonl", '{"path": "x.mp4"}\n{oops\n', "line 2 is not valid JSON"),
        ("b.jsonl", '{"file": "x.mp4"}\n', 'line 1 is {"file": "x.mp4"}, expected {"path": "..."}'),
        ("b.json", '{"list": [{"path": "x.mp4", "frame_count": "7"}]}', 'entry 0 has frame_count "7"'),
        ("b.csv", "path,frame_count\n", "lists no videos"),
        ("b.txt", "\n\n", "lists no videos"),
    ],
)
def test_annotation_format_errors(tree: Path, tmp_path: Path, name: str, text: str, message: str):
    from taehv_launch.errors import DataError

    (tmp_path / name).write_text(text)
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace("{", r"\{").replace(")", r"\)")):
        build_index(str(tree), str(tmp_path / name), "")


def _cli(*args: str):
    import subprocess

    from conftest import CLI, clean_env

    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=clean_env(), timeout=120)


@pytest.mark.parametrize("fmt", [".csv", ".jsonl", ".json", ".txt"])
def test_index_command_writes_an_annotation_the_trainer_reads(tree: Path, tmp_path: Path, fmt: str):
    out = tmp_path / f"videos{fmt}"
    done = _cli("index", str(tree), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert f"index: 45 videos under {tree} listed in" in done.stdout
    assert f"--set data_root={tree} --set annotation_file={out}" in done.stdout
    scanned = build_index(str(tree), "", str(tmp_path / "c1"))
    annotated = build_index(str(tree), str(out), str(tmp_path / "c2"))
    assert list(annotated) == list(scanned) and annotated.missing == 0
    assert all(not os.path.isabs(line) for line in out.read_text().splitlines())  # relative to DATA_ROOT


def test_index_command_bad_inputs_are_one_line(tree: Path, tmp_path: Path):
    kept = tmp_path / "kept.csv"
    kept.write_text("do not lose me\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "adir.csv").mkdir()
    cases = [
        ((str(tmp_path / "nope"), "-o", str(tmp_path / "o.csv")), f"DATA_ROOT {tmp_path / 'nope'} does not exist"),
        ((str(tree / "0-chaplin.mp4"), "-o", str(tmp_path / "o.csv")), "is not a folder"),
        ((str(tree), "-o", str(tmp_path / "adir.csv")), f"-o {tmp_path / 'adir.csv'} is a folder: give a file name"),
        ((str(tree), "-o", str(kept)), "already exists: pass --force to replace it"),
        ((str(tree), "-o", str(tmp_path / "no" / "o.csv")), f"folder {tmp_path / 'no'} does not exist"),
        ((str(tree), "-o", "/proc/o.csv"), "cannot write /proc/o.csv"),
        ((str(tree), "-o", str(tmp_path / "o.xml")), "name the file .csv, .jsonl, .json or .txt"),
        (
            (str(tmp_path / "empty"), "-o", str(tmp_path / "o.csv")),
            "no video files (.mp4 .webm .mkv .avi .mov .m4v .mts .m2ts .ts .mpg .mpeg .3gp) under",
        ),
    ]
    for args, message in cases:
        done = _cli("index", *args)
        err = done.stderr.strip()
        assert done.returncode == 2 and err.startswith("error: ") and message in err and "\n" not in err, (args, err)
    assert kept.read_text() == "do not lose me\n" and not (tmp_path / "o.csv").exists()
    assert _cli("index", str(tree), "-o", str(kept), "--force").returncode == 0 and "0-chaplin.mp4" in kept.read_text()
