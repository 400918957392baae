"""`taehv-launch bench step|compare|loader|index`: each subcommand takes only its own options; the
old flag forms (`bench`, `bench --compare`, `bench --loader`, `bench --index`) still work for one
release and then say, in one `note:` line on stderr, what to type instead."""

from __future__ import annotations

import json

import pytest

from conftest import assert_one_line_error, run_cli, run_cli_here


def note(old: str, new: str, what: str = "the flag goes") -> str:
    return f"note: `{old}` is now `{new}`; {what} in the next release"


@pytest.mark.parametrize(
    "sub, expect", [("step", "--micro"), ("compare", "GPUS"), ("loader", "--resolution"), ("index", "--files")]
)
def test_each_bench_subcommand_has_its_help(sub, expect):
    proc = run_cli_here("bench", sub, "--help")
    assert proc.returncode == 0, proc.stderr
    assert expect in proc.stdout.upper() if expect == "GPUS" else expect in proc.stdout


def test_bench_help_lists_the_subcommands_not_the_old_form():
    proc = run_cli_here("bench", "--help")
    assert proc.returncode == 0, proc.stderr
    for sub in ("step", "compare", "loader", "index"):
        assert f" {sub} " in proc.stdout
    assert "legacy" not in proc.stdout


def test_loader_help_names_every_decoder():
    out = run_cli_here("bench", "loader", "--help").stdout
    for name in ("opencv", "opencv-1thread", "pyav", "pyav-1thread", "nvdec"):
        assert name in out


@pytest.mark.parametrize(
    "args, option",
    [
        (("bench", "index", "--micro", "2"), "--micro"),
        (("bench", "step", "--files", "3"), "--files"),
        (("bench", "loader", "--levers"), "--levers"),
        (("bench", "compare", "1", "cpu", "--decoder", "pyav"), "--decoder"),
    ],
)
def test_a_subcommand_refuses_another_ones_option(args, option):
    proc = run_cli_here(*args)
    assert_one_line_error(proc, option)
    assert option in proc.stderr


@pytest.mark.slow
def test_old_index_flag_still_works_and_says_the_new_form():
    old = run_cli("bench", "--index", "--files", "2000", "--workers", "1", "--no-baseline", "--json", timeout=300)
    assert old.returncode == 0, old.stderr[-2000:]
    assert old.stderr.splitlines()[-1] == note("bench --index", "bench index")
    assert sum(line.startswith("note: ") for line in old.stderr.splitlines()) == 1
    new = run_cli("bench", "index", "--files", "2000", "--workers", "1", "--no-baseline", "--json", timeout=300)
    assert new.returncode == 0, new.stderr[-2000:]
    assert "note:" not in new.stderr
    assert [row["variant"] for row in json.loads(old.stdout)] == [row["variant"] for row in json.loads(new.stdout)]


@pytest.mark.parametrize(
    "args, match",
    [
        (("bench", "--compare"), "bench --compare needs GPUS PROFILE"),
        (("bench", "--loader"), "bench --loader needs --data-root"),
        (("bench", "--index", "x"), "unexpected argument 'x'"),
        (("bench", "1"), "GPUS PROFILE go with --compare"),
        (("bench", "--index", "--files", "1"), "--files 1"),
        (("bench", "loader"), "bench loader needs --data-root"),
    ],
)
def test_old_and_new_forms_refuse_bad_input_in_one_line(args, match):
    """An old form that fails says only what is wrong (one line, no note)."""
    proc = run_cli_here(*args)
    assert_one_line_error(proc, match)
    assert match in proc.stderr


@pytest.mark.parametrize(
    "args, match",
    [
        (("loader", "--data-root", "{tmp}", "--workers", "-1"), "--workers -1: give DataLoader worker counts of 0"),
        (("loader", "--data-root", "{tmp}", "--decoder", "bogus"), "--decoder 'bogus' is not a decoder: use one of"),
        (("loader", "--data-root", "{tmp}", "--micro", "0"), "--micro 0: give a micro-batch size of at least 1"),
        (("loader", "--data-root", "{tmp}", "--seconds", "-5"), "--seconds -5.0: give a positive time"),
        (("loader", "--data-root", "{tmp}", "--clips", "0"), "--clips 0"),
        (("loader", "--data-root", "{tmp}", "--height", "7"), "--height 7: give a positive multiple of 8"),
        (("step", "--micro", "0"), "--micro 0: give micro-batch sizes of at least 1"),
        (("step", "--micro", "-1"), "--micro -1"),
        (("step", "--height", "7"), "--height 7: give a positive multiple of 8"),
        (
            ("step", "--n-frames", "13", "--height", "16", "--width", "16"),
            "--n-frames 13: give a positive multiple of 12",
        ),
        (("step", "--ref-vae-type", "bogus"), "--ref-vae-type: ref_vae_type='bogus' is not supported"),
        (("step", "--chunk", "0"), "--chunk 0"),
        (("compare", "1", "cpu", "--trainer-steps", "0"), "--trainer-steps 0: the trainer run needs at least 2 steps"),
        (("compare", "1", "cpu", "--steps", "0"), "--steps 0"),
        (("compare", "1", "cpu", "--data-root", "/nonexistent"), "--data-root: data_root /nonexistent does not exist"),
        (("compare", "1", "cpu", "--cached", "-1"), "--cached -1"),
        (("compare", "1", "cpu", "--chunk", "0"), "--chunk 0"),
        (("compare", "1", "cpu", "--crop", "12"), "--crop 12: give 0 .* or a positive multiple of 8"),
        (("compare", "1", "cpu", "--cached-set", "nonsense"), "nonsense"),
        (("--compare", "1", "cpu", "--trainer-steps", "0"), "--trainer-steps 0"),  # the old form too
    ],
)
def test_bench_arguments_are_checked_before_anything_runs(args, match, tmp_path):
    """One line, exit 2, at once: nothing built, measured or written first (the workdir stays empty)."""
    args = tuple(a.replace("{tmp}", str(tmp_path)) for a in args)
    proc = run_cli_here("bench", *args, "--set", f"output_dir='{tmp_path / 'out'}'") if "cpu" in args else None
    proc = proc or run_cli_here("bench", *args, cwd=tmp_path)
    assert_one_line_error(proc, match)
    assert not (tmp_path / "out").exists() and proc.stdout == ""


def test_a_dataloader_workers_error_is_its_message_not_a_traceback(tmp_path):
    from taehv_launch.bench.loader import worker_message

    for i in range(3):
        (tmp_path / f"v{i}.mp4").write_bytes(b"\0not a video" * 100)
    proc = run_cli(
        "bench", "loader", "--data-root", str(tmp_path), "--workers", "1", "--seconds", "1", "--decoder", "opencv",
        "--clips", "1", timeout=300,
    )  # fmt: skip
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-2000:]
    assert errors[0].startswith("error: no usable video among 3 files") and "Traceback" not in errors[0]
    wrapped = 'Caught DataError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n  File "x"\ntaehv_launch.errors.DataError: the message: with a colon'
    assert worker_message(wrapped) == "the message: with a colon"
    assert worker_message("plain: message") == "plain: message"
