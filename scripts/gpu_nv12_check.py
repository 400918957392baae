"""NV12 -> RGB on the GPU: the fused Triton kernel (train/data/nv12.py) against the torch reference, on real
NVDEC surfaces (GPU machine, PyNvVideoCodec installed):

    python3 scripts/gpu_nv12_check.py FOLDER [FOLDER ...]

For each .mp4 of each folder: 12 frames spread over the file, decoded by NVDEC to native NV12, converted
both ways and compared byte for byte, on NVDEC's own surfaces (as the trainer converts them: pitched where the
decoder pitches) and on contiguous copies. Then the GPU time of one 12-frame clip's conversion, both ways
alternating (CUDA events, 40 rounds), on the first file of each size; then random frames of even sizes up to
3840x2160, contiguous and pitched. One line per file and per size. Exit 1 when bytes differ or the kernel did
not run (no Triton, TAEHV_NV12=torch, a kernel that failed: the comparison would be the reference with itself).

Then the clip kernel (nv12.nv12_clip: colour, crop, resize and flip in one kernel a frame) against the trainer's
other path (the colour kernel, then nvdec.finish's torch ops): 8 crops a file drawn as training draws them
(clips.plan_crop, random downscale and flip) to 480x720, on the same surfaces; the largest difference and the
share of bytes that differ, and the GPU time of one 12-frame clip both ways (medians of 40, alternating).
Exit 1 also when a clip byte differs by more than 1 or more than 0.1% of them differ."""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    folders = [Path(a) for a in argv]
    if not folders or any(not f.is_dir() for f in folders):
        print("usage: python3 scripts/gpu_nv12_check.py FOLDER [FOLDER ...] (folders of .mp4 files)", file=sys.stderr)
        return 2
    try:
        import PyNvVideoCodec as nvc
        import torch
        import triton

        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device")
    except Exception as err:
        print(f"gpu_nv12_check: needs PyNvVideoCodec, Triton and a CUDA device ({err})", file=sys.stderr)
        return 2
    from taehv_launch.train.data import nv12

    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}, {nv12.how()}")
    stream = torch.cuda.Stream()
    frames_total = differ_total = 0
    clip_stats = {"bytes": 0, "differ": 0, "worst": 0}
    clip_timed: set[tuple[int, int]] = set()
    timed: set[tuple[int, int]] = set()
    for path in sorted(p for f in folders for p in f.glob("*.mp4")):
        try:
            dec = nvc.SimpleDecoder(
                str(path),
                gpu_id=0,
                cuda_stream=stream.cuda_stream,
                use_device_memory=True,
                output_color_type=nvc.OutputColorType.NATIVE,
            )
            n = len(dec)
            meta = dec.get_stream_metadata()
            h, w = int(meta.height), int(meta.width)
            want = sorted({round(k * (n - 1) / 11) for k in range(12)})
            surfaces = [torch.from_dlpack(f) for f in dec.get_batch_frames_by_index(want)]
        except Exception as err:
            print(f"{path.name}: NVDEC cannot decode it ({str(err).strip().splitlines()[0][:120]})")
            continue
        torch.cuda.synchronize()
        differ = 0
        for p in surfaces:
            a, b = nv12.yuv420_to_rgb(p, h, w), nv12.nv12_to_rgb(p, h, w)
            differ += int((a != b).sum())
        planes = [p.clone() for p in surfaces]  # contiguous copies, also reused by the timing below
        for p in planes:
            differ += int((nv12.yuv420_to_rgb(p, h, w) != nv12.nv12_to_rgb(p, h, w)).sum())
        frames_total += len(planes)
        differ_total += differ
        print(
            f"{path.parent.name}/{path.name}: {w}x{h}, {len(planes)} frames (surface stride "
            f"{tuple(surfaces[0].stride())}), {differ} bytes differ"
        )
        clips(nv12, torch, surfaces + planes, h, w, path.name, clip_stats, clip_timed)
        if (h, w) not in timed:
            timed.add((h, w))
            ms = {"torch": [], "fused": []}
            for _ in range(40):
                for name, fn in (("torch", nv12.yuv420_to_rgb), ("fused", nv12.nv12_to_rgb)):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    for p in planes:
                        fn(p, h, w)
                    end.record()
                    end.synchronize()
                    ms[name].append(start.elapsed_time(end))
            t, f = sorted(ms["torch"])[20], sorted(ms["fused"])[20]
            print(
                f"  time {w}x{h}, {len(planes)} frames: torch {t:.3f} ms, fused {f:.3f} ms "
                f"(medians of 40, alternating): {t / f:.1f}x"
            )
    gen = torch.Generator(device="cuda").manual_seed(0)
    for h, w in ((2160, 3840), (1080, 1920), (480, 720), (360, 640), (2, 2), (6, 2050)):
        wide = torch.randint(0, 256, (h * 3 // 2, w + 64), dtype=torch.uint8, device="cuda", generator=gen)
        differ = 0
        for frame in (wide[:, :w].contiguous(), wide[:, :w]):  # contiguous, then pitched (w + 64)
            differ += int((nv12.yuv420_to_rgb(frame, h, w) != nv12.nv12_to_rgb(frame, h, w)).sum())
        frames_total += 2
        differ_total += differ
        print(f"random {w}x{h}, contiguous and pitched: {differ} bytes differ")
    for colour in nv12.COLOURS:  # every matrix and range the header's tags name (decode.colour_of)
        frame = torch.randint(0, 256, (1620, 1984), dtype=torch.uint8, device="cuda", generator=gen)[:, :1920]
        differ = int(
            (nv12.yuv420_to_rgb(frame, 1080, 1920, colour) != nv12.nv12_to_rgb(frame, 1080, 1920, colour)).sum()
        )
        frames_total += 1
        differ_total += differ
        print(f"random 1920x1080 pitched, {colour}: {differ} bytes differ")
    ran = nv12._fused() is not None and not nv12._state.get("failed")
    print(f"total: {frames_total} frames, {differ_total} bytes differ; {nv12.how()}")
    share = clip_stats["differ"] / max(1, clip_stats["bytes"])
    print(
        f"clips: {clip_stats['bytes']} bytes, {clip_stats['differ']} differ ({100 * share:.4f}%), "
        f"largest difference {clip_stats['worst']}"
    )
    if not ran:
        print("gpu_nv12_check: the kernel did not run, so nothing was compared with it", file=sys.stderr)
    clips_ok = clip_stats["bytes"] > 0 and clip_stats["worst"] <= 1 and share <= 1e-3
    return 0 if frames_total and not differ_total and ran and clips_ok else 1


def clips(nv12, torch, surfaces, h, w, name, stats, timed) -> None:
    """Clip kernel against colour kernel + finish() on these NV12 frames (12 per clip, 8 crops); timed once a size."""
    import numpy as np

    from taehv_launch.train.data.clips import plan_crop
    from taehv_launch.train.data.nvdec import finish

    rng = np.random.default_rng(len(name))
    frames = (surfaces * 2)[:12]
    worst = differ = total = 0
    for _ in range(8):
        crop = plan_crop(rng, h, w, 480, 720, random_flip=True)
        got = nv12.nv12_clip(frames, h, w, crop, 480, 720)
        if got is None:
            print(f"  clips {name}: the clip kernel did not run here ({nv12.how()})")
            return
        want = finish(torch.stack([nv12.nv12_to_rgb(p, h, w) for p in frames]), crop, None, 480, 720)
        d = (got.int() - want.int()).abs()
        worst, differ, total = max(worst, int(d.max())), differ + int((d > 0).sum()), total + d.numel()
    stats["worst"] = max(stats["worst"], worst)
    stats["differ"] += differ
    stats["bytes"] += total
    line = f"  clips {name}: 8 crops to 480x720, {differ} of {total} bytes differ, largest {worst}"
    if (h, w) not in timed:
        timed.add((h, w))
        crop = plan_crop(None, h, w, 480, 720)  # the whole-frame scale: the largest resize of a file
        ms = {"kernel": [], "torch": []}
        for _ in range(40):
            for how in ms:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                if how == "kernel":
                    nv12.nv12_clip(frames, h, w, crop, 480, 720)
                else:
                    finish(torch.stack([nv12.nv12_to_rgb(p, h, w) for p in frames]), crop, None, 480, 720)
                end.record()
                end.synchronize()
                ms[how].append(start.elapsed_time(end))
        k, t = sorted(ms["kernel"])[20], sorted(ms["torch"])[20]
        line += f"; a 12-frame clip: clip kernel {k:.3f} ms, colour kernel + finish {t:.3f} ms ({t / k:.1f}x)"
    print(line)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
