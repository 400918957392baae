"""The `taehv-launch` command line: one module per command, each parsing its options and calling
one function (run/, cluster/, preflight/, bench/). core.py holds the app and the error mapping,
options.py the plan and topology options every plan-resolving command shares.

`taehv-launch 16 h100` runs the default command (`run`); subcommands sit beside it
(`taehv-launch validate-env 16 h100`, `taehv-launch bench step`).
"""

from __future__ import annotations

import os
import sys

import typer

from ..errors import EXIT_USAGE
from . import bench, cache, diff, eval, index, keys, render, requeue, run, status, validate_env  # noqa: F401  (each registers its command)
from .core import app, click

__all__ = ["app", "main"]


def main() -> None:
    """Run the app; click's own usage errors become one `error:` line like ours."""
    no_args = getattr(click.exceptions, "NoArgsIsHelpError", ())
    try:
        code = app(standalone_mode=False)
    except typer.Exit as exc:
        code = exc.exit_code
    except typer.Abort:
        print("error: interrupted", file=sys.stderr)
        code = 130
    except no_args as exc:
        exc.show()
        code = 0
    except click.exceptions.ClickException as exc:
        print(f"error: {' '.join(exc.format_message().split())} (see taehv-launch --help)", file=sys.stderr)
        code = EXIT_USAGE
    except BrokenPipeError:  # `taehv-launch keys | head`
        sys.stdout = open(os.devnull, "w")
        code = 0
    except SystemExit as exc:
        code = exc.code
    if isinstance(code, str):  # SystemExit("message") from a library: a failure with a message
        print(f"error: {code}", file=sys.stderr)
        code = 1
    sys.exit(code or 0)
