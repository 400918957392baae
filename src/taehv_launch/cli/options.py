"""The options every plan-resolving command shares, declared once: GPUS PROFILE, --set, --config
and the topology options. `@plan_options()` adds them to a command and hands it one Request."""

from __future__ import annotations

import functools
import inspect
from typing import Annotated, Callable, Optional

import typer

from ..plan.profiles import PROFILES

Gpus = Annotated[
    str,
    typer.Argument(
        help="GPU count (processes on the cpu profile): 1, 8, 16, 48, 64 or any count derived by the documented rule",
        show_default=False,
    ),
]
ProfileArg = Annotated[str, typer.Argument(help=f"hardware profile: {', '.join(PROFILES)}", show_default=False)]
SetOpt = Annotated[
    Optional[list[str]],
    typer.Option("--set", help="override a config key: KEY=VALUE (Python literal), repeatable", show_default=False),
]
ConfigOpt = Annotated[
    Optional[str],
    typer.Option(
        "--config", help="a Python config file (seed style `args = EasyDict()`); executed, so only files you trust"
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output only")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="print the resolved plan; write and start nothing")]

TOPOLOGY = {
    "num_nodes": Annotated[
        Optional[int],
        typer.Option("--num-nodes", help="nodes (default: from the scheduler)", rich_help_panel="Topology"),
    ],
    "node_rank": Annotated[
        Optional[int],
        typer.Option("--node-rank", help="this node's rank (default: from the scheduler)", rich_help_panel="Topology"),
    ],
    "master_addr": Annotated[
        Optional[str], typer.Option("--master-addr", help="rendezvous host (node 0)", rich_help_panel="Topology")
    ],
    "master_port": Annotated[
        Optional[int], typer.Option("--master-port", help="rendezvous port (default 29500)", rich_help_panel="Topology")
    ],
    "gpus_per_node": Annotated[
        Optional[int],
        typer.Option(
            "--gpus-per-node", help="processes per node on multi-node runs (default 8)", rich_help_panel="Topology"
        ),
    ],
}


def plan_options(topology: tuple[str, ...] = tuple(TOPOLOGY)) -> Callable:
    """Give a command GPUS PROFILE --set --config and the named topology options; the command takes
    them as one `req: Request` (run/request.py; its run options are Options(): a command that has
    its own replaces them). The command's own arguments (no default) come before GPUS, its own
    options after --config, the topology options last."""

    def wrap(fn: Callable) -> Callable:
        own = [
            p.replace(annotation=eval(p.annotation, fn.__globals__) if isinstance(p.annotation, str) else p.annotation)
            for p in inspect.signature(fn).parameters.values()
            if p.name != "req"
        ]
        param = functools.partial(inspect.Parameter, kind=inspect.Parameter.POSITIONAL_OR_KEYWORD)
        params = [
            *(p for p in own if p.default is p.empty),
            param("gpus", annotation=Gpus),
            param("profile", annotation=ProfileArg),
            param("set_", annotation=SetOpt, default=None),
            param("config", annotation=ConfigOpt, default=None),
            *(p for p in own if p.default is not p.empty),
            *(param(name, annotation=TOPOLOGY[name], default=None) for name in topology),
        ]

        @functools.wraps(fn)
        def command(**kwargs):
            from ..run.request import Request  # at call time: `--help` stays light

            req = Request(
                gpus=kwargs.pop("gpus"),
                profile=kwargs.pop("profile"),
                sets=list(kwargs.pop("set_") or []),
                config=kwargs.pop("config"),
                **{name: kwargs.pop(name) for name in topology},
            )
            return fn(req=req, **kwargs)

        command.__signature__ = inspect.Signature(params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return wrap
