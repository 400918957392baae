# Write real-content test videos for the loader/trainer/decoder benchmarks (needs PyAV):
#   python scripts/make_bench_videos.py OUT W H COUNT FRAMES [--src DIR] [--codec libx264|libx265|libvpx-vp9] [--gop N] [--crf N]
# Frames come from the sample videos in --src (default: ../shared/testdata/videos next to the repo),
# resized, played forward and back: real motion, no cuts.
import argparse
import os

import av
import cv2

SOURCES = [
    "chaplin.mp4",
    "smpte-2997.mp4",
    "example2.mp4",
    "fire2.mp4",
    "big_buck_bunny_432_433.webm",
    "no_duration.webm",
]
DEFAULT_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "testdata", "videos")
SUFFIX = {"libx264": ".mp4", "libx265": ".mp4", "libvpx-vp9": ".webm"}


def frames_of(path):
    cap = cv2.VideoCapture(path)
    out = []
    while True:
        ok, f = cap.read()
        if not ok:
            break
        out.append(f)
    return out


def write(path, src, W, H, n, k, codec, gop, crf):
    c = av.open(path, "w")
    s = c.add_stream(codec, rate=30)
    s.width, s.height, s.pix_fmt = W, H, "yuv420p"
    if gop:
        s.gop_size = gop
    opts = {"crf": str(crf)}
    if codec in ("libx264", "libx265"):
        opts["preset"] = "veryfast"
    if codec == "libx265":
        opts["x265-params"] = "log-level=error"
        s.codec_tag = "hvc1"
    if codec == "libvpx-vp9":
        opts.update({"b": "0", "deadline": "realtime", "cpu-used": "8"})
    s.options = opts
    fr = src[k % len(src)]
    for i in range(n):
        j = (i + 7 * k) % (2 * len(fr))
        j = j if j < len(fr) else 2 * len(fr) - 1 - j  # ping-pong: real motion, no cut
        f = cv2.resize(fr[j], (W, H))
        for p in s.encode(av.VideoFrame.from_ndarray(cv2.cvtColor(f, cv2.COLOR_BGR2RGB), format="rgb24")):
            c.mux(p)
    for p in s.encode():
        c.mux(p)
    c.close()


def main():
    ap = argparse.ArgumentParser(description="write COUNT real-content videos of W x H and FRAMES frames into OUT")
    ap.add_argument("out")
    ap.add_argument("W", type=int)
    ap.add_argument("H", type=int)
    ap.add_argument("count", type=int)
    ap.add_argument("frames", type=int)
    ap.add_argument(
        "--src", default=DEFAULT_SRC, help="folder of the sample videos (default: ../shared/testdata/videos)"
    )
    ap.add_argument("--codec", default="libx264", choices=sorted(SUFFIX))
    ap.add_argument("--gop", type=int, default=0, help="keyframe interval in frames (0: the encoder's default)")
    ap.add_argument("--crf", type=int, default=23)
    a = ap.parse_args()
    if not os.path.isdir(a.src):
        raise SystemExit(f"no sample video folder at {a.src}: pass --src DIR")
    src = [frames_of(os.path.join(a.src, p)) for p in SOURCES]
    src = [s for s in src if len(s) > 10]
    if not src:
        raise SystemExit(f"no readable sample videos in {a.src}: pass --src DIR with {SOURCES[0]} etc.")
    os.makedirs(a.out, exist_ok=True)
    for k in range(a.count):
        write(os.path.join(a.out, f"clip{k:02d}{SUFFIX[a.codec]}"), src, a.W, a.H, a.frames, k, a.codec, a.gop, a.crf)


if __name__ == "__main__":
    main()
