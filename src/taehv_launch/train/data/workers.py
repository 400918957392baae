"""The trainer's DataLoader: its workers leave stop signals to their rank from the moment they exist.

`worker_init_fn` (clips.py) makes a running worker ignore SLURM's, `timeout`'s or a terminal's stop
signals (train/durability/stop.py, guard_worker). A worker that a group signal reaches before that
function ran would still die of it, and the rank with "DataLoader worker ... is killed by signal": at the
run's start, when a rollback opens a new loader, at each epoch of a loader without persistent workers, and
for the whole of a spawned worker's start (seconds: it imports torch). Python 3.14 makes forkserver the
default start method on Linux (3.10-3.13: fork). So WorkerLoader starts its workers with the stop signals
blocked (stop.workers_starting), under every start method.
"""

from __future__ import annotations

import multiprocessing

from torch.utils.data import DataLoader


def start_method(loader: DataLoader) -> str:
    """How the loader's workers are started: its own multiprocessing context's method, else the default."""
    ctx = loader.multiprocessing_context
    return ctx.get_start_method() if ctx is not None else multiprocessing.get_start_method()


class WorkerLoader(DataLoader):
    """A DataLoader whose worker processes are started with the stop signals blocked (workers_starting);
    pass `worker_init_fn=clips.worker_init_fn`, which keeps them ignored for the worker's life."""

    def __iter__(self):
        if self.num_workers == 0:
            return super().__iter__()
        from ..durability.stop import workers_starting

        with workers_starting(start_method(self)):
            return super().__iter__()
