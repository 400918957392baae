"""FLOPs, TFLOP/s and MFU of a training run: the GPUs' peak table and the arithmetic. Pure (no torch).

The trainer counts the FLOPs of one clip once at start-up (train/loop/flops.py: torch's FLOP counter on
the run's modules at the run's shapes) and turns each log window's clips/s into achieved TFLOP/s per
GPU and MFU here:

    TFLOP/s per GPU = clips/s (all GPUs) x FLOPs per clip / GPUs / 1e12
    MFU             = achieved FLOP/s / (peak FLOP/s per GPU x GPUs)

FLOPs are the convolutions' and matrix products' actually executed, 2 per multiply-accumulate, forward
plus backward (docs/benchmarks.md "How TFLOP/s and MFU are computed"). The peak is the GPU's dense
(no sparsity) BF16 Tensor Core figure from NVIDIA's datasheets, whatever mixed_precision the run uses.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Peak:
    """One row of the table: a GPU told by the words of torch.cuda.get_device_name()."""

    gpu: str  # as the docs and messages name it
    words: tuple[str, ...]  # all of them in the device name (lower case)
    unless: tuple[str, ...]  # none of them in it (another variant, another peak)
    tflops: float  # dense BF16 Tensor Core TFLOP/s of one GPU


# Dense BF16 Tensor Core peaks per GPU. NVIDIA's datasheets give the figure "with sparsity"; dense is half.
# Only GPUs whose figure we are sure of: any other GPU (H100 NVL, H200 NVL, L40S, GB200 ...) reads "n/a".
PEAKS = (
    # H100 SXM5 ("NVIDIA H100 80GB HBM3"): datasheet 1,979 TFLOPS with sparsity; H100 whitepaper 989.4 dense
    Peak("H100 SXM", ("h100",), ("pcie", "nvl"), 989.4),
    # H100 PCIe ("NVIDIA H100 PCIe"): datasheet 1,513 TFLOPS with sparsity
    Peak("H100 PCIe", ("h100", "pcie"), (), 756.5),
    # H200 SXM ("NVIDIA H200"): datasheet 1,979 TFLOPS with sparsity, the H100 SXM's Tensor Cores and clocks
    Peak("H200 SXM", ("h200",), ("nvl",), 989.4),
    # H800 SXM ("NVIDIA H800"): datasheet 1,979 TFLOPS with sparsity (the H100 SXM's compute, less NVLink)
    Peak("H800 SXM", ("h800",), ("pcie", "nvl"), 989.4),
    # A100 SXM4 and PCIe, 40 and 80 GB ("NVIDIA A100-SXM4-80GB"): datasheet 312 dense, 624 with sparsity
    Peak("A100", ("a100",), (), 312.0),
    # A800 SXM4 and PCIe ("NVIDIA A800-SXM4-80GB"): datasheet 312 dense (the A100's compute, less NVLink)
    Peak("A800", ("a800",), (), 312.0),
    # B200 ("NVIDIA B200"): HGX B200 datasheet 36 PFLOPS with sparsity for 8 GPUs = 4.5 per GPU (GB200 differs)
    Peak("B200", ("b200",), ("gb200",), 2250.0),
)


def peak_of(device_name: str) -> Peak | None:
    """The table's row for a torch.cuda.get_device_name() string; None for a GPU not in it."""
    name = device_name.lower()
    return next((p for p in PEAKS if all(w in name for w in p.words) and not any(w in name for w in p.unless)), None)


@dataclass(frozen=True)
class ClipFlops:
    """FLOPs of one training clip (forward + backward as executed), counted once at start-up."""

    taehv: float  # TAEHV encode + decode, forward and backward
    seraena: float  # the discriminator's step (forward + backward) and the correction (two forwards, one input grad)
    reference: float  # the reference VAE's encode, forward only; 0 when not run online for every clip
    shape: str  # what was counted, in words ("12 x 480x720, Seraena crop 256")
    reference_note: str = "reference encode: none"  # what stands for it when it is not counted, and why

    @property
    def total(self) -> float:
        return self.taehv + self.seraena + self.reference

    def line(self) -> str:
        ref = f"reference encode {flops_text(self.reference)}" if self.reference else self.reference_note
        return (
            f"{flops_text(self.total)} per clip ({self.shape}): TAEHV forward + backward {flops_text(self.taehv)}, "
            f"Seraena {flops_text(self.seraena)}, {ref}"
        )

    def record(self) -> dict:
        return {
            "total": self.total,
            "taehv": self.taehv,
            "seraena": self.seraena,
            "reference": self.reference,
            "shape": self.shape,
            "reference_note": None if self.reference else self.reference_note,
        }


@dataclass(frozen=True)
class Rate:
    """What turns a run's clips/s into TFLOP/s per GPU and MFU: FLOPs per clip, the process count, the
    device (torch.cuda.get_device_name(), or "cpu") and its peak (None: not in the table, or a CPU)."""

    flops_per_clip: float
    processes: int
    device: str
    peak_tflops: float | None

    @classmethod
    def of(cls, flops_per_clip: float, processes: int, device: str, on_gpu: bool) -> Rate:
        peak = peak_of(device) if on_gpu else None
        return cls(flops_per_clip, max(1, processes), device if on_gpu else "cpu", peak.tflops if peak else None)

    @property
    def on_gpu(self) -> bool:
        return self.device != "cpu"

    def tflops(self, clips_per_s: float) -> float:
        """Achieved TFLOP/s per GPU (per process on CPU) at clips_per_s over all processes."""
        return clips_per_s * self.flops_per_clip / self.processes / 1e12

    def mfu(self, clips_per_s: float) -> float | None:
        """Achieved FLOP/s over the GPUs' peak, 0-1; None without a peak."""
        return None if self.peak_tflops is None else self.tflops(clips_per_s) / self.peak_tflops

    def why_no_mfu(self) -> str:
        return "CPU" if not self.on_gpu else f"no BF16 peak known for {self.device}"

    def text(self, clips_per_s: float) -> str:
        """The log line's part: '131.2 TFLOP/s/GPU, MFU 13.3%' (MFU 'n/a (CPU)' where there is no peak)."""
        mfu = self.mfu(clips_per_s)
        unit = "GPU" if self.on_gpu else "process"
        return f"{tflops_text(self.tflops(clips_per_s))} TFLOP/s/{unit}, MFU " + (
            f"{100 * mfu:.1f}%" if mfu is not None else f"n/a ({self.why_no_mfu()})"
        )

    def record(self, clips_per_s: float) -> dict:
        """speed.json's and progress.json's fields."""
        return {
            "tflops_per_gpu": self.tflops(clips_per_s),
            "mfu": self.mfu(clips_per_s),
            "peak_tflops_per_gpu": self.peak_tflops,
            "mfu_note": None if self.peak_tflops is not None else self.why_no_mfu(),
        }

    def scalars(self, clips_per_s: float) -> dict[str, float]:
        """TensorBoard's (and the other trackers') scalars: train/mfu only where there is a peak."""
        mfu = self.mfu(clips_per_s)
        return {"train/tflops_per_gpu": self.tflops(clips_per_s), **({"train/mfu": mfu} if mfu is not None else {})}


def tflops_text(x: float) -> str:
    """TFLOP/s with the digits that mean something: 131.2, 4.37, 0.021."""
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}" if x >= 0.1 else f"{x:.2g}"


def flops_text(n: float) -> str:
    """A FLOP count in words: '6.11 TFLOP', '412 GFLOP', '3.2 MFLOP'."""
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if n >= scale:
            v = n / scale
            return f"{v:.3g} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return f"{n:.0f} FLOP"


def record_text(rec: dict | None) -> str:
    """progress.json's TFLOP/s and MFU as `status` says them: '131.2 TFLOP/s per GPU, MFU 13.3%'; "" without."""
    if not rec or rec.get("tflops_per_gpu") is None:
        return ""
    note = rec.get("mfu_note")
    unit = "process" if note == "CPU" else "GPU"
    mfu = f"{100 * rec['mfu']:.1f}%" if rec.get("mfu") is not None else f"n/a ({note})" if note else "n/a"
    return f"{tflops_text(rec['tflops_per_gpu'])} TFLOP/s per {unit}, MFU {mfu}"
