"""Plot a run's learning curve (train/reconstruction_loss, val/psnr) from its TensorBoard events to a PNG,
and print the numbers the learning-sanity check reads: python scripts/plot_curve.py RUN_DIR OUT.png"""

import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

run, out = sys.argv[1], sys.argv[2]
ea = EventAccumulator(f"{run}/logs", size_guidance={"scalars": 0})
ea.Reload()
rec = [(e.step, e.value) for e in ea.Scalars("train/reconstruction_loss")]
val = [(e.step, e.value) for e in ea.Scalars("val/psnr")]
print(
    "reconstruction loss:",
    " ".join(f"{s}:{v:.4f}" for s, v in rec[:: max(1, len(rec) // 10)]),
    f"last {rec[-1][0]}:{rec[-1][1]:.4f}",
)
print(
    "val psnr:",
    " ".join(f"{s}:{v:.2f}" for s, v in val),
    f"rise over the first evaluation {val[-1][1] - val[0][1]:.2f} dB",
)
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
a.plot(*zip(*rec))
a.set_yscale("log")
a.set_xlabel("step")
a.set_title("train/reconstruction_loss")
b.plot(*zip(*val), marker="o")
b.set_xlabel("step")
b.set_title("val/psnr (EMA model, dB)")
fig.tight_layout()
fig.savefig(out, dpi=90)
