"""Values that become paths, command lines or file contents: refused in one line when no file
system or command line can carry them (a NUL byte, text that is not UTF-8, a name over 255 bytes).
Used by the launch (every path-valued config key, --config) and by render (every value)."""

from __future__ import annotations

from pathlib import PurePosixPath

from ..errors import ConfigError

# config keys whose values are paths on the machine that runs the job
PATH_KEYS = (
    "output_dir",
    "data_root",
    "annotation_file",
    "ref_vae_path",
    "latent_cache",
    "pretrained_model_path",
    "index_cache_dir",
    "compile_cache_dir",
)


def check_text(label: str, text: str) -> None:
    """A value that goes into a command line or a manifest: no NUL byte (no argv can carry one) and
    valid text (bytes that were not UTF-8 cannot be written into a job file faithfully)."""
    if "\0" in text:
        raise ConfigError(f"{label} {shown(text)} contains a NUL byte, which no command line can carry: remove it")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        raise ConfigError(f"{label} {shown(text)} is not valid UTF-8 text: use a UTF-8 (or plain ASCII) value")


def check_path(label: str, text: str) -> None:
    """check_text, and a path Linux can open (a name at most 255 bytes, the whole under 4096)."""
    check_text(label, text)
    if len(text.encode()) >= 4096 or any(len(part.encode()) > 255 for part in PurePosixPath(text).parts):
        raise ConfigError(
            f"{label} {shown(text)} is longer than a path can be (255 bytes a folder or file "
            f"name, 4095 in all): use a shorter path"
        )


def shown(text: str) -> str:
    """A value for a one-line message: its repr, cut short when long."""
    return repr(text) if len(text) <= 100 else f"{text[:60]!r}... ({len(text)} characters)"
