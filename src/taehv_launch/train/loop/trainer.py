"""The training loop: set up -> while -> train_step() -> log -> maybe validate -> maybe checkpoint.

One optimizer step = gradient_accumulation_steps micro-batches on every rank. The learning
rate is a pure function of the optimizer step (warmup + cosine, lowered for a while after a
rollback: guard.py, lr_at), set on the optimizer before each step, so it advances once per optimizer
step whatever the world size, and resumes exactly. Bad micro-batches (non-finite, loss spikes)
and optimizer steps whose gradients are not finite on some rank are skipped on every rank and,
past max_consecutive_bad_steps, rolled back in-process (guard.py); the ranks'
step times are compared at each log line (stragglers.py). PROGRESS (durability/progress.py)
carries this rank's step and phase for the hang detector: attribute writes, no I/O.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ...compat import shutdown_loader_workers, uncount_micro_batch
from ...errors import EXIT_OK, EXIT_RESUMABLE, one_line
from ...plan.families import get_family
from ...plan.schema import Config, config_dict, global_batch
from ...plan.trainable import check_trains_something
from ...rundir.layout import REQUEUE
from . import build
from ...rundir.checkpoint import rotate
from ..durability.checkpoint import TrainState, export_meta, export_model, load_checkpoint, save_checkpoint
from ..durability.progress import PROGRESS
from ..model.ema import EMA
from .evaluate import validate
from ..model.losses import DistillNet, decoder_targets, psnr_t, reconstruction_loss
from ..model.seraena import seraena_crop
from ..reference.latentscale import for_run
from .guard import Guard, Rollback, lr_at
from .instrument import Marks, timed
from .speed import AsyncVote, Prefetcher, Window, compile_reference, compile_taehv, cudagraph_step, enable_compile_cache
from ..durability.stop import StopFlag
from .stragglers import StepClock, Stragglers, gather_window
from .timing import PhaseTimer, ProgressFile, SpeedLog, progress_bar, window_line
from .trackers import Trackers


class Trainer:
    def __init__(self, cfg: Config, run_dir: Path, resume: str | None, debug: bool, profile: bool):
        self.run_dir, self.debug, self.profile = run_dir, debug, profile
        self.acc = build.make_accelerator(cfg, run_dir)  # with the trackers of cfg.trackers
        self.device = self.acc.device
        stream = build.use_step_stream(cfg, self.acc)  # before the step's CUDA work
        self.cfg = cfg = build.resolve_demo_paths(cfg, self.device, self.log)
        self.rank, self.world = self.acc.process_index, self.acc.num_processes
        self.zero = cfg.zero_stage if self.acc.state.deepspeed_plugin is not None else 0
        if debug:
            torch.autograd.set_detect_anomaly(True)
        from accelerate.utils import set_seed

        set_seed(cfg.seed + self.rank)
        self.stop = StopFlag()
        self.ref = build.load_reference(cfg, self.device)
        self.latent_scale = for_run(cfg, self.ref, self.log)  # logs the latents' RMS and mean once
        from ..model.taehv import build_taehv, count_params

        taehv = build_taehv(cfg)
        trained = check_trains_something(cfg)  # a part without a gradient is frozen: plan/trainable.py
        net = DistillNet(taehv, get_family(cfg.ref_vae_type), trained)
        self.log(
            f"model: TAEHV, {cfg.decoder_arch} decoder, {count_params(taehv) / 1e6:.2f}M parameters, latent_channels "
            f"{cfg.latent_channels}, patch_size {cfg.patch_size}, exports final_model/"
            f"{get_family(cfg.ref_vae_type).export_stem(cfg.decoder_arch)}.pth + .safetensors, "
            f"frames_to_trim {taehv.frames_to_trim}; trains {count_params(taehv, trainable_only=True) / 1e6:.2f}M "
            f"parameters: {trained.line()}; processes {self.world}, "
            f"{'DeepSpeed ZeRO-' + str(self.zero) if self.acc.state.deepspeed_plugin else 'DDP'}, device {self.device}{stream}"
        )
        self.ema = EMA(taehv, cfg.ema_decay, zero_stage=0)  # before partitioning: a full copy
        self.ema.model.to(self.device)
        self._compile(taehv)
        fused = self.device.type == "cuda" and cfg.fused_optimizer
        optimizer = torch.optim.AdamW(
            [p for p in net.parameters() if p.requires_grad],  # frozen parts: out of the optimizer and DDP
            lr=lr_at(0, cfg),
            betas=(cfg.adam_beta1, cfg.adam_beta2),
            weight_decay=cfg.adam_weight_decay,
            **({"fused": True} if fused else {}),
        )
        self.model, self.optimizer = self.acc.prepare(net, optimizer)
        self.ema.zero_stage = self.zero
        self.seraena = build.build_seraena(cfg, self.device, self.rank)
        self.state = TrainState(world_size=self.world, zero_stage=self.zero, config=config_dict(cfg))
        if resume:
            self.state = load_checkpoint(
                Path(resume), self.acc, self.model, self.optimizer, self.ema, self.seraena, self.world, self.zero
            )
            self.state.config = config_dict(cfg)
            self.log(f"resumed from {resume} at step {self.state.step}")
        self.clock = StepClock(self.device, self.world > 1, self.rank)
        self.guard = Guard(
            cfg, self.rank, self.world, self.device, self.log, run_dir, self.state.step, self.clock, self.scalar
        )
        parts = (self.model, self.optimizer, self.ema, self.seraena, self.world, self.zero)  # as load_checkpoint's
        self.rollbacks = Rollback(cfg, self.guard, run_dir, self.acc, parts, self.log, self.close_data)
        self.train_ds, self.val_ds = build.build_datasets(cfg, self.acc, self.log)
        self.decoder = build.use_decoder(cfg, self.device, self.train_ds, self.log)
        self.open_data(self.guard.data_seed(cfg.seed), self.state.samples_seen)
        self.trackers = Trackers.create(self.acc, cfg, run_dir, self.state.step + 1 if resume else None, self.log)
        self.speed = SpeedLog(run_dir, self.device, self.world, cfg, self.acc.is_main_process)
        self.marks = Marks(PhaseTimer(profile, self.device), self.clock, self.speed)  # what watches a step
        self.speed.count_flops(self.ref, self.log)  # one clip's FLOPs: TFLOP/s and MFU in the log (flops.py)
        self.stragglers = Stragglers(cfg.straggler_threshold, self.rank, self.world, self.log, self.scalar, self.device)
        self.skipped_seen: set[str] = set(self.state.skipped_files)

    def open_data(self, seed: int, start: int) -> None:
        """The training batches: this rank's shard of the data order `seed`, from its `start`-th draw."""
        sampler = build.ShardedInfiniteSampler(len(self.train_ds), self.rank, self.world, seed, start=start)
        self.loader = build.make_loader(self.train_ds, self.cfg.micro_batch_size, sampler, self.cfg)
        self.batches = build.batches(self.loader, self.decoder, self.cfg, self.device, self.log)  # or decode stage

    def close_data(self) -> None:
        getattr(self.batches, "close", lambda: None)()  # the GPU decode threads
        shutdown_loader_workers(self.loader)  # the persistent DataLoader workers
        self.data_iter = None

    def _compile(self, taehv) -> None:
        """torch.compile where it measured faster (docs/benchmarks.md): GPU only, after the EMA copy."""
        self.cudagraphs = False  # TAEHV as CUDA graphs (compile_mode): each micro-batch marks a graph step
        if self.cfg.compile == "none" or self.device.type != "cuda":
            return
        cache = enable_compile_cache(self.cfg)
        what = []
        if self.ref is not None:
            compile_reference(self.ref, self.cfg.ref_channels_last)
            what.append(f"reference VAE encoder{' (channels-last)' if self.ref.channels_last else ''}")
        if self.cfg.compile == "all" and self.zero == 3:  # compiled under ZeRO-3's hooks: measured no faster
            self.log("compile: TAEHV stays eager under ZeRO-3 (compiled it measured no faster: docs/benchmarks.md)")
        elif self.cfg.compile == "all":
            c = self.cfg
            self.cudagraphs = compile_taehv(taehv, c.channels_last, c.compile_mode, c.compile_layout)
            layout = f" (channels-last, layout {c.compile_layout})" if c.channels_last else ""
            what.append(f"TAEHV encode/decode{layout}, mode {c.compile_mode}" + " (CUDA graphs)" * self.cudagraphs)
        if what:
            self.log(f"compile: {' and '.join(what)} (first steps are slow while kernels are built; cache {cache})")

    def log(self, msg: str, all_ranks: bool = False) -> None:
        if all_ranks or self.debug or getattr(self, "acc", None) is None or self.acc.is_main_process:
            prefix = f"[rank {self.acc.process_index}] " if (self.debug or all_ranks) and hasattr(self, "acc") else ""
            bar = getattr(self, "bar", None)
            if bar is not None:
                bar.write(f"{prefix}{msg}", file=sys.stdout)
            else:
                print(f"{prefix}{msg}", flush=True)

    def scalar(self, name: str, value: float, step: int) -> None:
        self.trackers.scalar(name, value, step)

    # ------------------------------------------------------------------ one micro-batch
    def train_step(self, batch: dict[str, Any]) -> dict[str, torch.Tensor | float] | None:
        """One micro-batch, in the order of upstream's training notebook (seraena's TAEHV_Training_Example): the
        reference latents, TAEHV's encode and decode, their losses, Seraena's corrected targets, backward, the
        optimizer step. None when the step was skipped (guard.py); the losses come back as device tensors (read at
        log intervals). What watches the step (the watchdog's phases, --profile's rows, stragglers): instrument.py."""
        cfg = self.cfg
        if self.cudagraphs:
            cudagraph_step()  # speed.py: the previous micro-batch's graph outputs are done with
        with self.marks.forward():
            frames, latents = self.to_device(batch)
            latents = self.reference_latents(frames, latents, batch.get("online"))
            self.latent_scale.add(latents)
        distilling = latents is not None
        with self.acc.accumulate(self.model):
            with self.marks.phase("forward"):
                enc, dec = self.taehv_forward(frames, latents)
                latents = enc.detach().float() if latents is None else latents
                dec = dec.float()
                target = decoder_targets(frames, dec)
                rec_loss = reconstruction_loss(dec, target, cfg.reconstruction_loss)
                enc_loss = F.mse_loss(enc.float(), latents) if (enc is not None and distilling) else dec.new_zeros(())
                if not self.guard.check(rec_loss, enc_loss, self.state.step):  # the one host sync and all-reduce
                    uncount_micro_batch(self.acc)  # this micro-batch does not count towards accumulation
                    return None
                ser_loss, disc_loss = dec.new_zeros(()), 0.0
                if self.seraena is not None:
                    fake, corrected, disc_loss = self.seraena_targets(target, dec, latents)
                    ser_loss = F.mse_loss(fake, corrected)
                loss = (
                    cfg.reconstruction_loss_weight * rec_loss
                    + cfg.encoder_loss_weight * enc_loss
                    + cfg.seraena_loss_weight * ser_loss
                )
            with self.marks.phase("backward", row="backward + optimizer"):
                self.acc.backward(loss)
                if self.acc.sync_gradients and self.acc.state.deepspeed_plugin is None:
                    norm = self.acc.clip_grad_norm_(self.guard.clipped(self.model.parameters()), cfg.max_grad_norm)
                    if not self.guard.grads_finite(norm, self.acc.scaler, self.state.step):  # one all-reduce a step
                        self.optimizer.zero_grad(set_to_none=True)  # skipped on every rank: parameters unchanged
                        return None
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
        return {
            "loss": loss.detach(),
            "reconstruction_loss": rec_loss.detach(),
            "encoder_loss": enc_loss.detach(),
            "seraena_loss": ser_loss.detach(),
            "disc_loss": disc_loss,
            "psnr": psnr_t(dec, target),
        }

    @timed("data (to device)")
    def to_device(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
        frames = batch["frames"].to(self.device, non_blocking=True).float().div_(255.0)  # in [0, 1]
        latents = batch.get("latents")  # a latent cache's stored latents (zeros where online); None without one
        return frames, (latents.to(self.device, non_blocking=True).float() if latents is not None else None)

    @timed("reference VAE encode")
    def reference_latents(
        self, frames: torch.Tensor, stored: torch.Tensor | None, online: list[bool] | None
    ) -> torch.Tensor | None:
        """The reference latents of a micro-batch: the latent cache's, with the items it could not give
        (`online`) encoded here; all encoded here without a cache; None without a reference VAE."""
        if stored is None:
            return self.ref.encode(frames) if self.ref is not None else None
        if self.ref is not None and online is not None and any(online):
            rows = [k for k, o in enumerate(online) if o]
            stored[rows] = self.ref.encode(frames[rows])
        return stored

    @timed("TAEHV forward")
    def taehv_forward(self, frames: torch.Tensor, latents: torch.Tensor | None):
        with self.acc.autocast():
            return self.model(frames, latents)  # (encoded, decoded): DistillNet

    @timed("Seraena (disc + correction)")
    def seraena_targets(self, target: torch.Tensor, dec: torch.Tensor, latents: torch.Tensor):
        real, fake, ctx = seraena_crop(target, dec, latents, self.cfg.seraena_crop, self.seraena.gen)
        corrected, stats = self.seraena.step_and_make_targets(real, fake.detach().clamp(0, 1), ctx)
        return fake, corrected, stats["disc_loss"]  # a crop of the decoded frames, its targets, the disc's loss

    def note_skipped(self, paths: list[str], why: dict[str, str] | None = None) -> None:
        """One line per unusable video and rank (the loader's workers print none), with why if known."""
        for p in paths:
            if p not in self.skipped_seen:
                self.skipped_seen.add(p)
                reason = f"{why[p]}; " if why and p in why else ""
                self.log(
                    f"data: skipping unreadable or unusable video {one_line(p)} ({reason}logged once)", all_ranks=True
                )

    # ------------------------------------------------------------------ the loop
    def fit(self) -> int:
        cfg, st = self.cfg, self.state
        micro, accum, total = cfg.micro_batch_size, cfg.gradient_accumulation_steps, cfg.max_train_steps
        self.log(
            f"training: steps {st.step} -> {total}, global batch {micro * accum * self.world} = micro {micro} x "
            f"{self.world} processes x accumulation {accum}"
        )
        self.window, self.samples_window, self.t_window = Window(), 0, time.perf_counter()
        self.data_iter = Prefetcher(self.batches, self.device)
        vote = AsyncVote(self.device) if self.world > 1 else None
        self.speed.start(st.step)
        ids = self.stragglers.start(st.step)  # the ranks' hostnames and launch ids (in progress.json), once
        self.progress = ProgressFile(self.run_dir, self.acc.is_main_process, global_batch(cfg, self.world), ids)
        self.bar = bar = progress_bar(self.acc.is_main_process and not self.debug, st.step, total)
        if cfg.validation_at_start and st.step == 0:
            self.validate()
        with self.marks.loop(self.run_dir, cfg, st.step):
            while self.state.step < total:
                st = self.state  # a rollback replaces it
                lr = lr_at(st.step, cfg) * self.guard.lr_scale(st.step)
                for g in self.optimizer.param_groups:
                    g["lr"] = lr
                done_micro = 0
                while done_micro < accum:
                    batch = self.marks.fetch(self.data_iter)
                    st.samples_seen += micro
                    self.note_skipped(batch["skipped"], batch.get("why"))
                    out = self.train_step(batch)
                    if out is None:
                        st.bad_steps_total += 1
                        if self.guard.rollback_due:
                            self.rollback()
                            break
                        done_micro = 0 if self.guard.step_skipped else done_micro  # the step is made again
                        continue
                    done_micro += 1
                    self.samples_window += micro * self.world
                    self.window.add(out)
                if done_micro < accum:
                    continue  # rolled back: on from the checkpoint's step
                st.step += 1
                PROGRESS.set_step(st.step)
                self.ema.update(self.acc.unwrap_model(self.model).taehv, st.step)  # gathers under ZeRO-3
                if bar is not None:
                    bar.update(1)
                self.marks.stepped(st.step, total)
                if st.step % cfg.log_every == 0 or st.step == total:
                    with PROGRESS.phase("log"):  # trackers may be remote: a slow phase, not the step's
                        means = self._log_window(st.step, total)
                    if bar is not None:
                        bar.set_postfix(loss=f"{means.get('loss', float('nan')):.4f}", refresh=False)
                if st.step % cfg.validation_steps == 0 or st.step == total:
                    self.validate()
                if vote is None:
                    stopping = self.stop.local
                else:  # the vote cast after the previous step: no host sync while this step runs
                    stopping = vote.result()
                    vote.cast(self.stop.local)
                if stopping or st.step % cfg.checkpointing_steps == 0 or st.step == total:
                    self.checkpoint()
                if stopping:
                    return self._preempted(bar)
        st = self.state
        if bar is not None:
            bar.close()
            self.bar = None
        self.speed.write(self.marks.table(st.step, self.log))  # --profile's table, said in the log too
        with PROGRESS.phase("export"):
            self.export("final_model")
        self.log(f"done: {st.step} steps; final EMA model in {self.run_dir / 'final_model'}")
        return EXIT_OK

    def rollback(self) -> None:
        """guard.py's Rollback loads the checkpoint (or stops the run); the data and the loop start again there."""
        with PROGRESS.phase("rollback"):
            self.state, event = self.rollbacks.roll(self.state)
            s = self.state.step
            self.open_data(event["data_seed"], self.state.samples_seen)
            self.data_iter = Prefetcher(self.batches, self.device)
            self.trackers.rewind(s + 1)  # TensorBoard drops the steps after s, as on a resume; events.jsonl keeps them
            self.scalar("train/rollbacks", event["rollback"], event["step"])
            self.window.clear()
            self.samples_window, self.t_window = 0, time.perf_counter()
            self.stragglers.restart(s)  # the next log window starts new DataLoader workers
            self.marks.restart(s)  # the watchdog's step, the stragglers' clock, speed.json's window
            if self.bar is not None:
                self.bar.n = s
                self.bar.refresh()
            self.log(Rollback.line(event), all_ranks=True)

    def _preempted(self, bar) -> int:
        if bar is not None:
            bar.close()
            self.bar = None
        if self.acc.is_main_process:
            (self.run_dir / REQUEUE).write_text(json.dumps({"step": self.state.step}))
        self.log(
            f"stopped by a signal at step {self.state.step}; checkpoint saved. Resume with --resume auto "
            f"(exit code {EXIT_RESUMABLE})"
        )
        return EXIT_RESUMABLE

    def _log_window(self, step: int, total: int) -> dict[str, float]:
        samples_per_s = self.samples_window / max(time.perf_counter() - self.t_window, 1e-9)
        steps = self.samples_window // global_batch(self.cfg, self.world)
        means = self.window.means()  # the one host sync of the window; then one all-reduce (ranks' means, timings)
        means, ranks = gather_window(means, self.clock.take(steps), self.rank, self.world, self.device)
        lr, mem = self.optimizer.param_groups[0]["lr"], self.speed.memory.interval_gib() or 0.0  # mem: GPU peak, CPU 0
        self.trackers.scalars(
            {
                **{f"train/{k}": v for k, v in means.items()},
                "train/learning_rate": lr,
                "train/samples_per_second": samples_per_s,
                "train/gpu_memory_gb": mem,
                "train/gpu_memory_usage": mem,  # the seeds' dashboards read this name
            },
            step,
        )
        eta = self.progress.write(step, total, samples_per_s, self.samples_window)  # progress.json on rank 0
        self.log(window_line(means, lr, samples_per_s, mem, eta, step, total))
        self.stragglers.report(ranks, step)
        self.window.clear()
        self.samples_window, self.t_window = 0, time.perf_counter()
        return means

    # ------------------------------------------------------------------ validation, checkpoints
    def validate(self) -> float:
        """EMA model on the held-out clips, sharded over ranks; its scalars, log line, validation.json,
        best_model (evaluate.py)."""
        return validate(self)

    def checkpoint(self) -> None:
        st = self.state
        st.skipped_files = sorted(self.skipped_seen)[:1000]
        include = self.seraena is not None and self.seraena.buffer_nbytes <= self.cfg.seraena_checkpoint_buffer_mb << 20
        with PROGRESS.phase("checkpoint"), self.clock.outside():
            path = save_checkpoint(
                self.run_dir, self.acc, self.model, self.optimizer, self.ema, self.seraena, st, include_buffer=include
            )
            if self.acc.is_main_process:
                removed = rotate(self.run_dir, self.cfg.checkpoints_total_limit, st.best_step)
                self.log(f"checkpoint: {path.name}" + (f" (removed {', '.join(removed)})" if removed else ""))

    def export(self, name: str) -> None:
        if self.acc.is_main_process:
            export_model(self.ema.state_dict(), self.run_dir / name, export_meta(self.cfg, self.state, name))

    def close(self) -> None:
        self.close_data()
        self.trackers.close()
