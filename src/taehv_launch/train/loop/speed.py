"""What makes a GPU step fast, kept out of the loop: compilation, batch prefetch, lazy scalars.

Each lever has its own config key and its own row in `taehv-launch bench --compare`
(docs/benchmarks.md has the measurements that decided the defaults):

- `compile`: torch.compile of the frozen reference VAE's encoder and of TAEHV's
  encode_video / decode_video. Warm-up costs a minute or two per process; Inductor's
  caches live under `compile_cache_dir` (default `<output_dir>/.compile-cache`), so a
  restarted or resumed run on the same machine or shared filesystem reuses the kernels.
  `compile_mode`: torch.compile's mode for TAEHV; reduce-overhead and max-autotune run it as CUDA graphs
  (compile_taehv says what the loop then does: cudagraph_step, gradients out of the graph pool).
- Prefetch: the next batch's host-to-device copy runs on a side CUDA stream while the
  current step computes.
- Lazy scalars: losses stay on the device and are read at log intervals, one sync per
  window instead of several per step.
timing.py measures them (--profile's phase table, speed.json); speed_record says what speed.json's figure was
measured on (the reference family, online or from the latent cache), so a resume predicts from it only for the same.

The batch fetch and the stop vote's all-reduce carry the tests' hang hook (train/faults.py, `hang_at`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import torch

from ...compat import compile_options, uncompiled
from ...plan.scaling import measured_on
from ...plan.schema import Config
from .. import faults
from ..durability.progress import PROGRESS


def speed_record(cfg: Config) -> dict[str, Any]:
    """speed.json's "ref_vae_type" and "latent_cache" (a bool): what its clips/s were measured on. A resume uses
    the run's own figure only where both are its config's (plan/scaling.py run_figure); timing.py's SpeedLog.write
    puts them beside the figure."""
    return measured_on({"ref_vae_type": cfg.ref_vae_type, "latent_cache": cfg.latent_cache})


def compile_cache_dir(cfg: Config) -> Path:
    return Path(cfg.compile_cache_dir or Path(cfg.output_dir).expanduser() / ".compile-cache")


def enable_compile_cache(cfg: Config) -> Path:
    """Point Inductor's on-disk caches (FX graphs, autotuning, Triton kernels) at a kept folder.

    Must run before the first torch.compile call of the process. A value the user or site
    exported already wins."""
    path = compile_cache_dir(cfg)
    path.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(path))
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


def compile_reference(ref, channels_last: bool = False, replicate_pad: bool = True) -> None:
    """Compile the reference VAE's encoder module in place (the encode is most of a step).

    The encoder is a plain nn.Module in every supported diffusers family; the wrapper
    (posterior, chunking, layouts) stays eager. channels_last: the activations stay NDHWC (measured
    faster for all three families on an H100: CogVideoX -18%, HunyuanVideo -8%, Wan -14%). replicate_pad:
    CogVideoX's causal time padding as one fusable replicate pad (same tensor). Both in refopt.py.
    An encoder compiled already is compiled again from its original module."""
    from ..reference.refopt import channels_last_encoder, replicate_time_padding

    model = ref.model
    encoder = uncompiled(model.encoder)
    if replicate_pad:
        replicate_time_padding(encoder)
    if channels_last:
        channels_last_encoder(encoder)
    ref.channels_last = channels_last
    model.encoder = torch.compile(encoder, dynamic=False)


CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")  # torch.compile modes that add CUDA graphs


def compile_taehv(
    taehv: torch.nn.Module, channels_last: bool = True, mode: str = "default", layout: str = "force"
) -> bool:
    """Compile TAEHV's two entry points in place; DDP/DeepSpeed still see the same parameters.
    Returns whether the compiled code runs as CUDA graphs (the loop then marks each micro-batch).

    channels_last: the frames enter every block NHWC, so cuDNN runs its NHWC kernels without the
    NCHW<->NHWC transposes that were 35% of an eager step (H100, docs/benchmarks.md); the weights
    keep their layout (checkpoints and DeepSpeed's flat buffers are unchanged). Eager, the same
    layout measured slower (the reshapes between blocks copy), so only the compiled model uses it.

    layout: the compile_layout key. Inductor's own heuristic declines its channels-last layout
    optimisation for graphs with a convolution of twice as many input as output channels (TAEHV's
    128->64 MemBlocks): its kernels then write NCHW and cuDNN transposes around every convolution.
    "force" keeps the frames NHWC through the graph.

    mode: torch.compile's (the compile_mode key). Both entry points trace as one graph each (no graph
    breaks: tests/test_compile_mode.py), so every mode sees the whole encoder and decoder. With CUDA
    graphs (reduce-overhead, max-autotune) the outputs of a replay live in the graphs' memory pool until
    the next step: the loop calls cudagraph_step() before each micro-batch, and each trainable
    parameter's gradient is cloned out of the pool before autograd stores it in .grad, so gradient
    accumulation over micro-batches keeps every micro-batch's share (PyTorch issue 169545)."""
    taehv.channels_last = channels_last
    extra = compile_options(mode, force_layout=channels_last and layout == "force")
    taehv.encode_video = torch.compile(taehv.encode_video, dynamic=False, **extra)
    taehv.decode_video = torch.compile(taehv.decode_video, dynamic=False, **extra)
    graphs = mode in CUDAGRAPH_MODES
    if graphs:
        for p in taehv.parameters():
            if p.requires_grad:
                p.register_hook(_out_of_the_graph_pool)
    return graphs


def _out_of_the_graph_pool(grad: torch.Tensor) -> torch.Tensor:
    """A gradient the backward CUDA graph returned, copied to ordinary memory: autograd would otherwise
    keep the graph's own output as .grad, which the next micro-batch's replay overwrites."""
    return grad.clone()


def cudagraph_step() -> None:
    """Before each micro-batch when TAEHV runs as CUDA graphs: a new graph step. Without it, a micro-batch
    the guard skips before its backward leaves a backward pending, and the graphs cannot start their next
    step; with a frozen encoder (no backward through encode), the decode's call would start one and
    overwrite the encode's output before the loss reads it."""
    torch.compiler.cudagraph_mark_step_begin()


class Prefetcher:
    """Iterate a DataLoader with the next batch already on the GPU.

    The copy of batch k+1 is issued on a side stream as soon as batch k is handed out, so it
    overlaps with step k; the consumer's stream waits for it before use. On CPU it is a
    plain iterator. Each batch's frames (uint8 NTCHW) and cached latents arrive on `device`."""

    def __init__(self, loader, device: torch.device):
        self.it, self.device = iter(loader), device
        self.hang = faults.hang_at("data")  # a test's hang (no-op unless set)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.next = self._load()

    def _load(self) -> dict[str, Any]:
        batch = next(self.it)
        if self.stream is None:
            return batch
        with torch.cuda.stream(self.stream):
            moved = {
                k: batch[k].to(self.device, non_blocking=True)
                for k in ("frames", "latents")
                if isinstance(batch.get(k), torch.Tensor)
            }
        return {**batch, **moved}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        self.hang(PROGRESS.step)
        batch = self.next
        if self.stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
            for k in ("frames", "latents"):
                if isinstance(batch.get(k), torch.Tensor):
                    batch[k].record_stream(torch.cuda.current_stream(self.device))
        self.next = self._load()
        return batch


class Window:
    """Per-step scalars kept as device tensors; `means()` reads them all with one sync."""

    def __init__(self) -> None:
        self.values: dict[str, list[torch.Tensor | float]] = {}

    def add(self, out: dict[str, torch.Tensor | float]) -> None:
        for k, v in out.items():
            # clone: a 0-d loss from F.mse_loss is a view into the whole elementwise buffer
            # (hundreds of MB at 480x720); keeping the view would keep that buffer alive per step
            self.values.setdefault(k, []).append(v.detach().clone() if isinstance(v, torch.Tensor) else v)

    def means(self) -> dict[str, float]:
        out = {}
        for k, vals in self.values.items():
            if vals:  # the first .cpu() waits for the step's work; the rest are copies
                out[k] = float(
                    torch.stack([torch.as_tensor(v).detach().double().cpu().reshape(()) for v in vals]).mean()
                )
        return out

    def clear(self) -> None:
        self.values.clear()


class AsyncVote:
    """The ranks' stop vote without a host sync per step.

    `cast(local)` starts an all-reduce (MAX) of this rank's flag and a non-blocking copy of the
    result to pinned host memory; `result()` returns the previous cast's outcome, waiting only
    for that copy. Every rank casts at the same step, so every rank reads the same result at
    the same step: the ranks stop together, one step after the signal arrived. The all-reduce runs
    in the "collective" phase and is counted (durability/progress.py), for the hang detector."""

    def __init__(self, device: torch.device):
        import torch.distributed as dist

        self.dist = dist
        self.device = device
        self.host = torch.zeros(1, pin_memory=device.type == "cuda")
        self.event = torch.cuda.Event() if device.type == "cuda" else None
        self.pending = False
        self.hang = faults.hang_at("collective")  # a test's hang (no-op unless set)

    def cast(self, local: bool) -> None:
        flag = torch.tensor([1.0 if local else 0.0], device=self.device)
        with PROGRESS.phase("collective"):
            self.hang(PROGRESS.step)
            PROGRESS.count_collective()
            self.dist.all_reduce(flag, op=self.dist.ReduceOp.MAX)
        self.host.copy_(flag, non_blocking=self.event is not None)
        if self.event is not None:
            self.event.record()
        self.pending = True

    def result(self) -> bool:
        if not self.pending:
            return False
        if self.event is not None:
            self.event.synchronize()
        return bool(self.host.item())


class eager_reference:
    """Context: the reference VAE's encoder uncompiled (validation's batch of 1 is not worth a compile)."""

    def __init__(self, ref) -> None:
        self.model = getattr(ref, "model", None)
        self.compiled = None

    def __enter__(self):
        enc = getattr(self.model, "encoder", None)
        if enc is not None and uncompiled(enc) is not enc:
            self.compiled, self.model.encoder = enc, uncompiled(enc)
        return self

    def __exit__(self, *exc) -> None:
        if self.compiled is not None:
            self.model.encoder = self.compiled
