"""A path no filesystem can hold, given to the launch (not only to render): one line, exit 2 (#29)."""

from __future__ import annotations

import pytest

from conftest import assert_one_line_error, run_cli_here

LONG = "a" * 300


@pytest.mark.parametrize(
    "args,match",
    [
        (["--config", f"/tmp/{LONG}.py"], r"--config '/tmp/a+'\.\.\. \(308 characters\) is longer than a path can be"),
        (["--set", f"output_dir='/tmp/{LONG}'", "--resume", "auto"], r"output_dir .* is longer than a path can be"),
        (["--set", f"data_root='/d/{LONG}'"], r"data_root .* is longer than a path can be"),
        (["--set", "ref_vae_path='/v\\x00w'"], r"ref_vae_path '/v\\x00w' contains a NUL byte"),
    ],
)
def test_unusable_paths_are_one_line(tmp_path, args, match):
    for extra in (["--dry-run"], []):
        assert_one_line_error(run_cli_here("1", "cpu", *args, *extra, cwd=tmp_path), match)
    assert not (tmp_path / "output").exists()


def test_a_config_file_with_a_nul_in_a_path(tmp_path):
    (tmp_path / "nul.py").write_text('output_dir = "/tmp/a\\x00b"\n')
    assert_one_line_error(
        run_cli_here("1", "cpu", "--config", str(tmp_path / "nul.py"), "--dry-run"),
        r"output_dir '/tmp/a\\x00b' contains a NUL byte",
    )


def test_a_lower_case_boolean_gets_the_spelling_to_use(tmp_path):
    assert_one_line_error(
        run_cli_here("1", "cpu", "--set", "allow_family_change=true", "--dry-run", cwd=tmp_path),
        r"allow_family_change must be bool, got str 'true' .*: write allow_family_change=True",
    )


def test_a_line_break_in_a_value_never_makes_a_second_error_line(tmp_path):
    proc = run_cli_here("index", "a\nb\rc", "-o", str(tmp_path / "v.csv"), cwd=tmp_path)
    assert_one_line_error(proc, r"DATA_ROOT a\\nb\\rc does not exist")
