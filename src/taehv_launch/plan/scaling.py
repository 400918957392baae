"""Predicted speed of a plan: per-GPU clips/s, time to max_train_steps and GPU-hours. Pure.

The model (docs/benchmarks.md "Scaling to 64 GPUs"): one optimizer step is the measured one-GPU
compute for micro x accumulation clips, plus the gradient all-reduce (once per optimizer step:
accelerate skips the sync on accumulation micro-steps), counted in full, with no overlap with the
backward pass, so the prediction is a lower bound on speed:

    t_step = micro * accum / clips_per_s_1gpu  +  2 (N-1)/N * grad_bytes / bandwidth

with NVLink bandwidth inside one node and the inter-node network's per-GPU bandwidth across nodes
(both inputs: they are assumptions, not measurements). ZeRO stages scale the compute by their
measured one-GPU speed (profiles.STRATEGY_SPEED) and ZeRO-3 moves 1.5x DDP's bytes (parameter
gathers in forward and backward plus the gradient reduce-scatter).

A resume predicts from the run's own speed.json instead (same world size, run/request.py reads it), but only
when that figure was measured on the resumed config's reference family and path (`measured_on`, recorded in
speed.json beside the figure); otherwise, or from a speed.json written before those were recorded, from the
table as for a new run, and the line says why the run's own figure was not used.
"""

from __future__ import annotations

from dataclasses import dataclass

from .profiles import STRATEGY_SPEED


@dataclass(frozen=True)
class Measured:
    clips_per_s: float  # one GPU, plain DDP row settings, steady state
    micro: int  # the micro-batch it was measured at
    source: str


# Measured on the GPU machine (docs/benchmarks.md), by (profile, ref_vae_type, from the latent cache). A
# family's speed is mostly its reference VAE's encode online and TAEHV's shape from the cache, so a
# figure is used only for the family, the path and the profile it was measured on; anything else (a800,
# hunyuan and wan on any profile, the new families beside h100) gets no prediction rather than another
# family's number (h3 online runs at 1/20 of cogvideox's).
_FAMILIES_H100 = 'one H100, plain DDP, uncompiled, 2026-11-26 (docs/benchmarks.md "Families on one H100")'
# the online cogvideox h100 row predates compile_layout='force' (2026-11-27), which measured 1.10x online in bench
# compare (docs/benchmarks.md "Where the step's time went"): its predictions are low
_LAYOUT = "; before compile_layout='force' (1.10x online in bench compare): predicts low"
MEASURED = {
    ("h100", "cogvideox", False): Measured(
        8.65, 8, 'one H100, plain DDP, compile all, 2026-11-24 (docs/benchmarks.md "Strategy per row")' + _LAYOUT
    ),
    ("h100", "cogvideox", True): Measured(
        26.70,
        8,
        "one H100, plain DDP, compile all with compile_layout='force', the fused NV12 kernel and the step on the "
        'highest-priority stream, 2026-11-27, the mean of 26.45 and 26.95 (docs/benchmarks.md "The step on the '
        'highest-priority CUDA stream", 480p rows)',
    ),
    ("h200", "cogvideox", False): Measured(
        7.15, 16, 'one H200, ZeRO-2, compile reference, 2026-11-23 (docs/benchmarks.md "Two GPUs")'
    ),
    ("h100", "wan22", False): Measured(12.91, 8, _FAMILIES_H100),
    ("h100", "wan22", True): Measured(47.28, 8, _FAMILIES_H100),
    ("h100", "hunyuan15", False): Measured(4.23, 8, _FAMILIES_H100),
    ("h100", "hunyuan15", True): Measured(49.83, 8, _FAMILIES_H100),
    ("h100", "ltx2", False): Measured(25.49, 8, _FAMILIES_H100),
    ("h100", "ltx2", True): Measured(72.60, 8, _FAMILIES_H100),
    ("h100", "ltx23", False): Measured(25.49, 8, _FAMILIES_H100 + ", ltx2's architecture"),
    ("h100", "ltx23", True): Measured(72.60, 8, _FAMILIES_H100 + ", ltx2's architecture"),
    ("h100", "h3", False): Measured(0.40, 4, _FAMILIES_H100),
    ("h100", "h3", True): Measured(12.16, 4, _FAMILIES_H100),
}


def measured(profile: str, config: dict) -> Measured | None:
    """The one-GPU speed measured for this profile, family and path (online or from the latent cache)."""
    return MEASURED.get((profile, config.get("ref_vae_type", "cogvideox"), bool(config.get("latent_cache"))))


def measured_on(config: dict) -> dict:
    """What a clips/s figure depends on beyond the profile: the reference family (its encode, online) and whether
    the batches come from the latent cache. speed.json records it beside its figure (train/loop/speed.py)."""
    return {"ref_vae_type": config.get("ref_vae_type", "cogvideox"), "latent_cache": bool(config.get("latent_cache"))}


def _path_words(on: dict) -> str:
    return f"ref_vae_type={on['ref_vae_type']} {'from the latent cache' if on['latent_cache'] else 'online'}"


def run_figure(record: dict, config: dict) -> tuple[float | None, str]:
    """A resumed run's own clips/s per GPU from its speed.json `record` when it was measured on what `config`
    runs (measured_on); else (None, why it is not used: for the prediction's line)."""
    was, now = {k: record.get(k) for k in ("ref_vae_type", "latent_cache")}, measured_on(config)
    if not isinstance(was["ref_vae_type"], str) or not isinstance(was["latent_cache"], bool):
        return None, (
            "this run's speed.json does not say which ref_vae_type and path (online or latent cache) it was "
            "measured on (written before they were recorded): not used"
        )
    if was != now:
        return None, f"this run's speed.json was measured on {_path_words(was)}, not {_path_words(now)}: not used"
    figure = record.get("clips_per_s_per_gpu")
    if isinstance(figure, bool) or not isinstance(figure, (int, float)) or not 0 < figure < float("inf"):
        return None, "this run's speed.json has no usable clips_per_s_per_gpu: not used"
    return float(figure), ""


def unpredicted(profile: str, config: dict) -> str:
    """Why a plan has no predicted speed: what was not measured."""
    path = "from the latent cache" if config.get("latent_cache") else "online"
    return (
        f"none: no speed of ref_vae_type={config.get('ref_vae_type', 'cogvideox')} {path} was measured on "
        f"{profile} (docs/benchmarks.md), so no time or GPU-hours either"
    )


TAEHV_GRAD_BYTES = 11_320_000 * 4  # ~11.32M fp32 gradients (the default TAEHV)
NVLINK_GBPS = 300.0  # assumed NCCL bus bandwidth inside an 8-GPU NVLink node
NETWORK_GBPS = 25.0  # assumed per-GPU bandwidth between nodes (200 Gb/s per GPU)


def allreduce_s(
    world: int, nodes: int, nbytes: float, nvlink_gbps: float = NVLINK_GBPS, network_gbps: float = NETWORK_GBPS
) -> float:
    if world <= 1:
        return 0.0
    bandwidth = (nvlink_gbps if nodes <= 1 else network_gbps) * 1e9
    return 2 * (world - 1) / world * nbytes / bandwidth


def efficiency(
    world: int,
    nodes: int,
    clips_per_step: int,
    clips_per_s: float,
    zero: int = 0,
    nvlink_gbps: float = NVLINK_GBPS,
    network_gbps: float = NETWORK_GBPS,
) -> float:
    """Per-GPU speed on `world` GPUs as a fraction of one GPU's with plain DDP."""
    compute = clips_per_step / (clips_per_s * STRATEGY_SPEED[zero])
    comm = allreduce_s(world, nodes, TAEHV_GRAD_BYTES * (1.5 if zero == 3 else 1.0), nvlink_gbps, network_gbps)
    return clips_per_step / (compute + comm) / clips_per_s


@dataclass(frozen=True)
class Prediction:
    clips_per_s_per_gpu: float
    efficiency: float  # vs one GPU with plain DDP
    hours: float  # to max_train_steps from `from_step`
    gpu_hours: float
    basis: str
    from_step: int = 0  # a resume's checkpoint step: hours and GPU-hours cover only the steps after it

    def line(self, world: int, steps: int) -> str:
        todo = f"{max(0, steps - self.from_step)} steps left (to {steps})" if self.from_step else f"{steps} steps"
        return (
            f"~{self.clips_per_s_per_gpu:.2f} clips/s per GPU ({self.clips_per_s_per_gpu * world:.1f} on {world}), "
            f"{self.efficiency * 100:.1f}% of one GPU's: {todo} in {duration_text(self.hours * 3600)}, "
            f"{gpu_hours_text(self.gpu_hours)} GPU-hours ({self.basis})"
        )


def duration_text(seconds: float) -> str:
    """A plan's wall time from seconds to days: '40 s', '4 min', '12.9 h', '3.2 days'."""
    if seconds < 59.5:
        return "under 1 s" if seconds < 0.5 else f"{seconds:.0f} s"
    if seconds < 59.5 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 47.95 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def gpu_hours_text(hours: float) -> str:
    """GPU-hours with the digits that mean something: '828', '1.3', '0.07', '0.008', 'under 0.001'."""
    if hours >= 9.95:
        return f"{hours:.0f}"
    if hours >= 0.995:
        return f"{hours:.1f}"
    return f"{hours:.1g}" if hours >= 0.00095 else "under 0.001"


def predict(
    profile: str,
    config: dict,
    world: int,
    nodes: int,
    from_step: int = 0,
    run_clips_per_s_per_gpu: float | None = None,
    run_speed: dict | None = None,
) -> Prediction | None:
    """None where nothing was measured for this profile (and no speed.json of the run's own). run_speed: a resumed
    run's speed.json record (its world size already checked), used when run_figure allows;
    run_clips_per_s_per_gpu: a figure the caller has matched itself."""
    steps = max(0, config["max_train_steps"] - from_step)
    clips_per_step = config["micro_batch_size"] * config["gradient_accumulation_steps"]
    not_own = ""
    if run_speed is not None and not run_clips_per_s_per_gpu:
        run_clips_per_s_per_gpu, not_own = run_figure(run_speed, config)
    if run_clips_per_s_per_gpu:
        per_gpu, eff, basis = run_clips_per_s_per_gpu, 1.0, "this run's own speed.json"
    else:
        m = measured(profile, config)
        if m is None:
            return None
        eff = efficiency(world, nodes, clips_per_step, m.clips_per_s, config["zero_stage"])
        per_gpu = m.clips_per_s * eff
        basis = (
            f'model: docs/benchmarks.md "Scaling to 64 GPUs", measured at micro {m.micro} on {m.source.split(" (")[0]}{_LAYOUT * m.source.endswith(_LAYOUT)}; '
            f"all-reduce over an assumed {NVLINK_GBPS:g} GB/s NVLink, {NETWORK_GBPS:g} GB/s per GPU between nodes"
        )
        basis = f"{not_own}; {basis}" if not_own else basis
    seconds = steps * clips_per_step * world / (per_gpu * world)
    return Prediction(per_gpu, eff, seconds / 3600, seconds / 3600 * world, basis, from_step)
