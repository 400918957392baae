"""Every use of a library's private internals, in one place, each with the versions it was
checked on and what happens when the internal is not there.

Nothing else in the package touches a private name of torch, accelerate or DeepSpeed. When a
library moves one of these, the function below degrades as documented instead of failing
somewhere deep.
Checked on: torch 2.11-2.13, accelerate 1.15, DeepSpeed 0.19.8 (PLATFORM.md).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator


def hold_elastic_stop_signals(held: tuple[int, ...]) -> bool:
    """torchrun's agent turns SIGTERM/SIGINT into an exception and then kills the ranks' process
    groups (workers included) mid-checkpoint. Wrap its private signal handler so that `held`
    signals are left to the ranks. Returns False (nothing patched) when the handler is gone:
    then a stop signal that reaches the agent stops the job the way torchrun does by itself."""
    try:
        from torch.distributed.elastic.multiprocessing import api
    except ImportError:  # no torch.distributed: accelerate runs one process, nothing to patch
        return False
    original = getattr(api, "_terminate_process_handler", None)
    if original is None:
        return False
    if getattr(original, "_taehv_held", False):
        return True

    def handler(signum, frame):
        if signum in held:
            return
        original(signum, frame)

    handler._taehv_held = True
    api._terminate_process_handler = handler
    return True


def skip_deepspeed_shm_build() -> None:
    """DeepSpeed on CPU JIT-builds a shared-memory communication op (~30 s) that gloo does not need;
    mark it incompatible so it is not built. No-op if DeepSpeed no longer has the table."""
    import deepspeed.ops

    table = getattr(deepspeed.ops, "__compatible_ops__", None)
    if isinstance(table, dict):
        table["deepspeed_shm_comm"] = False


def init_zero_optimizer_state(zero_opt: Any) -> None:
    """ZeRO-1/2 creates its fp32 AdamW state lazily at the first step; a resume that writes the
    moments first needs it now. No-op where DeepSpeed has no lazy state (older releases)."""
    init = getattr(zero_opt, "_lazy_init_hp_params_optimizer_state", None)
    if callable(init):
        init()


def uncount_micro_batch(accelerator: Any) -> None:
    """A skipped micro-batch (non-finite loss) must not count towards gradient accumulation:
    accelerate counts micro-batches in `Accelerator.step` (public attribute, undocumented)."""
    accelerator.step -= 1


def add_gif(writer: Any, tag: str, gif: bytes, height: int, width: int, step: int) -> None:
    """An animated GIF in TensorBoard's Images tab, as SummaryWriter.add_video stores it, without
    add_video's moviepy dependency: the same Summary.Image proto through the writer's file writer
    (`SummaryWriter._get_file_writer`, private; checked on torch 2.11-2.13). Skipped if it is gone."""
    from torch.utils.tensorboard.summary import Summary

    get = getattr(writer, "_get_file_writer", None)
    if get is None:
        return
    image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=gif)
    get().add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)


@contextlib.contextmanager
def deepspeed_world(world_size: int) -> Iterator[None]:
    """Make DeepSpeedConfig see `world_size` processes without a process group, so it checks the
    batch arithmetic (train_batch_size = micro x world x accumulation) at the real world size.
    DeepSpeedConfig asks deepspeed.comm for the rank and world size and falls back to 1 process
    when that fails; there is no public way to tell it the world size before init."""
    import deepspeed.runtime.config as ds_config

    dist = ds_config.dist
    saved: dict[str, Callable] = {name: getattr(dist, name) for name in ("get_world_size", "get_rank")}
    dist.get_world_size = lambda *a, **k: world_size
    dist.get_rank = lambda *a, **k: 0
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)
