"""Probe: where the CogVideoX reference encode spends its time, and whether conv3d as conv2d pays.

python3 scripts/gpu_probe_encode.py [micro|encoder|kernels]...  (GPU machine, wheels installed)
Prints ms and TFLOP/s per variant; every variant of the encoder is checked against eager conv3d.
Measured 2026-11-24 on the H100 (docs/benchmarks.md, docs/evidence/speed/probe_*.txt):
  micro encoder kernels     conv3d vs conv3d-as-conv2d (rejected: slower), kernel tables
  taehv cl overlap kernels  TAEHV step eager/compiled x NCHW/channels-last, the channels-last encoder,
                            encode on a side stream beside the step
  ref kernels               the trainer's encode compiled NCDHW vs NDHWC with ChannelsLastGroupNorm (2026-11-24)
  refmore                   on top of NDHWC: fewer realized intermediates, no conv_cache outputs, cudnn.benchmark
  refpad kernels            on top of NDHWC: the causal time padding as one replicate pad, CUDA graphs, chunk 4
  families                  HunyuanVideo and Wan encoders compiled NCDHW vs NDHWC (2026-11-24: NDHWC faster)
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.nn.functional as F

import torch.nn as nn

from taehv_launch.bench.compare import time_steps


# --- the rejected lever: every Conv3d of the frozen encoder as one Conv2d over stacked frames ---
class Conv3dAsConv2d(nn.Module):
    """Frozen replacement of a Conv3d (time stride 1, time padding 0, zeros padding, groups 1)."""

    def __init__(self, conv: nn.Conv3d):
        super().__init__()
        out_c, in_c, kt, kh, kw = conv.weight.shape
        self.kt = kt
        self.padding = tuple(conv.padding[1:])
        self.stride = tuple(conv.stride[1:])
        weight = conv.weight.detach().permute(0, 2, 1, 3, 4).reshape(out_c, kt * in_c, kh, kw)
        self.register_buffer("weight", weight.contiguous(), persistent=False)
        self.register_buffer("bias", None if conv.bias is None else conv.bias.detach().clone(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, t, h, w = x.shape
        frames = t - self.kt + 1
        xt = x.transpose(1, 2)  # N T C H W
        if self.kt > 1:
            xt = torch.cat([xt[:, k : k + frames] for k in range(self.kt)], dim=2)
        y = F.conv2d(xt.reshape(n * frames, self.kt * c, h, w), self.weight, self.bias, self.stride, self.padding)
        return y.view(n, frames, *y.shape[1:]).transpose(1, 2)


def swappable(module: nn.Module) -> bool:
    """A Conv3d whose forward is nn.Conv3d's own (or diffusers' memory-splitting one) and whose
    geometry the 2D form reproduces."""
    if not isinstance(module, nn.Conv3d):
        return False
    forward = type(module).forward
    plain = forward is nn.Conv3d.forward or type(module).__name__ == "CogVideoXSafeConv3d"
    return (
        plain
        and module.stride[0] == 1
        and module.padding[0] == 0
        and module.dilation == (1, 1, 1)
        and module.groups == 1
        and module.padding_mode == "zeros"
        and isinstance(module.padding, tuple)
    )


def swap_conv3d(root: nn.Module) -> nn.Module:
    """Replace every swappable Conv3d under `root` (in place); returns root. Frozen use only."""
    for name, child in list(root.named_children()):
        if swappable(child):
            setattr(root, name, Conv3dAsConv2d(child))
        else:
            swap_conv3d(child)
    return root


dev = torch.device("cuda")
bf = torch.bfloat16


def bench(fn, reps=5, warm=2):
    """ms per call (bench --compare's own timer)."""
    return time_steps(fn, dev, reps, warm) * 1e3


def micro():
    for c, t, h, w in [(128, 11, 480, 720), (256, 7, 240, 360), (512, 5, 120, 180), (512, 5, 60, 90)]:
        x = torch.randn(2, c, t, h, w, device=dev, dtype=bf)
        conv = torch.nn.Conv3d(c, c, 3, padding=(0, 1, 1)).to(dev, bf)
        flops = 2 * 27 * c * c * (t - 2) * h * w * 2
        rows = {"conv3d": lambda: conv(x)}
        xl = x.contiguous(memory_format=torch.channels_last_3d)
        convl = torch.nn.Conv3d(c, c, 3, padding=(0, 1, 1)).to(dev, bf)
        convl.load_state_dict(conv.state_dict())
        convl = convl.to(memory_format=torch.channels_last_3d)
        rows["conv3d channels_last_3d"] = lambda: convl(xl)
        wrapped = torch.nn.Sequential(torch.nn.Conv3d(c, c, 3, padding=(0, 1, 1))).to(dev, bf)
        wrapped[0].load_state_dict(conv.state_dict())
        swap_conv3d(wrapped)
        rows["as conv2d (stacked time)"] = lambda: wrapped(x)
        rows["as conv2d, channels_last input"] = lambda: wrapped(xl)
        ref = conv(x).float()
        for name, fn in rows.items():
            ms = bench(fn)
            err = (fn().float() - ref).abs().max().item() / ref.abs().max().item()
            print(
                f"micro C={c} T={t} {h}x{w}: {name:34s} {ms:8.2f} ms {flops / ms / 1e9:6.0f} TFLOP/s  rel err {err:.1e}",
                flush=True,
            )
        del x, xl


def encoder():
    import diffusers
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    vae = diffusers.AutoencoderKLCogVideoX().to(dev, bf).eval().requires_grad_(False)
    x = torch.rand(8, 3, 9, 480, 720, device=dev, dtype=bf) * 2 - 1
    enc = vae.encoder

    def run(module):
        return torch.cat([module(c)[0] for c in x.split(2)])

    with torch.no_grad():
        with FlopCounterMode(display=False) as fc:
            run(enc)
        flops = fc.get_total_flops()
        print(f"encoder FLOPs per 8 clips: {flops / 1e12:.1f} T", flush=True)
        ref = run(enc).float()
        import copy

        swapped = swap_conv3d(copy.deepcopy(enc))
        variants = [("eager conv3d", enc), ("eager conv2d swap", swapped)]
        for name, m in variants:
            ms = bench(lambda: run(m), reps=3)
            err = (run(m).float() - ref).abs().max().item() / ref.abs().max().item()
            print(
                f"encoder {name:32s} {ms:8.1f} ms / 8 clips {flops / ms / 1e9:6.0f} TFLOP/s rel err {err:.1e}",
                flush=True,
            )
        for name, m in [("compiled conv3d", enc), ("compiled conv2d swap", swapped)]:
            c = torch.compile(m, dynamic=False)
            t0 = time.perf_counter()
            run(c)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            ms = bench(lambda: run(c), reps=3)
            err = (run(c).float() - ref).abs().max().item() / ref.abs().max().item()
            print(
                f"encoder {name:32s} {ms:8.1f} ms / 8 clips {flops / ms / 1e9:6.0f} TFLOP/s rel err {err:.1e} "
                f"(first call {first:.0f} s) peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB",
                flush=True,
            )
            if "kernels" in sys.argv:
                kernels(lambda: run(c), name)


def kernels(fn, name):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    print(f"--- kernels of {name}")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70), flush=True)


def encoder_cl():
    """The compiled encoder with weights and input in channels_last_3d (no cuDNN NCHW<->NHWC transposes)."""
    import diffusers

    torch.manual_seed(0)
    vae = diffusers.AutoencoderKLCogVideoX().to(dev, bf).eval().requires_grad_(False)
    x = torch.rand(8, 3, 9, 480, 720, device=dev, dtype=bf) * 2 - 1
    enc = vae.encoder

    def run(module, cl):
        return torch.cat(
            [module(c.contiguous(memory_format=torch.channels_last_3d) if cl else c)[0] for c in x.split(2)]
        )

    with torch.no_grad():
        ref = run(enc, False).float()
        ms = bench(lambda: run(enc, False), reps=3)
        print(f"encoder eager NCDHW                      {ms:8.1f} ms / 8 clips", flush=True)
        for m in enc.modules():
            if isinstance(m, torch.nn.Conv3d):
                m.weight.data = m.weight.data.contiguous(memory_format=torch.channels_last_3d)
        ms = bench(lambda: run(enc, True), reps=3)
        err = (run(enc, True).float() - ref).abs().max().item() / ref.abs().max().item()
        print(f"encoder eager channels_last_3d            {ms:8.1f} ms / 8 clips rel err {err:.1e}", flush=True)
        c = torch.compile(enc, dynamic=False)
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        run(c, True)
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        ms = bench(lambda: run(c, True), reps=3)
        err = (run(c, True).float() - ref).abs().max().item() / ref.abs().max().item()
        print(
            f"encoder compiled channels_last_3d         {ms:8.1f} ms / 8 clips rel err {err:.1e} (first call {first:.0f} s)"
            f" peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB",
            flush=True,
        )
        if "kernels" in sys.argv:
            kernels(lambda: run(c, True), "compiled channels_last_3d")
    return c, run


def probe_setup(kind="cogvideox"):
    """(path, frames, want): a default-architecture VAE of `kind` saved to disk, 8 clips of
    12 x 480x720, and their eager encode at chunk 2 (the reference every variant is checked against)."""
    import diffusers
    from taehv_launch.plan.families import FAMILIES
    from taehv_launch.train.reference.refvae import load_reference_vae

    path = f"/tmp/probe_ref_{kind}"
    torch.manual_seed(0)
    getattr(diffusers, FAMILIES[kind].class_name)().save_pretrained(path)
    frames = torch.randint(0, 256, (8, 12, 3, 480, 720), dtype=torch.uint8, device=dev)
    want = load_reference_vae(kind, path, dtype=bf, device=dev, chunk_size=2).encode(frames)
    return path, frames, want


def time_encode(kind, path, frames, want, name, setup, chunk=2, reps=5, profile=True) -> float:
    """One row: load, apply `setup(ref)`, time ref.encode (first call = compile), check against `want`."""
    from taehv_launch.train.reference.refvae import load_reference_vae

    ref = load_reference_vae(kind, path, dtype=bf, device=dev, chunk_size=chunk)
    setup(ref)
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    got = ref.encode(frames)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    ms = bench(lambda: ref.encode(frames), reps=reps)
    err = (got - want).abs().max().item() / want.abs().max().item()
    print(
        f"{kind} encode {name:40s} {ms:8.1f} ms / 8 clips rel err {err:.1e} (first call {first:.0f} s) "
        f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB",
        flush=True,
    )
    if profile and "kernels" in sys.argv:
        kernels(lambda: ref.encode(frames), name)
    del ref, got
    torch.cuda.empty_cache()
    return ms


def ref_layouts():
    """The trainer's own encode (ReferenceVAE.encode, chunk 2, compiled) NCDHW against NDHWC with
    ChannelsLastGroupNorm (train/reference/refopt.py), each checked against the eager encode."""
    from taehv_launch.train.loop.speed import compile_reference

    data = probe_setup()
    for name, cl in [("compiled NCDHW (until now)", False), ("compiled NDHWC + ChannelsLastGroupNorm", True)]:
        time_encode("cogvideox", *data, name, lambda ref: compile_reference(ref, channels_last=cl, replicate_pad=False))


def ref_more():
    """Levers on top of the NDHWC encode, each on its own row against the NDHWC row of the same run:
    cuDNN autotuning, Inductor realizing fewer intermediates (fuses the group norm's affine map into the
    SiLU + causal-pad copy), and the encoder compiled without its conv_cache outputs."""
    from taehv_launch.train.loop.speed import compile_reference
    from taehv_launch.train.reference.refopt import channels_last_encoder

    class NoCache(nn.Module):
        """The encoder's forward without the conv_cache outputs (one frame batch: nobody reads them)."""

        def __init__(self, enc):
            super().__init__()
            self.enc = enc
            self.compiled = torch.compile(lambda x: enc(x)[0], dynamic=False)

        def forward(self, x, temb=None, conv_cache=None):
            assert conv_cache is None
            return self.compiled(x), None

    def setup_nl(ref):
        compile_reference(ref, channels_last=True, replicate_pad=False)

    def setup_bench(ref):
        torch.backends.cudnn.benchmark = True
        setup_nl(ref)

    def setup_fuse(ref):
        enc = channels_last_encoder(ref.model.encoder)
        ref.channels_last = True
        ref.model.encoder = torch.compile(
            enc,
            dynamic=False,
            options={
                "realize_reads_threshold": 64,
                "realize_opcount_threshold": 400,
                "realize_acc_reads_threshold": 64,
            },
        )

    def setup_nocache(ref):
        enc = channels_last_encoder(ref.model.encoder)
        ref.channels_last = True
        ref.model.encoder = NoCache(enc)

    data = probe_setup()
    for name, setup in [
        ("NDHWC (new default)", setup_nl),
        ("NDHWC + realize fewer (fuse GN affine)", setup_fuse),
        ("NDHWC, no conv_cache outputs", setup_nocache),
        ("NDHWC + cudnn.benchmark", setup_bench),
    ]:
        time_encode("cogvideox", *data, name, setup)
    torch.backends.cudnn.benchmark = False


def ref_pad():
    """Levers on top of the NDHWC encode, each on its own row against the NDHWC row of the same run."""
    from taehv_launch.train.reference.refopt import channels_last_encoder, replicate_time_padding
    from taehv_launch.train.reference.refvae import load_reference_vae
    from taehv_launch.train.loop.speed import compile_reference

    path, frames, want = data = probe_setup()
    ref_eager = load_reference_vae("cogvideox", path, dtype=bf, device=dev, chunk_size=2)
    n = replicate_time_padding(ref_eager.model.encoder)
    same = (ref_eager.encode(frames) - want).abs().max().item()
    print(f"replicate-pad eager check: {n} causal convs, max abs diff vs cat {same:.1e}", flush=True)
    del ref_eager

    def setup_graphs(ref):
        replicate_time_padding(ref.model.encoder)
        enc = channels_last_encoder(ref.model.encoder)
        ref.channels_last = True
        ref.model.encoder = torch.compile(enc, dynamic=False, mode="reduce-overhead")

    rows = [
        ("NDHWC (default)", lambda ref: compile_reference(ref, True, replicate_pad=False), 2),
        ("NDHWC + replicate pad", lambda ref: compile_reference(ref, True, replicate_pad=True), 2),
        ("NDHWC + replicate pad + CUDA graphs", setup_graphs, 2),
        ("NDHWC chunk 4", lambda ref: compile_reference(ref, True, replicate_pad=False), 4),
    ]
    for name, setup, chunk in rows:
        time_encode("cogvideox", *data, name, setup, chunk=chunk, profile="graphs" not in name)


def families():
    """The other families' encoders (diffusers default architectures, random weights), compiled,
    NCDHW against NDHWC with ChannelsLastGroupNorm, 8 clips of 12 x 480x720 at chunk 2."""
    from taehv_launch.train.loop.speed import compile_reference

    for kind in ("hunyuan", "wan"):
        data = probe_setup(kind)
        for name, cl in [("compiled NCDHW", False), ("compiled NDHWC + ChannelsLastGroupNorm", True)]:
            time_encode(kind, *data, name, lambda ref: compile_reference(ref, channels_last=cl), reps=3)


def taehv_step(cl: bool, compiled: bool):
    from taehv_launch.train.model.taehv import TAEHV
    from taehv_launch.train.model.seraena import VideoSeraena, seraena_crop

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = TAEHV(latent_channels=16).to(dev).train()
    if cl:
        model.to(memory_format=torch.channels_last)
    if compiled:
        model.encode_video = torch.compile(model.encode_video, dynamic=False)
        model.decode_video = torch.compile(model.decode_video, dynamic=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ser = VideoSeraena(16, autocast_dtype=bf, buffer_bytes=1 << 30).to(dev)
    frames = torch.rand(8, 12, 3, 480, 720, device=dev)
    latents = torch.randn(8, 3, 16, 60, 90, device=dev)

    def step():
        with torch.autocast("cuda", dtype=bf):
            enc = model.encode_video(frames)
            dec = model.decode_video(latents, clamp=False)
        dec = dec.float()
        target = frames[:, : dec.shape[1]]
        loss = F.mse_loss(dec, target) + F.mse_loss(enc.float(), latents)
        real, fake, ctx = seraena_crop(target, dec, latents, 256, gen)
        corrected, _ = ser.step_and_make_targets(real, fake.detach().clamp(0, 1), ctx)
        loss = loss + 0.3 * F.mse_loss(fake, corrected)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    ms = bench(step, reps=4)
    print(
        f"taehv step channels_last={cl} compiled={compiled}: {ms:7.1f} ms / 8 clips (first {first:.0f} s) "
        f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB",
        flush=True,
    )
    if "kernels" in sys.argv and not compiled:
        kernels(step, f"taehv step cl={cl}")
    return step


def overlap(encode, step):
    """Encode the next micro-batch on a side stream while the step runs on the main stream."""
    side = torch.cuda.Stream()
    enc_ms = bench(encode, reps=3)
    step_ms = bench(step, reps=3)
    seq_ms = bench(lambda: (encode(), step()), reps=3)

    def both():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            encode()
        step()
        torch.cuda.current_stream().wait_stream(side)

    par_ms = bench(both, reps=3)
    print(
        f"overlap: encode {enc_ms:.1f} + step {step_ms:.1f} ms; sequential {seq_ms:.1f}; side stream {par_ms:.1f} ms; "
        f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB",
        flush=True,
    )


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import scrub_paths  # noqa: E402  (the evidence says what ran, not where: <repo>, <tmp>, <python>, ...)

    scrub_paths.scrub_stdio()
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    modes = {
        "ref": ref_layouts,
        "refmore": ref_more,
        "refpad": ref_pad,
        "families": families,
        "micro": micro,
        "encoder": encoder,
    }
    for mode, probe in modes.items():
        if mode in sys.argv:
            probe()
    if "taehv" in sys.argv:
        for cl, comp in [(False, False), (True, False), (False, True), (True, True)]:
            step = taehv_step(cl, comp)
    if "cl" in sys.argv:
        c, run = encoder_cl()
        if "overlap" in sys.argv:
            step = taehv_step(True, True)
            overlap(lambda: run(c, True), step)
