"""User-facing errors: one line that says what is wrong and what to do, one exit code.

Everything a user can get wrong raises a subclass of `UserError`. The CLI and the trainer
entry point catch `UserError` in one place, print `error: <message>` to stderr and exit
with `exit_code`; tracebacks are shown only with TAEHV_TRACEBACK=1.
"""

from __future__ import annotations

# Exit codes, documented in docs/troubleshooting.md.
EXIT_OK = 0
EXIT_FAILED = 1  # the trainer failed (exception, dead rank, non-finite losses)
EXIT_USAGE = 2  # bad invocation or configuration: nothing was started
EXIT_RESUMABLE = 75  # stopped by a signal after saving a checkpoint: requeue with --resume auto (EX_TEMPFAIL)
EXIT_HUNG = 76  # a rank made no progress for hang_timeout: stacks dumped into <run>/heartbeat/stacks, job stopped
EXIT_ABORTED = 130  # a second signal: stopped at once, no checkpoint


def one_line(message: str) -> str:
    """A message on one line whatever values it quotes: line breaks and other control characters of
    a user's value are shown escaped (\\n), never as a second line."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in message)


class UserError(Exception):
    """A problem the user can fix. `str(err)` is the whole message: what and what to do."""

    exit_code = EXIT_USAGE


class ConfigError(UserError):
    """Bad GPU count, profile, config key, value type or config file."""


class TopologyError(UserError):
    """The scheduler environment, node count and GPU count disagree."""


class DataError(UserError):
    """Missing dataset, unreadable annotation file, no usable video."""


class ModelError(UserError):
    """Missing or incompatible reference VAE or TAEHV weights."""


class CheckpointError(UserError):
    """Missing, incomplete or incompatible checkpoint."""


class LaunchError(UserError):
    """The environment cannot run the launch (port in use, output not writable, disk full)."""


class TooManyBadSteps(UserError):
    """Non-finite losses for max_consecutive_bad_steps steps in a row: the run stops."""

    exit_code = EXIT_FAILED


class PeerFailure(UserError):
    """Another rank died; this one stops with a message naming it (not a transport traceback)."""

    exit_code = EXIT_FAILED
