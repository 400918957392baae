"""Every use of a library's private internals, in one place, each with the versions it was
checked on and what happens when the internal is not there.

Nothing else in the package touches a private name of torch, accelerate, DeepSpeed, diffusers or typer
(tests/test_compat_rule.py reads the code to check). When a library moves one of these, the function
below degrades as documented instead of failing somewhere deep.
Checked on: torch 2.11-2.13, accelerate 1.15, DeepSpeed 0.19.8 (PLATFORM.md), typer 0.29.2.
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


def shutdown_loader_workers(loader: Any) -> None:
    """Stop a DataLoader's persistent workers now and forget its iterator, so that the next `iter(loader)`
    starts new ones (a rollback reopens the data before the new loader forks its own). torch keeps them in
    `DataLoader._iterator` and stops them with `_shutdown_workers()` (private; checked on torch 2.13);
    where either is gone, dropping the iterator leaves the shutdown to its `__del__`."""
    it = getattr(loader, "_iterator", None)
    getattr(it, "_shutdown_workers", lambda: None)()
    if hasattr(loader, "_iterator"):
        loader._iterator = None


def loader_worker_pids(iterator: Any) -> list[int]:
    """The worker processes' pids of a DataLoader iterator (`_MultiProcessingDataLoaderIter._workers`,
    private; checked on torch 2.13); [] for a single-process iterator or where the list is gone."""
    return [w.pid for w in getattr(iterator, "_workers", [])]


def uncompiled(module: Any) -> Any:
    """The module torch.compile wrapped (`OptimizedModule._orig_mod`, private; checked on torch
    2.13), or `module` itself when it is not a compiled wrapper."""
    return getattr(module, "_orig_mod", module)


def typer_click() -> Any:
    """The click that typer's commands run on: typer 0.2x ships its own copy (`typer._click`, private;
    checked on typer 0.29.2); an older typer uses the click package itself."""
    try:
        from typer import _click as click
    except ImportError:
        import click
    return click


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


# The flight recorder (torch's ring buffer of the last collectives, PyTorch 2.5+). Its environment
# variables were renamed from TORCH_NCCL_* to TORCH_FR_* when it became backend-neutral; the old
# buffer-size name still works but warns on every rank at each process group's creation (seen on
# torch 2.13), so the buffer size goes under the name the installed torch reads first. The dump-file
# prefix is read only when torch writes a dump: both of its names are set.
FR_NEW_NAMES_FROM = (2, 11)  # checked: 2.13 (TORCH_NCCL_TRACE_BUFFER_SIZE warns "deprecated"); 2.11 GPU image


def torch_version() -> tuple[int, int] | None:
    """(major, minor) of the installed torch, read from its metadata without importing it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = version("torch").split(".")[:2]
        return int(major), int("".join(c for c in minor if c.isdigit()) or 0)
    except (PackageNotFoundError, ValueError):
        return None


def flight_recorder_buffer_var(version: tuple[int, int] | None) -> str:
    """The variable that sets the flight recorder's size in this torch (unknown: the old name, which
    every release reads)."""
    return (
        "TORCH_FR_BUFFER_SIZE"
        if version is not None and version >= FR_NEW_NAMES_FROM
        else "TORCH_NCCL_TRACE_BUFFER_SIZE"
    )


FR_BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FR_DUMP_FILE_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")


def flight_recorder_dumps(timeout_s: float = 20.0) -> dict[str, bytes]:
    """This process's flight-recorder contents, as torch writes them at a timeout (a pickle):
    {"nccl": ...} from `torch._C._distributed_c10d._dump_nccl_trace` (CUDA builds), {"fr": ...} from
    `_dump_fr_trace` (torch's generic recorder, which gloo feeds; torch 2.8+). Private functions, checked
    on torch 2.13 (CPU: _dump_fr_trace; CUDA builds add _dump_nccl_trace); a missing one is skipped,
    as is a recorder with no entries. Runs in a helper thread given `timeout_s`: a dump that blocks
    must not keep a hung job from stopping."""
    import pickle
    import threading

    try:
        import torch._C._distributed_c10d as c10d
    except ImportError:  # torch without distributed
        return {}
    out: dict[str, bytes] = {}

    def collect() -> None:
        for kind, name in (("nccl", "_dump_nccl_trace"), ("fr", "_dump_fr_trace")):
            fn = getattr(c10d, name, None)
            if fn is None:
                continue
            try:
                data = fn()
                entries = pickle.loads(data).get("entries") if data else None
            except Exception:  # no such process group, or a format this code does not know
                continue
            if entries:
                out[kind] = data

    worker = threading.Thread(target=collect, name="taehv-flight-recorder", daemon=True)
    worker.start()
    worker.join(timeout_s)
    return dict(out)  # what was collected, also when one dump did not return in time


def on_compile(started: Callable[[], None], ended: Callable[[], None]) -> bool:
    """Call `started` / `ended` around each torch.compile (dynamo's callback handler, a private module;
    checked on torch 2.13). False where this torch has no such callbacks (compiles then count as step time)."""
    try:
        from torch._dynamo.callback import callback_handler
    except ImportError:
        return False
    try:
        callback_handler.register_start_callback(started)
        callback_handler.register_end_callback(ended)
    except AttributeError:
        return False
    return True


def compile_options(mode: str, force_layout: bool) -> dict[str, Any]:
    """torch.compile's keyword arguments for `mode`, with Inductor's channels-last layout optimisation
    forced when asked (the `force_layout_optimization` option; torch.compile takes a mode or options,
    not both, so the mode's own options come from `torch._inductor.list_mode_options`, private; checked
    on torch 2.11-2.13). Without it the layout is Inductor's own choice."""
    if not force_layout:
        return {} if mode == "default" else {"mode": mode}
    import torch._inductor

    return {"options": {**torch._inductor.list_mode_options(mode), "force_layout_optimization": True}}
