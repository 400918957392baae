"""`taehv-launch bench compare GPUS PROFILE`: the naive pipeline and our trainer, side by side, one run.

naive  what a notebook does (the speed issue's definition): the reference VAE in bf16 encodes the
       whole micro-batch in one call, TAEHV keeps fp32 weights under fp16 autocast with a
       GradScaler, Seraena sees whole frames, plain AdamW, no compile, a loss `.item()` per step.
       Its clips come from GPU memory (no loader): that favours the naive side.
levers the trainer's own modules in this process, adding one lever per row (compile, chunk,
       fused AdamW, no per-step syncs, Seraena crop), so each lever's gain is its own number.
ours   the real trainer: `taehv-launch 1 PROFILE` as a subprocess on real video files written
       at the profile's size, with the profile's config (and any --set), DeepSpeed, loader,
       prefetch and all; throughput and memory from its speed.json (steady state, warm-up left out).

Both use the same reference VAE weights (the real architecture with random weights on GPU,
the demo's tiny VAE on CPU) saved to disk and loaded with from_pretrained.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..plan.families import get_family
from ..plan.flops import Rate
from ..plan.schema import make_config
from .runs import cache_row, cached_run, make_assets, trainer_row
from .measure import Meter, time_steps
from .report import _versions, format_report
from .step import _sync


def make_clips(cfg: dict[str, Any], device: torch.device, n_batches: int = 2) -> list[torch.Tensor]:
    """Random uint8 NTCHW clips already on the device (no loader cost)."""
    g = torch.Generator().manual_seed(0)
    shape = (cfg["micro_batch_size"], cfg["n_frames"], 3, cfg["height"], cfg["width"])
    return [torch.randint(0, 256, shape, dtype=torch.uint8, generator=g).to(device) for _ in range(n_batches)]


def load_ref(cfg: dict[str, Any], path: str, device: torch.device, chunk: int):
    from ..train.reference.refvae import load_reference_vae

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return load_reference_vae(cfg["ref_vae_type"], path, dtype=dtype, device=device, chunk_size=chunk)


def build_student(cfg: dict[str, Any], device: torch.device, seraena_autocast: torch.dtype | None):
    from ..train.model.losses import DistillNet
    from ..train.model.taehv import build_taehv
    from ..train.model.seraena import VideoSeraena

    taehv = build_taehv(cfg).to(device).train()
    net = DistillNet(taehv, get_family(cfg["ref_vae_type"]))
    ser = (
        VideoSeraena(
            cfg["latent_channels"],
            frames_per_group=cfg["n_seraena_frames"],
            lr=cfg["seraena_lr"],
            buffer_bytes=cfg["seraena_buffer_mb"] << 20,
            autocast_dtype=seraena_autocast,
            seed=cfg["seed"],
        ).to(device)
        if cfg["use_seraena"]
        else None
    )
    return taehv, net, ser


# ----------------------------------------------------------------------------- the naive pipeline


def naive_row(cfg: dict[str, Any], ref_path: str, device: torch.device, steps: int) -> dict[str, Any]:
    from ..train.loop.flops import count_clip_flops
    from ..train.model.losses import decoder_targets

    cuda = device.type == "cuda"
    meter = Meter(device)
    meter.reset()
    ref = load_ref(cfg, ref_path, device, chunk=0)  # chunk 0: the whole micro-batch in one call
    taehv, net, ser = build_student(cfg, device, torch.float16 if cuda else None)
    opt = torch.optim.AdamW(
        net.parameters(),
        lr=cfg["learning_rate"],
        betas=(cfg["adam_beta1"], cfg["adam_beta2"]),
        weight_decay=cfg["adam_weight_decay"],
    )
    scaler = torch.amp.GradScaler(device.type, enabled=cuda)
    clips = make_clips(cfg, device)
    state = {"i": 0, "latents": None}

    def encode():
        frames = clips[state["i"] % len(clips)].float() / 255.0
        state["i"] += 1
        state["frames"], state["latents"] = frames, ref.encode(frames)

    def step():
        frames, latents = state["frames"], state["latents"]
        with torch.autocast(device.type, dtype=torch.float16, enabled=cuda):
            enc, dec = net(frames, latents)
        dec = dec.float()
        target = decoder_targets(frames, dec)
        loss = F.mse_loss(dec, target) + F.mse_loss(enc.float(), latents)
        if ser is not None:
            corrected, _ = ser.step_and_make_targets(target, dec.detach().clamp(0, 1), latents)
            loss = loss + cfg["seraena_loss_weight"] * F.mse_loss(dec, corrected)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss.item()  # the notebook prints it

    t_encode = time_steps(encode, device, steps)
    t_step = time_steps(step, device, steps)
    clip = count_clip_flops(cfg | {"seraena_crop": 0}, ref.model)  # as the trainer counts; Seraena on whole frames
    out = {
        "what": "naive",
        "encode_s": t_encode,
        "step_s": t_step,
        "seconds": t_encode + t_step,
        "clips_per_s": cfg["micro_batch_size"] / (t_encode + t_step),
        "clip_flops": clip.total,
        "flops_per_clip": clip.record(),
        **meter.peaks(),
    }
    del ref, taehv, net, ser, opt, clips, state
    return out


# ----------------------------------------------------------------------------- our levers, one per row

LEVERS = (
    "eager",
    "compile reference encoder",
    "chunk",
    "reference channels-last",
    "reference replicate pad",
    "compile TAEHV",
    "fused AdamW",
    "no per-step syncs",
    "Seraena crop",
)


def lever_rows(
    cfg: dict[str, Any],
    ref_path: str,
    device: torch.device,
    steps: int,
    chunks: list[int],
    crop: int,
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Our modules, adding one lever per row; every row times encode + train step of one micro-batch."""
    from ..train.model.losses import decoder_targets, psnr_t
    from ..train.loop.flops import count_clip_flops
    from ..train.loop.speed import compile_reference, compile_taehv

    cuda = device.type == "cuda"
    amp = torch.bfloat16 if cuda else None
    ref = load_ref(cfg, ref_path, device, chunk=chunks[0])
    taehv, net, ser = build_student(cfg, device, amp)
    clips = make_clips(cfg, device)
    meter = Meter(device)
    lv = {"fused": False, "syncs": True, "crop": 0}
    clip_flops = {0: count_clip_flops(cfg | {"seraena_crop": 0}, ref.model).total}  # per Seraena crop
    opts: dict[bool, torch.optim.Optimizer] = {}
    state = {"i": 0}

    def optimizer() -> torch.optim.Optimizer:
        if lv["fused"] not in opts:
            opts[lv["fused"]] = torch.optim.AdamW(
                net.parameters(), lr=cfg["learning_rate"], **({"fused": True} if lv["fused"] else {})
            )
        return opts[lv["fused"]]

    def step():
        frames = clips[state["i"] % len(clips)].float().div_(255.0)
        state["i"] += 1
        latents = ref.encode(frames)
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=cuda):
            enc, dec = net(frames, latents)
        dec = dec.float()
        target = decoder_targets(frames, dec)
        rec, enc_l = F.mse_loss(dec, target), F.mse_loss(enc.float(), latents)
        if lv["syncs"]:
            bool(torch.isfinite(rec) and torch.isfinite(enc_l))  # the old per-loss finite checks
        loss = rec + enc_l
        if ser is not None:
            real, fake, ctx = target, dec, latents
            if lv["crop"] and lv["crop"] < min(target.shape[-2:]):
                c = lv["crop"]
                real, fake, ctx = real[..., :c, :c], fake[..., :c, :c], ctx[..., : c // 8, : c // 8]
            corrected, _ = ser.step_and_make_targets(real, fake.detach().clamp(0, 1), ctx)
            loss = loss + cfg["seraena_loss_weight"] * F.mse_loss(fake, corrected)
        loss.backward()
        opt = optimizer()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if lv["syncs"]:
            [x.item() for x in (loss, rec, enc_l)] + [float(psnr_t(dec, target))]

    rows = []

    def row(name: str, detail: str, chunk: int | None = None) -> None:
        meter.reset()
        t0 = time.perf_counter()
        step()  # includes any compile warm-up
        _sync(device)
        warm = time.perf_counter() - t0
        secs = time_steps(step, device, steps, warmup=1)
        rows.append(
            {
                "what": name,
                "detail": detail,
                "chunk": chunk,
                "seconds": secs,
                "clips_per_s": cfg["micro_batch_size"] / secs,
                "clip_flops": clip_flops[lv["crop"]],
                "first_call_s": warm,
                **meter.peaks(),
            }
        )
        peak = rows[-1]["peak_allocated_gib"]
        log(
            f"  lever {name:<28} {detail:<34} {secs * 1000:8.1f} ms / micro-batch ({warm:.0f} s first call"
            + (f", peak {peak:.1f} GiB)" if peak is not None else ")")
        )

    row("eager", f"chunk {chunks[0]}, {'bf16 autocast' if cuda else 'fp32'}, syncs", chunks[0])
    if cuda:
        compile_reference(ref, replicate_pad=False)
        row("compile reference encoder", f"chunk {chunks[0]}", chunks[0])
    for c in chunks[1:]:
        ref.chunk_size = c
        row("chunk", f"chunk {c}", c)
    ref.chunk_size = min((r for r in rows if r["chunk"] is not None), key=lambda r: r["seconds"])["chunk"]
    if cuda:
        compile_reference(ref, channels_last=True, replicate_pad=False)  # compiled again, NDHWC
        row("reference channels-last", f"chunk {ref.chunk_size}, NDHWC group norms")
    if cuda and ref.kind == "cogvideox":
        compile_reference(ref, channels_last=True, replicate_pad=True)  # and again
        row("reference replicate pad", "causal time pad fused")
    if cuda:
        compile_taehv(taehv)
        row("compile TAEHV", f"chunk {ref.chunk_size}")
        lv["fused"] = True
        row("fused AdamW", "")
    lv["syncs"] = False
    row("no per-step syncs", "")
    if 0 < crop < min(cfg["height"], cfg["width"]):
        lv["crop"] = crop
        clip_flops[crop] = count_clip_flops(cfg | {"seraena_crop": crop}, ref.model).total
        row("Seraena crop", f"{crop}x{crop}")
    del ref, taehv, net, ser, opts, clips
    return rows


# ----------------------------------------------------------------------------- the command


def run(
    req,
    steps: int,
    trainer_steps: int,
    levers: bool,
    chunks: list[int],
    crop: int,
    data_root: str | None,
    workdir: str | None,
    phases: bool,
    as_json: bool,
    cached: int = 0,
    cached_sets: list[str] | None = None,
    online: bool = True,
    cached_rows: list[list[str]] | None = None,
    row_timeout: float = 0,
    deadline: float = 0,
) -> int:
    """cached > 0: also write a latent cache of that many views per video and train from it (extra
    --set values for the runs from the cache only: cached_sets), and once more per cached_rows item with
    its --set values on top: one row per lever. online False: no online trainer row. row_timeout: seconds
    a trainer run may take (0: no limit); deadline: seconds from here to the last row's end (0: none): a
    run is given what is left and not started with less than MIN_ROW_S. A from-cache run that fails or is
    stopped becomes a row saying why; the command then exits 1 after the table."""
    from ..run.request import build_plan

    started = time.monotonic()

    def left() -> float | None:  # of the --deadline
        return deadline - (time.monotonic() - started) if deadline else None

    def budget(for_trainer: bool = True) -> float | None:
        limits = [x for x in (row_timeout if for_trainer else 0, left()) if x]
        return min(limits) if limits else None

    plan = build_plan(req)
    cfg = plan.config
    if plan.world_size != 1:
        raise ConfigError(f"bench compare measures one GPU: use `taehv-launch bench compare 1 {req.profile}`")
    want_gpu = plan.profile.device == "cuda"
    if want_gpu and not torch.cuda.is_available():
        raise ConfigError(
            f"profile {req.profile} needs a GPU and this machine has none: run it on a GPU machine, "
            f"or `taehv-launch bench compare 1 cpu` for a CPU smoke run"
        )
    device = torch.device("cuda" if want_gpu else "cpu")
    work = Path(workdir or Path(cfg["output_dir"]).expanduser() / "bench-compare")
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if as_json else (lambda m: print(m, flush=True))
    data, ref_path = make_assets(cfg, device, work, data_root, log)
    if want_gpu and cfg["compile"] != "none":
        from ..train.loop.speed import enable_compile_cache

        enable_compile_cache(
            make_config(cfg | {"output_dir": str(work / "output")})
        )  # shared with the trainer run below
    gpu = torch.cuda.get_device_name(device) if want_gpu else "cpu"
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "device": gpu,
        "torch": torch.__version__,
        "versions": _versions(),
        "command": "taehv-launch " + " ".join(sys.argv[1:]),
        "shape": f"micro {cfg['micro_batch_size']} x {cfg['n_frames']} x {cfg['height']}x{cfg['width']}",
        "ref_vae_type": cfg["ref_vae_type"],
        "rows": [],
    }
    log(f"bench --compare on {gpu}: {report['shape']}, {cfg['ref_vae_type']} reference VAE")
    naive = naive_row(cfg, ref_path, device, steps)
    report["rows"].append(naive)
    log(
        f"  naive: encode {naive['encode_s'] * 1000:.1f} ms + step {naive['step_s'] * 1000:.1f} ms per micro-batch "
        f"= {naive['clips_per_s']:.2f} clips/s"
    )
    if levers:
        report["rows"] += lever_rows(cfg, ref_path, device, steps, chunks or [cfg["ref_vae_chunk_size"]], crop, log)
    (work / "compare.json").write_text(json.dumps(report, indent=2))  # what is measured so far
    if want_gpu:
        torch.cuda.empty_cache()
    if online:
        ours = trainer_row(
            req.gpus, req.profile, req.sets, work, data, ref_path, trainer_steps, False, log, timeout=budget()
        )
        report["rows"].append(ours)
        (work / "compare.json").write_text(json.dumps(report, indent=2))
        if phases:
            prof = trainer_row(
                req.gpus, req.profile, req.sets, work, data, ref_path, max(12, trainer_steps // 2), True, log,
                timeout=budget(),
            )  # fmt: skip
            ours["phases"] = prof.get("phases")
    if cached:
        row, cache = cache_row(
            req.gpus, req.profile, req.sets, work, data, ref_path, cached, log, timeout=budget(for_trainer=False)
        )
        report["rows"].append(row)
        (work / "compare.json").write_text(json.dumps(report, indent=2))
        base = [*req.sets, f"latent_cache={cache!r}", *(cached_sets or [])]
        levers = [("ours, from the latent cache", " ".join(cached_sets or [])[:30], [])]
        levers += [("from the cache +", " ".join(sets), sets) for sets in cached_rows or []]
        for i, (what, detail, sets) in enumerate(levers):
            report["rows"].append(
                cached_run(
                    req, work, data, ref_path, trainer_steps, [*base, *sets], budget(), left(), f"-c{i}", detail, log
                )
                | {"what": what, "detail": detail, "sets": sets}
            )
            (work / "compare.json").write_text(json.dumps(report, indent=2))
    for r in report["rows"]:  # FLOPs per clip of what the row runs (train/loop/flops.py), TFLOP/s and MFU
        if r.get("clips_per_s") is None:  # a from-cache run that was not measured: its reason says why
            r |= {"ratio_vs_naive": None, "tflops": None, "mfu": None, "clip_flops": None}
            continue
        if r.get("not_training"):  # the cache job: the reference encode only
            r["clip_flops"] = naive["flops_per_clip"]["reference"]
        elif "clip_flops" not in r:  # a trainer row: its own count at start-up (speed.json)
            r["clip_flops"] = (r.get("flops_per_clip") or {}).get("total")
        rate = Rate.of(r["clip_flops"] or 0.0, 1, gpu, want_gpu)
        r["ratio_vs_naive"] = r["clips_per_s"] / naive["clips_per_s"]
        r["tflops"] = rate.tflops(r["clips_per_s"]) if r["clip_flops"] else None
        r["mfu"] = rate.mfu(r["clips_per_s"]) if r["clip_flops"] else None
    report["peak_tflops"] = Rate.of(1.0, 1, gpu, want_gpu).peak_tflops
    (work / "compare.json").write_text(json.dumps(report, indent=2))
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print(format_report(report))
    missed = [r for r in report["rows"] if r.get("clips_per_s") is None]
    if missed:
        print(
            f"error: {len(missed)} of the runs from the cache were not measured: "
            + "; ".join(f"{r['detail'] or r['what']}: {r['not_measured']}" for r in missed),
            file=sys.stderr,
        )
        return 1
    return 0
