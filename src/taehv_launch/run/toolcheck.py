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

from ..compat import deepspeed_world
from ..errors import ConfigError, LaunchError

# What the libraries raise for a file they reject (anything else is not the config's fault).
ACCELERATE_REJECTS = (TypeError, ValueError, KeyError)  # unknown key, bad enum value (+ yaml errors)
DEEPSPEED_REJECTS = (AssertionError, ValueError, TypeError, KeyError)  # batch asserts, pydantic ValidationError


def _library_problem(tool: str, exc: BaseException) -> LaunchError:
    return LaunchError(
        f"{tool} could not check the rendered file ({type(exc).__name__}: {exc}): the installed "
        f"{tool} differs from the one taehv-launch supports; reinstall with pip install taehv-launch"
    )


def check_accelerate_yaml(path: Path) -> None:
    import yaml
    from accelerate.commands.config.config_args import load_config_from_file

    try:
        load_config_from_file(str(path))
    except (*ACCELERATE_REJECTS, yaml.YAMLError) as exc:
        raise ConfigError(f"accelerate rejects {path}: {type(exc).__name__}: {exc}") from None
    except (ImportError, AttributeError) as exc:
        raise _library_problem("accelerate", exc) from None


def check_deepspeed_config(ds: dict[str, Any], world_size: int) -> None:
    with contextlib.redirect_stdout(io.StringIO()):  # DeepSpeed logs to stdout
        import deepspeed.runtime.config as ds_config

        logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
        try:
            with deepspeed_world(world_size):
                ds_config.DeepSpeedConfig(dict(ds))
        except (*DEEPSPEED_REJECTS, ds_config.DeepSpeedConfigError) as exc:
            raise ConfigError(
                f"DeepSpeed rejects the rendered config at world size {world_size}: "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            ) from None
        except (ImportError, AttributeError) as exc:
            raise _library_problem("DeepSpeed", exc) from None
