"""`taehv-launch bench step|compare|loader|index`: measure one thing each.

The old flag forms (`bench`, `bench --compare 1 h100`, `bench --loader`, `bench --index`) still
work for one release: the group sends any first word that is not a subcommand to a hidden
`legacy` command, which runs the new one and then says so in one `note:` line on stderr.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Callable, Optional

import typer
from typer.core import TyperGroup

from .core import app, exit_with, fail
from .options import JsonOpt, plan_options

if TYPE_CHECKING:
    from ..run.request import Request

LOADER_DECODERS = [
    "opencv",
    "opencv-1thread",
    "pyav",
    "pyav-1thread",
]  # = bench/checks.py's (no import: --help stays light)


class BenchGroup(TyperGroup):
    def parse_args(self, ctx, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h")):
            args = ["legacy", *args]  # `bench`, `bench --compare 1 h100`, ...: the old forms
        return super().parse_args(ctx, args)


bench_app = typer.Typer(
    cls=BenchGroup,
    help="Measure: `bench step` (one training step and the reference encode), "
    "`bench compare GPUS PROFILE` (naive pipeline vs our real trainer), "
    "`bench loader` (the data loader's clips/s), `bench index` (the video "
    "index at millions of files).",
)
app.add_typer(bench_app, name="bench")

Micro = Annotated[Optional[list[int]], typer.Option("--micro", help="micro-batch sizes (repeatable)")]
Height = Annotated[int, typer.Option(help="clip height")]
Width = Annotated[int, typer.Option(help="clip width")]
NFrames = Annotated[int, typer.Option("--n-frames", help="frames per clip")]
Chunk = Annotated[Optional[list[int]], typer.Option("--chunk", help="reference encode chunk sizes (repeatable)")]
DataRoot = Annotated[Optional[str], typer.Option("--data-root", help="a folder of videos")]
Workers = Annotated[Optional[list[int]], typer.Option("--workers", help="DataLoader worker counts (repeatable)")]


@bench_app.command(
    "step", help="Time one training step and the reference encode for several micro-batches, side by side."
)
def step_cmd(
    micro: Micro = None,
    height: Height = 480,
    width: Width = 720,
    n_frames: Annotated[
        Optional[int], typer.Option("--n-frames", help="frames per clip (default: the family's, 12 without one)")
    ] = None,
    ref_vae_type: Annotated[
        Optional[str],
        typer.Option("--ref-vae-type", help="also time this reference VAE (real architecture, random weights)"),
    ] = None,
    chunk: Chunk = None,
    as_json: JsonOpt = False,
    decoder_arch: Annotated[str, typer.Option("--decoder-arch", help="TAEHV's decoder: base or super")] = "base",
    checkpointing: Annotated[
        str, typer.Option("--checkpointing", help="step rows without (off), with (on) gradient checkpointing, or both")
    ] = "both",
    encode_micro: Annotated[
        Optional[list[int]], typer.Option("--encode-micro", help="clips per encode (default: max --micro; 0: none)")
    ] = None,
    no_step: Annotated[bool, typer.Option("--no-step", help="time the reference encode only")] = False,
) -> None:
    def go() -> int:
        from ..bench import checks

        frames = checks.step_frames(n_frames, ref_vae_type)
        checks.step_args(micro or [1, 2], height, width, frames, ref_vae_type, chunk or [1], decoder_arch)
        checks.at_least("--encode-micro", encode_micro or [], 0, "give clips per encode call, 0: no encode")
        ckpt = {"off": (False,), "on": (True,), "both": (False, True)}.get(checkpointing)
        if ckpt is None:
            raise checks.ConfigError(f"--checkpointing {checkpointing!r}: use off, on or both")
        from ..bench import step

        return step.run(
            micro or [1, 2], height, width, frames, ref_vae_type, chunk or [1], as_json=as_json,
            decoder_arch=decoder_arch, checkpointing=ckpt, encode_micros=encode_micro, step=not no_step,
        )  # fmt: skip

    exit_with(go)


@bench_app.command(
    "compare", help="The naive pipeline vs our real trainer at the profile's shape, lever by lever: one GPU, one run."
)
@plan_options(topology=())
def compare_cmd(
    req: Request,
    steps: Annotated[int, typer.Option(help="timed steps per in-process row")] = 5,
    trainer_steps: Annotated[
        int, typer.Option("--trainer-steps", help="steps of the real trainer run (the first 10 are warm-up)")
    ] = 40,
    levers: Annotated[bool, typer.Option("--levers", help="one row per speed lever")] = False,
    chunk: Chunk = None,
    crop: Annotated[int, typer.Option(help="--levers: Seraena crop to try (0: none)")] = 256,
    phases: Annotated[
        bool, typer.Option("--phases", help="a second trainer run with --profile for per-phase times")
    ] = False,
    data_root: Annotated[
        Optional[str],
        typer.Option("--data-root", help="real videos to train on (default: synthetic ones at the profile's size)"),
    ] = None,
    workdir: Annotated[
        Optional[str], typer.Option(help="where assets and runs go (default <output_dir>/bench-compare)")
    ] = None,
    cached: Annotated[
        int,
        typer.Option(
            "--cached", help="also write a latent cache of this many views per video and train from it (0: no)"
        ),
    ] = 0,
    cached_set: Annotated[
        Optional[list[str]],
        typer.Option("--cached-set", help="--cached: a --set for the runs from the cache only (repeatable)"),
    ] = None,
    as_json: JsonOpt = False,
    cached_row: Annotated[
        Optional[list[str]],
        typer.Option(
            "--cached-row",
            help="--cached: one more run from the cache with these --set items on top, space-separated, e.g. "
            "'compile_mode=reduce-overhead': one row per lever (repeatable)",
        ),
    ] = None,
    online: Annotated[
        bool,
        typer.Option("--online/--no-online", help="the trainer row that encodes online (--no-online: leave it out)"),
    ] = True,
    row_timeout: Annotated[
        float,
        typer.Option(
            "--row-timeout",
            help="seconds a trainer run may take; a run from the cache past it is a row saying so (0: no limit)",
        ),
    ] = 0,
    deadline: Annotated[
        float,
        typer.Option(
            "--deadline",
            help="seconds the whole measurement may take: later runs get what is left, none starts with under 30 s (0: no limit)",
        ),
    ] = 0,
) -> None:
    def go() -> int:
        from ..bench import checks

        checks.compare_args(steps, trainer_steps, chunk or [], crop, data_root, cached, cached_set)
        rows = lever_rows(cached_row or [], cached, req, cached_set or [])
        if phases and not online:
            raise checks.ConfigError("--phases profiles the online trainer run: drop --no-online or --phases")
        for option, value in (("--row-timeout", row_timeout), ("--deadline", deadline)):
            if not value >= 0:  # nan too
                raise checks.ConfigError(f"{option} {value:g}: give seconds, or 0 for no limit, e.g. {option} 300")
        from ..bench import compare

        return compare.run(
            req,
            steps,
            trainer_steps,
            levers,
            chunk or [],
            crop,
            data_root,
            workdir,
            phases,
            as_json,
            cached,
            cached_set or [],
            online=online,
            cached_rows=rows,
            row_timeout=row_timeout,
            deadline=deadline,
        )

    exit_with(go)


def lever_rows(texts: list[str], cached: int, req: Request, cached_sets: list[str]) -> list[list[str]]:
    """--cached-row values: each one row's --set items (shell-style words), checked as --set is and
    resolved with the command's --set and --cached-set as the run from the cache will be (a value the plan
    refuses is refused now, not after minutes of measuring)."""
    import shlex
    from dataclasses import replace

    from ..errors import ConfigError
    from ..run.request import build_plan

    if texts and not cached:
        raise ConfigError("--cached-row adds runs from the latent cache: give --cached K too, e.g. --cached 1")
    rows: list[list[str]] = []
    if not cached:
        return rows
    build_plan(req)  # the command's own --set first: its error names no lever
    for option, text in [("--cached-set", None), *(("--cached-row", t) for t in texts)]:
        try:
            items = [] if text is None else shlex.split(text)
        except ValueError as err:
            raise ConfigError(f"--cached-row {text!r}: {err}: give KEY=VALUE items separated by spaces") from None
        if text is not None and not items:
            raise ConfigError(
                "--cached-row '': give one or more KEY=VALUE items, e.g. --cached-row 'micro_batch_size=9'"
            )
        what = f"{option} {' '.join(cached_sets) if text is None else repr(text)}"
        try:
            memory = build_plan(replace(req, sets=[*req.sets, *cached_sets, *items])).memory
        except ConfigError as err:
            raise ConfigError(f"{what}: {err}") from None
        if memory.fits is False:  # as the launch refuses it (run/dryrun.py)
            raise ConfigError(f"{what}: this plan will not fit in GPU memory: {memory.detail}")
        rows += [items] if text is not None else []
    return rows


@bench_app.command("loader", help="The data loader's clips/s per decoder and worker count, on --data-root.")
def loader_cmd(
    data_root: DataRoot = None,
    height: Height = 480,
    width: Width = 720,
    n_frames: NFrames = 12,
    micro: Annotated[int, typer.Option("--micro", help="micro-batch size")] = 8,
    workers: Workers = None,
    decoder: Annotated[
        Optional[list[str]],
        typer.Option("--decoder", help="opencv, opencv-1thread, pyav, pyav-1thread, nvdec (repeatable)"),
    ] = None,
    resolution: Annotated[
        Optional[list[int]], typer.Option("--resolution", help="source video heights to bench, e.g. 720 (repeatable)")
    ] = None,
    seconds: Annotated[float, typer.Option(help="seconds per DataLoader row")] = 10.0,
    clips: Annotated[int, typer.Option(help="clips per decode row")] = 64,
    as_json: JsonOpt = False,
    decode_threads: Annotated[
        int,
        typer.Option(
            "--decode-threads", help="NVDEC threads for --decoder nvdec; 0 = chosen from the sources, as training does"
        ),
    ] = 0,
) -> None:
    if not data_root:
        fail("bench loader needs --data-root DIR (a folder of videos)")
    more = {"resolutions": resolution} if resolution else {}  # loader.run's default: every height found
    more["threads"] = decode_threads

    workers, decoders = workers or [4, 8, 12], decoder or LOADER_DECODERS

    def go() -> int:
        from ..bench import checks

        checks.loader_args(height, width, n_frames, micro, workers, decoders, seconds, clips, resolution)
        from ..bench import loader

        return loader.run(data_root, height, width, n_frames, micro, workers, decoders, seconds, clips, as_json, **more)

    exit_with(go)


@bench_app.command(
    "index", help="The video index at --files synthetic videos: build and load time, rank memory, worker memory growth."
)
def index_cmd(
    files: Annotated[int, typer.Option("--files", help="synthetic videos in the index")] = 3_000_000,
    workers: Workers = None,
    baseline: Annotated[
        bool, typer.Option("--baseline/--no-baseline", help="also the list of VideoEntry used before #27")
    ] = True,
    as_json: JsonOpt = False,
) -> None:
    from ..bench import index

    exit_with(lambda: index.run(files, workers or [12], baseline, as_json))


def _old_form(old: str, new: str, command: Callable[[], None]) -> None:
    """Run the new subcommand for an old form; when it succeeds, one line says what to type instead."""
    try:
        command()
    except typer.Exit as done:
        if not done.exit_code:
            what = "the flag goes" if old.startswith("bench --") else "the old form goes"
            print(f"note: `{old}` is now `{new}`; {what} in the next release", file=sys.stderr)
        raise


@bench_app.command("legacy", hidden=True)
def legacy_cmd(
    gpus: Annotated[Optional[str], typer.Argument()] = None,
    profile: Annotated[Optional[str], typer.Argument()] = None,
    compare: Annotated[bool, typer.Option("--compare")] = False,
    loader: Annotated[bool, typer.Option("--loader")] = False,
    index: Annotated[bool, typer.Option("--index")] = False,
    micro: Micro = None,
    height: Height = 480,
    width: Width = 720,
    n_frames: NFrames = 12,
    ref_vae_type: Annotated[Optional[str], typer.Option("--ref-vae-type")] = None,
    chunk: Chunk = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set")] = None,
    config: Annotated[Optional[str], typer.Option("--config")] = None,
    steps: Annotated[int, typer.Option()] = 5,
    trainer_steps: Annotated[int, typer.Option("--trainer-steps")] = 40,
    levers: Annotated[bool, typer.Option("--levers")] = False,
    crop: Annotated[int, typer.Option()] = 256,
    phases: Annotated[bool, typer.Option("--phases")] = False,
    data_root: DataRoot = None,
    workdir: Annotated[Optional[str], typer.Option()] = None,
    workers: Workers = None,
    decoder: Annotated[Optional[list[str]], typer.Option("--decoder")] = None,
    seconds: Annotated[float, typer.Option()] = 10.0,
    clips: Annotated[int, typer.Option()] = 64,
    cached: Annotated[int, typer.Option("--cached")] = 0,
    cached_set: Annotated[Optional[list[str]], typer.Option("--cached-set")] = None,
    files: Annotated[int, typer.Option("--files")] = 3_000_000,
    baseline: Annotated[bool, typer.Option("--baseline/--no-baseline")] = True,
    as_json: JsonOpt = False,
) -> None:
    """Before the subcommands, `bench` chose its tool by flags; the same flags, for one more release."""
    if index:
        if gpus is not None:
            fail(f"unexpected argument {gpus!r}: bench index takes only options (--files N --workers W)")
        _old_form("bench --index", "bench index", lambda: index_cmd(files, workers, baseline, as_json))
    if loader:
        if not data_root:
            fail("bench --loader needs --data-root DIR (a folder of videos)")
        _old_form(
            "bench --loader",
            "bench loader",
            lambda: loader_cmd(
                data_root, height, width, n_frames, (micro or [8])[0], workers, decoder, None, seconds, clips, as_json
            ),
        )
    if compare:
        if gpus is None or profile is None:
            fail("bench --compare needs GPUS PROFILE, e.g. `taehv-launch bench --compare 1 h100`")
        _old_form(
            "bench --compare",
            "bench compare",
            lambda: compare_cmd(
                gpus=gpus,
                profile=profile,
                set_=set_,
                config=config,
                steps=steps,
                trainer_steps=trainer_steps,
                levers=levers,
                chunk=chunk,
                crop=crop,
                phases=phases,
                data_root=data_root,
                workdir=workdir,
                cached=cached,
                cached_set=cached_set,
                as_json=as_json,
            ),
        )
    if gpus is not None:
        fail(f"unexpected argument {gpus!r}: GPUS PROFILE go with --compare")
    _old_form("bench", "bench step", lambda: step_cmd(micro, height, width, n_frames, ref_vae_type, chunk, as_json))
