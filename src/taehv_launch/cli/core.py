"""The Typer app every command registers on, the group that makes `run` the default command, and
the one place a user error becomes one `error:` line and an exit code.

`taehv-launch 16 h100` runs the default command (`run`); subcommands sit beside it
(`taehv-launch validate-env 16 h100`). Click would read "16" as a command name, so the
group inserts `run` when the first word is not a known command.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Annotated, Callable

import typer
from typer.core import TyperGroup

from ..compat import typer_click
from ..errors import EXIT_USAGE, UserError, one_line

click = typer_click()  # typer's own copy of click where it ships one

ROOT_OPTIONS = ("--help", "-h", "--version", "--install-completion", "--show-completion")


class DefaultCommandGroup(TyperGroup):
    default_command = "run"

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and re.fullmatch(r"-\d+", args[0]):  # click would read `-1` as an option
            from ..plan.profiles import gpu_count_line

            fail(gpu_count_line(args[0]))
        if args[:1] == ["help"]:  # `taehv-launch help [COMMAND]`: what --help says
            args = [*args[1:2], "--help"]
        if args and args[0] not in self.commands and args[0] not in ROOT_OPTIONS:
            args = [self.default_command, *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=DefaultCommandGroup,
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Train TAEHV by distilling a reference video VAE: resolve GPUS x PROFILE to a config, "
    "an accelerate/DeepSpeed YAML and the NCCL environment, then start `accelerate launch`.\n\n"
    "Examples: `taehv-launch 1 cpu` (built-in demo), `taehv-launch 16 h100 --dry-run`, "
    "`taehv-launch validate-env 8 h100`.",
)


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__

        print(f"taehv-launch {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", help="print the version and exit", is_eager=True, callback=_print_version)
    ] = False,
) -> None:
    """Options of taehv-launch itself (the commands have their own)."""


def fail(message: str, code: int = EXIT_USAGE) -> None:
    """One `error:` line on stderr and the exit code."""
    print(f"error: {one_line(message)}", file=sys.stderr)
    raise typer.Exit(code)


def exit_with(fn: Callable[[], int | None]) -> None:
    """Run a command's one function: its return value is the exit code, a UserError one line."""
    try:
        code = fn()
    except UserError as err:
        if os.environ.get("TAEHV_TRACEBACK"):
            raise
        fail(str(err), err.exit_code)
    except KeyboardInterrupt:
        fail("interrupted", 130)
    raise typer.Exit(code)
