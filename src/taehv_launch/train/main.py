"""The program `accelerate launch` runs: read the rendered config, train, record the exit code.

    accelerate launch --config_file RUN/accelerate.yaml .../train/main.py --config RUN/config.py --run-dir RUN

A user error becomes one line and its exit code; the node's local rank 0 writes
RUN/exit_status[.node<k>].json so the launcher can report the trainer's code instead of
the one accelerate's wrappers make up.

Before anything else: stop signals become a flag (durability/stop.py), the trainer lock is held and the
launcher is watched (its death is a stop request), and STACKS_SIGNAL prints every thread's Python stack
(faulthandler, no GIL needed): the launcher asks a rank whose heartbeat stopped for them (run/freeze.py).
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import traceback
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="taehv-train", description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="config.py rendered by taehv-launch")
    p.add_argument("--run-dir", required=True, help="the run directory")
    p.add_argument("--resume", default=None, help="a complete checkpoint-<step> folder")
    p.add_argument("--debug", action="store_true")
    p.add_argument("--profile", action="store_true")
    p.add_argument(
        "--task",
        choices=("train", "cache"),
        default="train",
        help="train (default), or write the latent cache (taehv-launch cache)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from taehv_launch.train.durability import stop
    from taehv_launch.train.durability.exitwrite import node_rank, leave_exit_status

    stop.install()  # first: a stop signal during start-up is kept, not fatal
    args = parse_args(argv)
    run_dir = Path(args.run_dir)
    rank = os.environ.get("RANK", "0")
    stop.hold_trainer_lock(run_dir, node_rank())
    stop.watch_launcher(rank)
    from taehv_launch.errors import EXIT_FAILED, EXIT_RESUMABLE, PeerFailure, UserError, one_line
    from taehv_launch.rundir.heartbeat import STACKS_SIGNAL

    faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True)

    repeats = False  # a user error meets a restart again (run/restart.py); a dead peer or a crash may not
    try:
        from taehv_launch.plan.configfile import read_rendered_config
        from taehv_launch.plan.schema import make_config

        cfg = make_config(read_rendered_config(args.config))
        if args.task == "cache":
            from taehv_launch.train.cachejob import run_cache_job

            code, message = run_cache_job(cfg, run_dir, args.debug), "ok"
        else:
            from taehv_launch.train.loop.run import train

            code, message = train(cfg, run_dir, args.resume, args.debug, args.profile), "ok"
    except UserError as err:
        code, message, repeats = err.exit_code, one_line(str(err)), not isinstance(err, PeerFailure)
        print(f"[rank {rank}] error: {message}", file=sys.stderr, flush=True)
    except Exception as exc:  # a bug or a dead peer: full traceback, the job fails
        died = stop.worker_death_message(exc)
        if died:  # a DataLoader worker died (OOM killer, /dev/shm): say so in one line
            code, message = EXIT_FAILED, died
            print(f"[rank {rank}] error: {message}", file=sys.stderr, flush=True)
        else:
            traceback.print_exc()
            code, message = EXIT_FAILED, f"{type(exc).__name__}: {exc}"
    if code == EXIT_RESUMABLE and stop.launcher_gone():
        kept = "the cache job kept its complete shards" if args.task == "cache" else "the trainer saved a checkpoint"
        message = f"{stop.launcher_gone()}: {kept} and stopped"
    leave_exit_status(run_dir, code, message, repeats)
    return code


if __name__ == "__main__":
    sys.exit(main())
