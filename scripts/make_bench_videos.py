# Write real-content H.264 test videos for the loader/trainer benchmarks: python scripts/make_bench_videos.py OUT W H COUNT FRAMES
# (frames from ../shared/testdata/videos, resized, played forward and back: real motion, no cuts; needs PyAV).
import av, cv2, numpy as np, sys
src_paths = ["chaplin.mp4","smpte-2997.mp4","example2.mp4","fire2.mp4","big_buck_bunny_432_433.webm","no_duration.webm"]
def frames_of(path):
    cap = cv2.VideoCapture(path); out=[]
    while True:
        ok, f = cap.read()
        if not ok: break
        out.append(f)
    return out
src = [frames_of("/work/shared/testdata/videos/"+p) for p in src_paths]
src = [s for s in src if len(s) > 10]
def write(path, W, H, n, k):
    c = av.open(path, "w"); s = c.add_stream("libx264", rate=30); s.width=W; s.height=H; s.pix_fmt="yuv420p"
    s.options = {"preset":"veryfast","crf":"23"}
    fr = src[k % len(src)]
    for i in range(n):
        j = (i + 7*k) % (2*len(fr)); j = j if j < len(fr) else 2*len(fr)-1-j   # ping-pong: real motion, no cut
        f = cv2.resize(fr[j], (W, H))
        for p in s.encode(av.VideoFrame.from_ndarray(cv2.cvtColor(f, cv2.COLOR_BGR2RGB), format="rgb24")): c.mux(p)
    for p in s.encode(): c.mux(p)
    c.close()
out, W, H, count, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
for k in range(count):
    write(f"{out}/clip{k:02d}.mp4", W, H, n, k)
