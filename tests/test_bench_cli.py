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
