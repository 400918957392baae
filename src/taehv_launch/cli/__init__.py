"""The `taehv-launch` command line. Parsing only: each command calls one function (run/, cluster/, bench/, ...).

`taehv-launch 16 h100` runs the default command (`run`); subcommands sit beside it
(`taehv-launch validate-env 16 h100`). Click would read "16" as a command name, so the
group inserts `run` when the first word is not a known command.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup

try:                       # typer >= 0.2x carries its own copy of click
    from typer import _click as click
except ImportError:        # older typer uses click itself
    import click

from ..errors import EXIT_USAGE, UserError, one_line
from ..plan.profiles import PROFILES
from ..plan.resolve import Options


class DefaultCommandGroup(TyperGroup):
    default_command = "run"

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and re.fullmatch(r"-\d+", args[0]):      # click would read `-1` as an option
            raise click.exceptions.UsageError(f"GPU count must be at least 1, got {args[0]}")
        if args and args[0] not in self.commands and args[0] not in ROOT_OPTIONS:
            args = [self.default_command, *args]
        return super().parse_args(ctx, args)


ROOT_OPTIONS = ("--help", "-h", "--version", "--install-completion", "--show-completion")

app = typer.Typer(cls=DefaultCommandGroup, add_completion=True, no_args_is_help=True,
                  pretty_exceptions_enable=False, rich_markup_mode="rich",
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Train TAEHV by distilling a reference video VAE: resolve GPUS x PROFILE to a config, "
                       "an accelerate/DeepSpeed YAML and the NCCL environment, then start `accelerate launch`.\n\n"
                       "Examples: `taehv-launch 1 cpu` (built-in demo), `taehv-launch 16 h100 --dry-run`, "
                       "`taehv-launch validate-env 8 h100`.")

Gpus = Annotated[str, typer.Argument(help="GPU count (processes on the cpu profile): 1, 8, 16, 48, 64 or any count "
                                          "derived by the documented rule", show_default=False)]
ProfileArg = Annotated[str, typer.Argument(help=f"hardware profile: {', '.join(PROFILES)}", show_default=False)]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="override a config key: KEY=VALUE "
                                                     "(Python literal), repeatable", show_default=False)]
ConfigOpt = Annotated[Optional[str], typer.Option("--config", help="a Python config file (seed style "
                                                  "`args = EasyDict()`); executed, so only files you trust")]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output only")]


def _request(gpus, profile, sets, config, options, num_nodes, node_rank, master_addr, master_port, gpus_per_node):
    from ..run.request import Request

    return Request(gpus=gpus, profile=profile, sets=sets or [], config=config, options=options,
                   num_nodes=num_nodes, node_rank=node_rank, master_addr=master_addr,
                   master_port=master_port, gpus_per_node=gpus_per_node)


NumNodes = Annotated[Optional[int], typer.Option("--num-nodes", help="nodes (default: from the scheduler)",
                                                 rich_help_panel="Topology")]
NodeRank = Annotated[Optional[int], typer.Option("--node-rank", help="this node's rank (default: from the scheduler)",
                                                 rich_help_panel="Topology")]
MasterAddr = Annotated[Optional[str], typer.Option("--master-addr", help="rendezvous host (node 0)",
                                                   rich_help_panel="Topology")]
MasterPort = Annotated[Optional[int], typer.Option("--master-port", help="rendezvous port (default 29500)",
                                                   rich_help_panel="Topology")]
GpusPerNode = Annotated[Optional[int], typer.Option("--gpus-per-node", help="processes per node on multi-node "
                                                    "runs (default 8)", rich_help_panel="Topology")]


@app.command("run", help="Resolve, render and start training on this node (the default command).")
def run_cmd(
    gpus: Gpus,
    profile: ProfileArg,
    set_: SetOpt = None,
    config: ConfigOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the resolved plan; write and start nothing")] = False,
    as_json: JsonOpt = False,
    resume: Annotated[Optional[str], typer.Option("--resume", help="a checkpoint-<step> folder, a run folder, "
                                                  "`auto` (newest complete checkpoint of the latest run), or `this-run` (only this "
                                                  "named run's own, else start fresh: for requeued jobs)")] = None,
    debug: Annotated[bool, typer.Option("--debug", help="verbose distributed logs, anomaly detection, few steps")] = False,
    profile_run: Annotated[bool, typer.Option("--profile", help="torch.profiler trace of a few steps "
                                              "and a table of where a step's time goes")] = False,
    run_name: Annotated[Optional[str], typer.Option("--run-name", help="run directory name (default: scheduler "
                                                    "job id, else a timestamp)")] = None,
    num_nodes: NumNodes = None, node_rank: NodeRank = None, master_addr: MasterAddr = None,
    master_port: MasterPort = None, gpus_per_node: GpusPerNode = None,
) -> None:
    from ..run import dryrun, start

    options = Options(resume=resume, debug=debug, profile_run=profile_run, run_name=run_name)
    req = _request(gpus, profile, set_, config, options, num_nodes, node_rank, master_addr, master_port, gpus_per_node)
    if as_json and not dry_run:
        _fail("--json goes with --dry-run (or validate-env)")
    _exit(lambda: dryrun.dry_run(req, as_json) if dry_run else start.launch(req))


@app.command("cache", help="Encode every video's views once with the reference VAE and store the latents "
                          "(--set latent_cache=DIR); train with the same --set to skip the reference encode.")
def cache_cmd(
    gpus: Gpus,
    profile: ProfileArg,
    views: Annotated[Optional[int], typer.Option("--views", help="views per video (a view: fixed frames, crop, "
                                                 "flip); default: the cache_views key, 4")] = None,
    set_: SetOpt = None,
    config: ConfigOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the resolved plan; write and start nothing")] = False,
    as_json: JsonOpt = False,
    debug: Annotated[bool, typer.Option("--debug", help="verbose distributed logs")] = False,
    run_name: Annotated[Optional[str], typer.Option("--run-name", help="log directory name (default: scheduler "
                                                    "job id, else cache-<timestamp>)")] = None,
    num_nodes: NumNodes = None, node_rank: NodeRank = None, master_addr: MasterAddr = None,
    master_port: MasterPort = None, gpus_per_node: GpusPerNode = None,
) -> None:
    from ..run import dryrun, start

    if views is not None and views < 1:
        _fail(f"--views must be at least 1, got {views}")
    sets = [*(set_ or []), *([f"cache_views={views}"] if views is not None else [])]
    options = Options(debug=debug, run_name=run_name, task="cache")
    req = _request(gpus, profile, sets, config, options, num_nodes, node_rank, master_addr, master_port, gpus_per_node)
    if as_json and not dry_run:
        _fail("--json goes with --dry-run")
    _exit(lambda: dryrun.dry_run(req, as_json) if dry_run else start.launch(req))


@app.command("render", help="Print a cluster job that runs GPUS x PROFILE on every node: `render slurm 16 h100 "
                           "--output-dir /shared/runs --set ...` (an sbatch script) or `render k8s ... --image IMG "
                           "--pvc CLAIM` (an indexed Job and a headless Service). Redirect it to a file.")
def render_cmd(
    kind: Annotated[str, typer.Argument(help="slurm or k8s", show_default=False)],
    gpus: Gpus,
    profile: ProfileArg,
    set_: SetOpt = None,
    config: ConfigOpt = None,
    output_dir: Annotated[Optional[str], typer.Option("--output-dir", help="where run directories go: an absolute "
                                                      "path every node mounts (= --set output_dir=...)")] = None,
    gpus_per_node: GpusPerNode = None,
    job_name: Annotated[Optional[str], typer.Option("--job-name", help="default taehv-GPUS-PROFILE")] = None,
    run_name: Annotated[Optional[str], typer.Option("--run-name", help="one run every job continues (default: each "
                                                    "job is a new run, named by its job id)")] = None,
    partition: Annotated[Optional[str], typer.Option("--partition", rich_help_panel="SLURM")] = None,
    account: Annotated[Optional[str], typer.Option("--account", rich_help_panel="SLURM")] = None,
    time: Annotated[Optional[str], typer.Option("--time", help="time limit, e.g. 24:00:00",
                                                rich_help_panel="SLURM")] = None,
    signal_seconds: Annotated[Optional[int], typer.Option("--signal-seconds", min=10, help="SIGUSR1 this long "
                                                          "before the time limit (default 120)",
                                                          rich_help_panel="SLURM")] = None,
    image: Annotated[Optional[str], typer.Option("--image", help="container image with taehv-launch installed",
                                                 rich_help_panel="Kubernetes")] = None,
    pvc: Annotated[Optional[str], typer.Option("--pvc", help="ReadWriteMany PersistentVolumeClaim for the runs",
                                               rich_help_panel="Kubernetes")] = None,
    mount: Annotated[Optional[str], typer.Option("--mount", help="where the claim is mounted (default /shared)",
                                                 rich_help_panel="Kubernetes")] = None,
    namespace: Annotated[Optional[str], typer.Option("--namespace", rich_help_panel="Kubernetes")] = None,
    grace_period: Annotated[Optional[int], typer.Option("--grace-period", min=1, help="seconds between SIGTERM and "
                                                        "SIGKILL (default 300)", rich_help_panel="Kubernetes")] = None,
    restarts: Annotated[Optional[int], typer.Option("--restarts", min=0, help="failures tolerated per pod "
                                                    "(default 3)", rich_help_panel="Kubernetes")] = None,
) -> None:
    from ..cluster.command import render_job

    req = _request(gpus, profile, set_, config, Options(), None, None, None, None, gpus_per_node)
    argv = ["taehv-launch", "render", *sys.argv[2:]] if sys.argv[1:2] == ["render"] else ["taehv-launch", "render"]
    _exit(lambda: render_job(kind, req, output_dir=output_dir, job_name=job_name, render_argv=argv, run_name=run_name,
                             partition=partition, account=account, time=time, signal_seconds=signal_seconds,
                             image=image, pvc=pvc, mount=mount, namespace=namespace, grace_period=grace_period,
                             restarts=restarts))


@app.command("validate-env", help="Preflight: check this node, the data and the models for the resolved plan.")
def validate_env_cmd(
    gpus: Gpus,
    profile: ProfileArg,
    set_: SetOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
    quick: Annotated[bool, typer.Option("--quick", help="skip the slow checks (all-reduce, model loads)")] = False,
    cache: Annotated[bool, typer.Option("--cache", help="check for `taehv-launch cache` (with --set latent_cache="
                                                        "DIR): the cache's size against the free space there")] = False,
    num_nodes: NumNodes = None, node_rank: NodeRank = None, master_addr: MasterAddr = None,
    master_port: MasterPort = None, gpus_per_node: GpusPerNode = None,
) -> None:
    from ..preflight import checks as preflight

    req = _request(gpus, profile, set_, config, Options(task="cache" if cache else "train"), num_nodes, node_rank,
                   master_addr, master_port, gpus_per_node)
    _exit(lambda: preflight.validate_env(req, as_json=as_json, quick=quick))


@app.command("bench", help="Time one training step and the reference encode for several micro-batches, side by "
                          "side; with --compare GPUS PROFILE: the naive pipeline vs our real trainer, lever by lever.")
def bench_cmd(
    gpus: Annotated[Optional[str], typer.Argument(help="with --compare: 1", show_default=False)] = None,
    profile: Annotated[Optional[str], typer.Argument(help="with --compare: h100, h200, a800 or cpu",
                                                     show_default=False)] = None,
    compare: Annotated[bool, typer.Option("--compare", help="naive pipeline vs the real trainer at the profile's "
                                                            "shape, one GPU, one run")] = False,
    micro: Annotated[Optional[list[int]], typer.Option("--micro", help="micro-batch sizes (repeatable)")] = None,
    height: Annotated[int, typer.Option(help="clip height")] = 480,
    width: Annotated[int, typer.Option(help="clip width")] = 720,
    n_frames: Annotated[int, typer.Option("--n-frames", help="frames per clip")] = 12,
    ref_vae_type: Annotated[Optional[str], typer.Option("--ref-vae-type", help="also time this reference VAE "
                                                        "(real architecture, random weights)")] = None,
    chunk: Annotated[Optional[list[int]], typer.Option("--chunk", help="reference encode chunk sizes")] = None,
    set_: SetOpt = None,
    config: ConfigOpt = None,
    steps: Annotated[int, typer.Option(help="--compare: timed steps per in-process row")] = 5,
    trainer_steps: Annotated[int, typer.Option("--trainer-steps", help="--compare: steps of the real trainer run "
                                               "(the first 10 are warm-up)")] = 40,
    levers: Annotated[bool, typer.Option("--levers", help="--compare: one row per speed lever")] = False,
    crop: Annotated[int, typer.Option(help="--compare --levers: Seraena crop to try (0: none)")] = 256,
    phases: Annotated[bool, typer.Option("--phases", help="--compare: a second trainer run with --profile "
                                                          "for per-phase times")] = False,
    data_root: Annotated[Optional[str], typer.Option("--data-root", help="--compare: real videos to train "
                                                     "on (default: synthetic ones at the profile's size)")] = None,
    workdir: Annotated[Optional[str], typer.Option(help="--compare: where assets and runs go "
                                                   "(default <output_dir>/bench-compare)")] = None,
    loader: Annotated[bool, typer.Option("--loader", help="the data loader's clips/s per decoder and worker "
                                                          "count, on --data-root")] = False,
    workers: Annotated[Optional[list[int]], typer.Option("--workers", help="--loader, --index: worker counts "
                                                         "(repeatable)")] = None,
    decoder: Annotated[Optional[list[str]], typer.Option("--decoder", help="--loader: opencv, opencv-1thread, "
                                                         "pyav, pyav-1thread (repeatable)")] = None,
    seconds: Annotated[float, typer.Option(help="--loader: seconds per DataLoader row")] = 10.0,
    clips: Annotated[int, typer.Option(help="--loader: clips per decode row")] = 64,
    cached: Annotated[int, typer.Option("--cached", help="--compare: also write a latent cache of this many "
                                                         "views per video and train from it (0: no)")] = 0,
    cached_set: Annotated[Optional[list[str]], typer.Option("--cached-set", help="--compare --cached: a --set for "
                                                            "the run from the cache only (repeatable)")] = None,
    index: Annotated[bool, typer.Option("--index", help="the video index at --files synthetic videos: build and "
                                                        "load time, rank memory, worker memory growth (also: "
                                                        "`bench index`)")] = False,
    files: Annotated[int, typer.Option("--files", help="--index: synthetic videos in the index")] = 3_000_000,
    baseline: Annotated[bool, typer.Option("--baseline/--no-baseline", help="--index: also the list of VideoEntry "
                                                                            "used before #27")] = True,
    as_json: JsonOpt = False,
) -> None:
    if index or gpus == "index":
        if profile is not None:
            _fail(f"unexpected argument {profile!r}: bench index takes only options (--files N --workers W)")
        from ..bench import index as bench_index

        _exit(lambda: bench_index.run(files, workers or [12], baseline, as_json))
    if loader:
        if not data_root:
            _fail("bench --loader needs --data-root DIR (a folder of videos)")
        from ..bench import loader as bench_loader

        _exit(lambda: bench_loader.run(data_root, height, width, n_frames, (micro or [8])[0], workers or [4, 8, 12],
                                       decoder or ["opencv", "opencv-1thread", "pyav", "pyav-1thread"], seconds,
                                       clips, as_json))
    if compare:
        if gpus is None or profile is None:
            _fail("bench --compare needs GPUS PROFILE, e.g. `taehv-launch bench --compare 1 h100`")
        from ..bench import compare as bench_compare

        req = _request(gpus, profile, set_, config, Options(), None, None, None, None, None)
        _exit(lambda: bench_compare.run(req, steps, trainer_steps, levers, chunk or [], crop, data_root, workdir,
                                        phases, as_json, cached, cached_set or []))
    if gpus is not None:
        _fail(f"unexpected argument {gpus!r}: GPUS PROFILE go with --compare")
    from ..bench import step as bench

    _exit(lambda: bench.run(micro or [1, 2], height, width, n_frames, ref_vae_type, chunk or [1], as_json=as_json))


@app.command("index", help="List the videos under DATA_ROOT once and write an annotation file (.csv, .jsonl, "
                          ".json or .txt) that later jobs read instead of scanning: --set annotation_file=FILE.")
def index_cmd(
    data_root: Annotated[str, typer.Argument(help="the folder of videos (scanned recursively)", show_default=False)],
    output: Annotated[str, typer.Option("-o", "--output", help="the annotation file to write; its extension picks "
                                                              "the format", show_default=False)],
    force: Annotated[bool, typer.Option("--force", help="replace -o FILE if it exists")] = False,
) -> None:
    from .index import write_index

    _exit(lambda: write_index(data_root, output, force))


@app.command("keys", help="List every training-config key with its type, default and meaning.")
def keys_cmd(as_json: Annotated[bool, typer.Option("--json", help="the schema as JSON: name, type, default, "
                                                                  "help, choices, aliases")] = False) -> None:
    from .keys import list_keys

    _exit(lambda: list_keys(as_json))


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__

        print(f"taehv-launch {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", help="print the version and exit", is_eager=True,
                                                callback=_print_version)] = False) -> None:
    """Options of taehv-launch itself (the commands have their own)."""


def _fail(message: str, code: int = EXIT_USAGE) -> None:
    print(f"error: {one_line(message)}", file=sys.stderr)
    raise typer.Exit(code)


def _exit(fn) -> None:
    try:
        code = fn()
    except UserError as err:
        if os.environ.get("TAEHV_TRACEBACK"):
            raise
        _fail(str(err), err.exit_code)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    raise typer.Exit(code)


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
    except BrokenPipeError:                    # `taehv-launch keys | head`
        sys.stdout = open(os.devnull, "w")
        code = 0
    except SystemExit as exc:
        code = exc.code
    if isinstance(code, str):            # SystemExit("message") from a library: a failure with a message
        print(f"error: {code}", file=sys.stderr)
        code = 1
    sys.exit(code or 0)

