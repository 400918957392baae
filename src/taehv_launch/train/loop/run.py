"""One training process from start to end: the Trainer beside its watchdog, and what a failure says."""

from __future__ import annotations

from pathlib import Path

from ...errors import PeerFailure, UserError
from ...plan.schema import Config
from ..durability.hang import end_hung_job
from ..durability.progress import PROGRESS
from ..durability.exitwrite import node_rank, leave_exit_status
from ..durability.watchdog import Watchdog, abort_job, stop_message
from .trainer import Trainer


def train(cfg: Config, run_dir: Path, resume: str | None, debug: bool, profile: bool) -> int:
    trainer = Trainer(cfg, run_dir, resume, debug, profile)
    dog = Watchdog(
        run_dir,
        trainer.rank,
        trainer.world,
        node_rank(),
        on_dead=abort_job(lambda code, msg: leave_exit_status(run_dir, code, msg), trainer.rank),
        hang_timeout=cfg.hang_timeout,
        hang_timeout_slow=cfg.hang_timeout_slow,
        on_hang=end_hung_job(run_dir, trainer.rank),
    ).start()
    if PROGRESS.phase_name == "setup":  # set up; the loop's own phases take over from here
        PROGRESS.set_phase("train")
    clean = False
    try:
        code = trainer.fit()
        clean = True
        return code
    except BaseException as exc:
        dog.wait_if_hanging()  # a peer stopped for a hang (our collective failed): our watchdog ends this process
        why = None
        if trainer.world > 1 and not isinstance(exc, (UserError, KeyboardInterrupt)):
            why = dog.find_dead_peer(timeout_s=dog.stale_s + 2 * dog.period_s)  # a transport error from a dead peer?
        dog.mark_dead(why or f"{type(exc).__name__}: {exc}")
        if why:
            raise PeerFailure(stop_message(why)) from None
        raise
    finally:
        dog.stop(clean)
        trainer.close()
