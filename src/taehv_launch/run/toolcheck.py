"""Check rendered files with the tools' own validators (imports accelerate and DeepSpeed).

Used at launch, by validate-env and by the tests; never on the --dry-run path.
accelerate's loader rejects unknown top-level keys and bad distributed types; DeepSpeed's
`DeepSpeedConfig` rejects bad ZeRO keys and batch arithmetic that does not add up at the
real world size (we present that world size to it without starting a process group).
"""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path
from typing import Any
from unittest import mock

from ..errors import ConfigError


def check_accelerate_yaml(path: Path) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    try:
        load_config_from_file(str(path))
    except Exception as exc:
        raise ConfigError(f"accelerate rejects {path}: {type(exc).__name__}: {exc}") from None


def check_deepspeed_config(ds: dict[str, Any], world_size: int) -> None:
    with contextlib.redirect_stdout(io.StringIO()):   # DeepSpeed logs to stdout
        import deepspeed.runtime.config as ds_config
        logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
        try:
            with mock.patch.object(ds_config.dist, "get_world_size", return_value=world_size), \
                    mock.patch.object(ds_config.dist, "get_rank", return_value=0):
                ds_config.DeepSpeedConfig(dict(ds))
        except Exception as exc:
            raise ConfigError(f"DeepSpeed rejects the rendered config at world size {world_size}: "
                              f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
