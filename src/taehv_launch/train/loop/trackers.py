"""Where the trainer's scalars and validation clips go (#26): TensorBoard in <run>/logs (the default),
Weights & Biases, MLflow and SwanLab, chosen with the `trackers` key (comma-separated), through
accelerate's trackers: their objects go to `Accelerator(log_with=...)` (build.make_accelerator) and
`Trackers.create` starts them on the main process (`Accelerator.init_trackers`, with the run's config).

The same names everywhere: the scalars (train/loss, val/psnr, ...) at the optimizer step; the
validation clips as val/clip_<i> (an image: input frames over reconstruction) and val/video_<i> (an
animated GIF, input | reconstruction) where the tracker takes one. The run's newest manifest record
(rundir/manifest.py; the config when there is none) goes flat ("config.learning_rate",
"plan.world_size", ...) to the run's config (W&B, SwanLab), params (MLflow) or a text table named
"config" (TensorBoard).

- tensorboard: <run>/logs; purge_step on a resume and after a rollback (the steps after the
  checkpoint are dropped), GIF clips in the Images tab.
- wandb: <run>/wandb; one W&B run per run directory (its id comes from the folder, a later launch
  resumes it); charts are drawn against the logged "step", which repeats after a resume or rollback.
- mlflow: MLFLOW_TRACKING_URI, else a file store in <output_dir>/mlruns; one MLflow run per launch
  (params cannot change within a run), named "<run> (launch k)" from the second on, tagged
  taehv.run_dir; the GIFs are artifacts.
- swanlab: <run>/swanlog; one experiment per launch, named as in MLflow; a repeated step is ignored.

TensorBoard fails as it always did. Another tracker that cannot start is one line naming what to do;
one that fails later (its server gone) says so once and gets nothing more: training goes on.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

import torch
from accelerate.tracking import MLflowTracker, SwanLabTracker, TensorBoardTracker, WandBTracker

from ...compat import add_gif
from ...errors import ConfigError, LaunchError, one_line
from ...plan.resolve import tracker_library_line, tracker_names
from ...plan.schema import config_dict
from ...rundir.manifest import read_manifest
from .evaluate import gif_bytes
from .flops import current_rate

PROJECT = (
    "taehv"  # W&B and SwanLab project, MLflow experiment (WANDB_PROJECT, SWANLAB_PROJ_NAME, MLFLOW_EXPERIMENT_NAME)
)
STEP = "step"  # W&B's x axis: the optimizer step, logged with every row


def _cannot_start(name: str, err: Exception, fix: str) -> Exception:
    if isinstance(err, ImportError) and (err.name or "").split(".")[0] == name:  # not one of its own imports
        return ConfigError(tracker_library_line(name))
    why = one_line(str(err)).strip()[:300] or type(err).__name__
    return LaunchError(f"trackers={name} could not start ({why}): {fix}")


class Clip:
    """A validation clip (T x 3 x H x W in [0, 1]) as a GIF, made once for every tracker that takes it."""

    def __init__(self, frames: torch.Tensor, step: int):
        self.frames, self.step = frames, step
        self.height, self.width = int(frames.shape[-2]), int(frames.shape[-1])
        self._gif: bytes | None = None
        self._dir: str | None = None

    @property
    def gif(self) -> bytes:
        if self._gif is None:
            self._gif = gif_bytes(self.frames)
        return self._gif

    def path(self) -> str:
        """The GIF as a file (step_<step>.gif in a temporary folder), for trackers that copy a file."""
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="taehv-clip-")
            Path(self._dir, f"step_{self.step:08d}.gif").write_bytes(self.gif)
        return str(Path(self._dir, f"step_{self.step:08d}.gif"))

    def cleanup(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


class TensorBoard(TensorBoardTracker):
    """<run>/logs, as the trainer always wrote it."""

    def __init__(self, run_dir: Path):
        super().__init__("logs", str(run_dir))
        self.start_step = 0

    def store_init_configuration(self, values: dict) -> None:
        rows = "".join(f"| {k} | {_cell(v)} |\n" for k, v in values.items())
        self.writer.add_text("config", "| key | value |\n|---|---|\n" + rows, self.start_step)
        self.writer.flush()

    def where(self) -> str:
        return self.logging_dir

    def reopen(self, purge_step: int | None) -> None:
        """A new event file that drops the steps from purge_step on (TensorBoard's purge_step)."""
        self.writer.close()
        self.init_kwargs["purge_step"] = purge_step
        self.start()

    def add_image(self, name: str, chw: torch.Tensor, hwc, step: int) -> None:
        self.writer.add_image(name, chw, step)

    def add_video(self, name: str, clip: Clip, step: int) -> None:
        add_gif(self.writer, name, clip.gif, clip.height, clip.width, step)

    def flush(self) -> None:
        self.writer.flush()


class WandB(WandBTracker):
    """One W&B run per run directory: a later launch of the run resumes it (WANDB_RUN_ID, WANDB_RESUME,
    WANDB_DIR and WANDB_PROJECT win when set)."""

    def __init__(self, run_dir: Path):
        kwargs: dict[str, Any] = {"name": run_dir.name}
        if not os.environ.get("WANDB_RUN_ID"):
            kwargs["id"] = wandb_run_id(run_dir)
        if not os.environ.get("WANDB_RESUME"):
            kwargs["resume"] = "allow"
        if not os.environ.get("WANDB_DIR"):
            kwargs["dir"] = str(run_dir)
        super().__init__(os.environ.get("WANDB_PROJECT") or PROJECT, **kwargs)

    def start(self) -> None:
        try:
            super().start()
        except Exception as err:
            raise _cannot_start(
                "wandb",
                err,
                "log in (`wandb login` or WANDB_API_KEY), or set WANDB_MODE=offline "
                "(the run goes to <run>/wandb; `wandb sync` it later)",
            ) from None
        self.run.define_metric(STEP, hidden=True)
        self.run.define_metric("*", step_metric=STEP)

    def store_init_configuration(self, values: dict) -> None:
        self.run.config.update(values, allow_val_change=True)

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        self.run.log({**values, STEP: step} if step is not None else values, **kwargs)

    def where(self) -> str:
        run = self.run
        if getattr(run, "offline", False):
            return f"project {run.project}, run {run.id}, offline in {Path(run.dir).parent} (wandb sync it)"
        return f"project {run.project}, run {run.id} {getattr(run, 'url', '') or ''}".rstrip()

    def add_image(self, name: str, chw: torch.Tensor, hwc, step: int) -> None:
        import wandb

        self.log({name: wandb.Image(hwc)}, step)

    def add_video(self, name: str, clip: Clip, step: int) -> None:
        import wandb

        self.log({name: wandb.Video(clip.path())}, step)


def wandb_run_id(run_dir: Path) -> str:
    """The folder's name and a hash of its absolute path: the same run directory, the same W&B run."""
    digest = hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:8]
    return f"{re.sub(r'[^A-Za-z0-9_-]', '-', run_dir.name)[:48]}-{digest}"


class MLflow(MLflowTracker):
    """One MLflow run per launch, named after the run directory. Without MLFLOW_TRACKING_URI: a file
    store beside the runs, <output_dir>/mlruns (MLflow 3 asks for MLFLOW_ALLOW_FILE_STORE=true)."""

    def __init__(self, run_dir: Path):
        super().__init__(experiment_name=PROJECT, run_name=launch_name(run_dir), tags={"taehv.run_dir": str(run_dir)})
        self.run_dir = run_dir

    def start(self) -> None:
        try:
            import mlflow

            if not os.environ.get("MLFLOW_TRACKING_URI"):
                mlflow.set_tracking_uri((Path(self.run_dir).resolve().parent / "mlruns").as_uri())
            if re.match(r"(file:|[^:]*$)", mlflow.get_tracking_uri()):  # a file store, asked for or ours
                os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            super().start()
        except Exception as err:
            raise _cannot_start(
                "mlflow",
                err,
                "set MLFLOW_TRACKING_URI to a tracking server or store you can reach (unset: a file store "
                "in <output_dir>/mlruns; a database store needs the full `pip install mlflow`)",
            ) from None

    def store_init_configuration(self, values: dict) -> None:
        params = {re.sub(r"[^\w./ :-]", "_", k)[:250]: ("" if v is None else v) for k, v in values.items()}
        super().store_init_configuration(params)

    def where(self) -> str:
        import mlflow

        return f"{mlflow.get_tracking_uri()}, experiment {self.experiment_name}, run {self.active_run.info.run_id}"

    def add_image(self, name: str, chw: torch.Tensor, hwc, step: int) -> None:
        import mlflow

        mlflow.log_image(hwc, key=name, step=step)

    def add_video(self, name: str, clip: Clip, step: int) -> None:
        import mlflow

        mlflow.log_artifact(clip.path(), artifact_path=name)  # <name>/step_<step>.gif


class SwanLab(SwanLabTracker):
    """One SwanLab experiment per launch, its files in <run>/swanlog (SWANLAB_LOG_DIR wins when set)."""

    def __init__(self, run_dir: Path):
        kwargs: dict[str, Any] = {"name": launch_name(run_dir)}
        if not os.environ.get("SWANLAB_LOG_DIR"):
            kwargs["log_dir"] = str(run_dir / "swanlog")
        super().__init__(os.environ.get("SWANLAB_PROJ_NAME") or PROJECT, **kwargs)

    def start(self) -> None:
        main = threading.current_thread() is threading.main_thread()
        sigint = signal.getsignal(signal.SIGINT) if main else None
        try:
            super().start()
        except Exception as err:
            raise _cannot_start(
                "swanlab",
                err,
                "log in (`swanlab login` or SWANLAB_API_KEY), or set SWANLAB_MODE=offline "
                "(the run goes to <run>/swanlog; `swanlab sync` it later)",
            ) from None
        finally:
            if main:  # SwanLab takes SIGINT to close its run: the trainer's stop flag must keep it
                signal.signal(signal.SIGINT, sigint)

    def store_init_configuration(self, values: dict) -> None:
        import swanlab

        swanlab.config.update(values)

    def where(self) -> str:
        mode = getattr(self.run, "mode", "")
        return f"project {self.run_name}, {mode + ' ' if mode else ''}in {self.init_kwargs.get('log_dir', '$SWANLAB_LOG_DIR')}"

    def add_image(self, name: str, chw: torch.Tensor, hwc, step: int) -> None:
        import swanlab

        self.log({name: swanlab.Image(hwc)}, step)

    def add_video(self, name: str, clip: Clip, step: int) -> None:
        import swanlab

        self.log({name: swanlab.Video(clip.path())}, step)


CLASSES = {"tensorboard": TensorBoard, "wandb": WandB, "mlflow": MLflow, "swanlab": SwanLab}


def tracker_objects(trackers: str, run_dir: Path) -> list:
    """The chosen trackers, not started (for Accelerator(log_with=...)): nothing is imported yet."""
    return [CLASSES[name](Path(run_dir)) for name in tracker_names(trackers)]


def launch_name(run_dir: Path) -> str:
    """The run directory's name, and "(launch k)" from its second launch on (manifest.jsonl)."""
    records = read_manifest(run_dir)
    launch = records[-1].get("launch") if records else None
    return f"{run_dir.name} (launch {launch})" if isinstance(launch, int) and launch > 1 else run_dir.name


def run_config(run_dir: Path, config: dict) -> dict[str, Any]:
    """The run's config for the trackers: its newest manifest record, else the config, flat."""
    records = read_manifest(run_dir)
    return flat(records[-1] if records else {"config": config})


def flat(value: dict, prefix: str = "") -> dict[str, Any]:
    """{"plan": {"gpus": 2}} -> {"plan.gpus": 2}; lists (and empty dicts) as JSON text."""
    out: dict[str, Any] = {}
    for k, v in value.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flat(v, key + "."))
        elif isinstance(v, (list, tuple, dict)):
            out[key] = json.dumps(v, default=str)
        elif v is None or isinstance(v, (bool, int, float, str)):
            out[key] = v
        else:
            out[key] = str(v)
    return out


def _cell(value: Any) -> str:
    return "" if value is None else str(value).replace("|", "\\|").replace("\n", " ")


class Trackers:
    """What the trainer logs to: the started trackers on the main process, nothing elsewhere."""

    def __init__(self, acc, log: Callable[[str], None] = print):
        self.acc, self.log = acc, log
        self.live: list = list(acc.trackers) if acc.is_main_process else []

    @classmethod
    def create(
        cls, acc, cfg, run_dir: Path, purge_step: int | None = None, log: Callable[[str], None] = print
    ) -> Trackers:
        """Start the Accelerator's trackers (build.make_accelerator gave it their objects) on the main
        process, with the run's config. purge_step: TensorBoard drops the steps from there (a resume)."""
        if acc.is_main_process and acc.log_with and not acc.trackers:
            for t in acc.log_with:
                if isinstance(t, TensorBoard):
                    t.init_kwargs["purge_step"] = purge_step
                    t.start_step = purge_step - 1 if purge_step else 0
            acc.init_trackers(PROJECT, config=run_config(Path(run_dir), config_dict(cfg)))
        out = cls(acc, log)
        if out.live:
            log("trackers: " + "; ".join(f"{t.name} {t.where()}" for t in out.live))
        return out

    @property
    def active(self) -> bool:
        """Anything to log to (False on every rank but the main one)."""
        return bool(self.live)

    def scalar(self, name: str, value: float, step: int) -> None:
        self.scalars({name: value}, step)

    def scalars(self, values: dict[str, float], step: int) -> None:
        """The window's train/samples_per_second brings train/tflops_per_gpu and train/mfu (flops.py) with it."""
        if self.live and (rate := current_rate()) is not None and "train/samples_per_second" in values:
            values = {**values, **rate.scalars(values["train/samples_per_second"])}
        if self.live:
            self._each("log", {k: float(v) for k, v in values.items()}, step)

    def image(self, name: str, chw: torch.Tensor, step: int) -> None:
        """A 3 x H x W image in [0, 1]."""
        if self.live:
            chw = chw.detach().float().clamp(0, 1).cpu()
            hwc = chw.mul(255).round().to(torch.uint8).permute(1, 2, 0).numpy()
            self._each("add_image", name, chw, hwc, step)

    def video(self, name: str, frames: torch.Tensor, step: int) -> None:
        """T x 3 x H x W frames in [0, 1]: an animated GIF."""
        if self.live:
            clip = Clip(frames.detach().float().clamp(0, 1).cpu(), step)
            try:
                self._each("add_video", name, clip, step)
            finally:
                clip.cleanup()

    def flush(self) -> None:
        self._each("flush")

    def rewind(self, purge_step: int | None) -> None:
        """After a rollback: TensorBoard drops the steps from purge_step on (the others keep them)."""
        self._each("reopen", purge_step)

    def close(self) -> None:
        self._each("finish")
        self.live = []
        self.acc.trackers.clear()  # closed: a second close does nothing

    def _each(self, method: str, *args) -> None:
        for t in list(self.live):
            fn = getattr(t, method, None)
            if fn is None:
                continue
            if isinstance(t, TensorBoard):  # fails as it always did
                fn(*args)
                continue
            try:
                fn(*args)
            except Exception as err:
                self.live.remove(t)
                self.log(
                    f"trackers: {t.name} failed ({type(err).__name__}: {one_line(str(err))[:200]}); "
                    f"it gets nothing more this run, training goes on"
                )
