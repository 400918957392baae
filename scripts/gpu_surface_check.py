"""NVDEC's NV12 surfaces against FFmpeg's own decode of the same frames (GPU machine, PyNvVideoCodec and PyAV):

    python3 scripts/gpu_surface_check.py FOLDER

H.264 decoding is bit-exact, so the luma rows and the interleaved chroma rows that the trainer reads from a
surface (chroma from row `height` on: nv12.yuv420_to_rgb, nv12_kernels._rgb) must equal PyAV's NV12 frame byte
for byte; a surface whose chroma began at a padded height (1088 for 1080 rows) would show here. One line per
file: the surface's shape and stride, and the bytes that differ in each plane. Exit 1 when any differ."""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python3 scripts/gpu_surface_check.py FOLDER (a folder of H.264 .mp4 files)", file=sys.stderr)
        return 2
    try:
        import av
        import PyNvVideoCodec as nvc
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device")
    except Exception as err:
        print(f"gpu_surface_check: needs PyAV, PyNvVideoCodec and a CUDA device ({err})", file=sys.stderr)
        return 2
    bad = 0
    for path in sorted(Path(argv[0]).glob("*.mp4")):
        try:
            with av.open(str(path)) as c:
                if not c.streams.video or c.streams.video[0].codec_context.name != "h264":
                    continue
                want = {}
                for n, frame in enumerate(c.decode(video=0)):
                    if n in (0, 7, 40):
                        want[n] = torch.from_numpy(frame.to_ndarray(format="nv12"))
                    if n >= 40:
                        break
            dec = nvc.SimpleDecoder(str(path), gpu_id=0, use_device_memory=True,
                                    output_color_type=nvc.OutputColorType.NATIVE)  # fmt: skip
            meta = dec.get_stream_metadata()
            h, w = int(meta.height), int(meta.width)
            keys = sorted(want)
            got = [torch.from_dlpack(f) for f in dec.get_batch_frames_by_index(keys)]
        except Exception as err:  # a file FFmpeg or NVDEC cannot decode: said, not compared
            print(f"{path.name}: not compared ({type(err).__name__}: {str(err).strip().splitlines()[:1]})")
            continue
        luma = chroma = 0
        for k, surface in zip(keys, got):
            s, ref = surface.cpu(), want[k]
            luma += int((s[:h, :w] != ref[:h, :w]).sum())
            chroma += int((s[h : h + h // 2, :w] != ref[h : h + h // 2, :w]).sum())
        bad += luma + chroma
        print(f"{path.name}: {w}x{h}, surface {tuple(got[0].shape)} stride {tuple(got[0].stride())}, frames {keys}: "
              f"luma {luma} bytes differ, chroma {chroma}")  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
