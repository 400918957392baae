"""The launch: build the plan, refuse what would fail, write the run directory and start the job."""

from __future__ import annotations

import sys

from ..errors import EXIT_ABORTED, EXIT_RESUMABLE, ConfigError
from ..plan.topology import check_local_gpus
from .dryrun import NO_FIT, cache_size_check, check_run_name, check_this_machine, print_plan
from .render import render
from .supervise import supervise
from .request import Request, build_plan


def launch(req: Request) -> int:
    from . import launch as edge
    from .host import visible_gpus
    from .lock import RunLock
    from .manifest import record_launch
    from .toolcheck import check_accelerate_yaml, check_deepspeed_config
    from ..rundir.launchid import begin_launch

    plan = build_plan(req)  # resolves --resume and refuses a checkpoint that cannot continue
    if plan.memory.fits is False and plan.options.task == "train":  # a cache job only encodes
        raise ConfigError(NO_FIT + plan.memory.detail)
    run_dir, notes = plan.run_dir, []
    check_run_name(plan)
    if plan.profile.device == "cuda":
        check_local_gpus(plan.topology, visible_gpus(), profile=plan.profile.name)
    notes += check_this_machine(plan)  # the trainer's inputs, output_dir, `latest`: what its dry run checks too
    size, too_big = cache_size_check(plan)
    if too_big:
        raise ConfigError(too_big)
    rendered = render(plan, run_dir)
    if rendered.deepspeed is not None:
        check_deepspeed_config(rendered.deepspeed, plan.world_size)
    edge.check_port_free(plan)  # before writing: a launch that cannot start must not repoint `latest`
    begin_launch()  # this launch's id, in our environment: the trainer inherits it; every record carries it
    lock = RunLock(run_dir, plan.topology.machine_rank)
    edge.prepare_run_dir(plan, run_dir, lock)  # refuses a run dir another launch holds
    notes += edge.write_files(run_dir, rendered.files)  # identical on every node: safe on a shared filesystem
    if size is not None:
        from ..dataindex.index import keep_index

        keep_index(size.entries)  # the job reads the videos listed here instead of listing them again
    notes += edge.write_files(run_dir, {f"env{rendered.node_suffix}.json": edge.env_record(plan, rendered)})
    check_accelerate_yaml(run_dir / "accelerate.yaml")
    notes += record_launch(plan, rendered, run_dir)  # manifest.jsonl; on a later launch, what changed
    print_plan(plan, rendered, run_dir, size)  # with the plan's notes (config file, resume)
    for note in notes:  # and what writing the run's files found
        print(f"  note      {note}")
    sys.stdout.flush()
    try:
        code = supervise(plan, rendered, run_dir)  # edge.run, again after a restartable failure
    finally:
        lock.release()
    log = run_dir / f"launch{rendered.node_suffix}.log"
    what = "cache job" if plan.options.task == "cache" else "trainer"
    print(f"taehv-launch: {what} exited with code {code}; run: {run_dir}; log: {log}", flush=True)
    recorded = edge.node_exit_status(run_dir, plan.topology.machine_rank) or {}
    if code == EXIT_ABORTED:
        kept = (
            "complete shards are kept: run the same command to continue"
            if plan.options.task == "cache"
            else "--resume auto continues from the newest complete checkpoint"
        )
        why = recorded.get("message") if recorded.get("code") == code else None  # the launcher's, or the trainer's
        print(f"error: {why or 'stopped at once by a second signal, nothing more was saved'}; {kept}", file=sys.stderr)
    elif code not in (0, EXIT_RESUMABLE):
        message = recorded.get("message") if recorded.get("code") == code else None
        print(f"error: {message or f'the {what} failed: see {log}'}", file=sys.stderr)
    return code
