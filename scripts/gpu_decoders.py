#!/usr/bin/env python3
"""Measure video decoders as training uses them (issue 23, deliverable 1). Run on the GPU machine.

    python scripts/gpu_decoders.py VIDEO_ROOT --out DIR [--probe DIR] [--decoders a,b] [--workers 1,8,12]

VIDEO_ROOT holds one folder per set (e.g. h264_1080p/, from scripts/make_bench_videos.py). For each
decoder x set x worker count, N worker processes (spawned once per decoder, like DataLoader workers)
cut clips the way the trainer does: random start, 12 frames at a random frame delta of 1-2, a random
(downscaling) crop resized to 480x720 (train/data/clips.py plan_frames/plan_crop). CPU decoders resize with
OpenCV as the loader does (render_clip); GPU decoders crop and resize on the GPU with
torch.nn.functional.interpolate (bilinear, antialias). Every worker decodes for --seconds, in step.

Reported per row: clips/s (sum over workers), CPU cores used (the workers' process CPU time, all
threads, / wall time), GPU memory (torch's max allocated and nvidia-smi's per-process use, CUDA
context included), nvidia-smi's GPU and decoder utilisation sampled mid-window, failures. Then, for each
decoder at 1080p H.264, a bf16 matmul loop in another process stands in for training: its
throughput alone vs. while the decoder runs ("GPU time taken from training"). --probe DIR: which
files of DIR each decoder can open and cut a clip from (the fallbacks a loader would need).
Results: DIR/decoders.json (rewritten after every row) and DIR/decoders.md (the table).
"""

from __future__ import annotations

import argparse
import glob
import json
import multiprocessing as mp
import os
import resource
import subprocess
import sys
import tempfile
import time
import traceback

H, W, N_FRAMES, MIN_DELTA, MAX_DELTA = 480, 720, 12, 1, 2
CORES = len(os.sched_getaffinity(0))
DECODERS = ["pynvvideocodec", "opencv", "pyav", "torchcodec-cuda", "torchcodec-cpu"]


# --- decoders (built inside the worker processes) ----------------------------------------------


def _cpu_finish(frames_bgr, rng):
    """BGR frames -> uint8 TCHW RGB clip, exactly as the loader does it (train/data/clips.py)."""
    from taehv_launch.train.data.clips import plan_crop, render_clip

    h, w = frames_bgr[0].shape[:2]
    return render_clip(frames_bgr, plan_crop(rng, h, w, H, W, False, True), H, W)


def _gpu_finish(x, rng):
    """uint8 T,3,h,w CUDA tensor -> the 480x720 clip: the loader's random crop, resized on the GPU."""
    import torch
    import torch.nn.functional as F
    from taehv_launch.train.data.clips import plan_crop

    c = plan_crop(rng, x.shape[2], x.shape[3], H, W, False, True)
    x = x[:, :, c.y : c.y + c.h, c.x : c.x + c.w].float()
    x = F.interpolate(x, size=(H, W), mode="bilinear", antialias=True, align_corners=False)
    out = x.round_().clamp_(0, 255).to(torch.uint8)
    torch.cuda.current_stream().synchronize()  # this stream only: a training stream beside it runs on
    return out


def _frames(rng, n):
    from taehv_launch.train.data.clips import plan_frames

    return plan_frames(rng, n, N_FRAMES, MIN_DELTA, MAX_DELTA)


class OpenCV:
    """The trainer's loader today: train/data/decode.py (_decode_path: seek, grab, read), threads = core share."""

    def __init__(self):
        import cv2

        cv2.setNumThreads(0)  # as worker_init_fn does
        from taehv_launch.train.data import decode

        self.decode = decode

    def set_threads(self, t):
        self.decode.decode_threads = lambda: t  # what decode_threads() gives a DataLoader worker

    def clip(self, path, n, rng):
        wanted = _frames(rng, n)
        got, _ = self.decode._decode_path(path, sorted(set(wanted)), True)
        if got is None:
            raise RuntimeError("opencv: cannot be decoded")
        return _cpu_finish([got[k] for k in wanted], rng)


class PyAV:
    """PyAV, FFmpeg frame+slice threads (thread_type AUTO), seek to the keyframe before the clip."""

    def __init__(self):
        import av

        self.av, self.threads = av, 1

    def set_threads(self, t):
        self.threads = t

    def clip(self, path, n, rng):
        wanted = _frames(rng, n)
        want, got = set(wanted), {}
        with self.av.open(path) as c:
            s = c.streams.video[0]
            s.thread_type, s.thread_count = "AUTO", self.threads
            fps, tb, t0 = float(s.average_rate), s.time_base, (s.start_time or 0)
            if wanted[0] > 0:
                c.seek(t0 + int(wanted[0] / (fps * tb)), stream=s, backward=True)
            for f in c.decode(s):
                i = round(float((f.pts - t0) * tb) * fps)
                if i in want:
                    got[i] = f.to_ndarray(format="bgr24")
                if i >= wanted[-1]:
                    break
        if len(got) != len(want):
            raise RuntimeError(f"pyav: got {len(got)} of {len(want)} frames")
        return _cpu_finish([got[k] for k in wanted], rng)


class NvCodec:
    """PyNvVideoCodec SimpleDecoder on NVDEC, planar RGB in device memory, one decoder reconfigured per file."""

    def __init__(self, stream=None):
        import torch
        import PyNvVideoCodec as nvc

        torch.cuda.init()
        self.nvc, self.torch, self.dec, self.stream = nvc, torch, None, stream

    def set_threads(self, t):
        pass

    def clip(self, path, n, rng):
        if self.dec is None:
            kw = {"cuda_stream": self.stream.cuda_stream} if self.stream is not None else {}
            self.dec = self.nvc.SimpleDecoder(
                path, gpu_id=0, use_device_memory=True, output_color_type=self.nvc.OutputColorType.RGBP, **kw
            )
        else:
            self.dec.reconfigure_decoder(path)
        n = min(n, len(self.dec))
        wanted = _frames(rng, n)
        fr = self.dec.get_batch_frames_by_index(wanted)
        if len(fr) != len(wanted):
            raise RuntimeError(f"pynvvideocodec: got {len(fr)} of {len(wanted)} frames")
        x = self.torch.stack([self._tensor(f) for f in fr])
        if x.shape[1] != 3 and x.shape[-1] == 3:  # interleaved after all
            x = x.permute(0, 3, 1, 2)
        return _gpu_finish(x, rng)

    def _tensor(self, f):
        try:
            return self.torch.from_dlpack(f)
        except Exception:
            return self.torch.as_tensor(f, device="cuda")  # __cuda_array_interface__


class TorchCodec:
    """torchcodec VideoDecoder (approximate seek mode), CPU (FFmpeg threads) or CUDA (NVDEC)."""

    def __init__(self, device):
        import torch
        from torchcodec.decoders import VideoDecoder

        if device == "cuda":
            torch.cuda.init()
        self.VD, self.device, self.threads = VideoDecoder, device, 1

    def set_threads(self, t):
        self.threads = t

    def clip(self, path, n, rng):
        kw = {"num_ffmpeg_threads": self.threads} if self.device == "cpu" else {}
        d = self.VD(path, device=self.device, seek_mode="approximate", **kw)
        wanted = _frames(rng, n)
        x = d.get_frames_at(indices=wanted).data  # T,3,h,w uint8
        if self.device == "cuda":
            return _gpu_finish(x, rng)
        return _cpu_finish([f[:, :, ::-1] for f in x.permute(0, 2, 3, 1).numpy()], rng)


def make_decoder(name):
    return {
        "opencv": OpenCV,
        "pyav": PyAV,
        "pynvvideocodec": NvCodec,
        "torchcodec-cuda": lambda: TorchCodec("cuda"),
        "torchcodec-cpu": lambda: TorchCodec("cpu"),
    }[name]()


# --- worker processes ------------------------------------------------------------------------


def _cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def worker(idx, name, cmd_q, res_q):
    import numpy as np

    try:
        import taehv_launch.train.data.clips  # noqa: F401  (torch, cv2: imported before the clock, as in a DataLoader worker)

        dec = make_decoder(name)
        res_q.put({"idx": idx, "ready": True, "pid": os.getpid()})
    except Exception as e:  # the decoder cannot even be built here: say why, once
        res_q.put({"idx": idx, "ready": False, "error": f"{type(e).__name__}: {e}".splitlines()[0][:300]})
        return
    cuda = name in ("pynvvideocodec", "torchcodec-cuda")
    while True:
        cmd = cmd_q.get()
        if cmd is None:
            return
        if cmd["op"] == "probe":
            out = {}
            for p in cmd["files"]:
                try:
                    c = dec.clip(p, cmd["lengths"][p], np.random.default_rng(0))
                    out[os.path.basename(p)] = "ok " + "x".join(map(str, c.shape))
                except Exception as e:
                    out[os.path.basename(p)] = f"FAIL {type(e).__name__}: {e}".splitlines()[0][:200]
            res_q.put({"idx": idx, "probe": out})
            continue
        dec.set_threads(cmd["threads"])
        rng = np.random.default_rng(1000 * idx + cmd["seed"])
        files, lengths = cmd["files"], cmd["lengths"]
        fails, count, first_err = 0, 0, ""
        try:  # warm-up clip (not timed): opens the decoder, first allocations
            dec.clip(files[idx % len(files)], lengths[files[idx % len(files)]], rng)
        except Exception as e:
            first_err = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        if cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()
        while time.time() < cmd["t_start"]:
            time.sleep(0.002)
        start, c0 = time.time(), _cpu_s()
        end = start
        while time.time() < cmd["t_start"] + cmd["seconds"]:
            p = files[int(rng.integers(len(files)))]
            try:
                dec.clip(p, lengths[p], rng)
                count += 1
            except Exception as e:
                fails += 1
                first_err = first_err or f"{type(e).__name__}: {e}".splitlines()[0][:300]
            end = time.time()
        r = {"idx": idx, "count": count, "fails": fails, "error": first_err, "wall": end - start, "cpu": _cpu_s() - c0}
        if cuda:
            import torch

            r["torch_max_alloc_mib"] = torch.cuda.max_memory_allocated() / 2**20
        res_q.put(r)


# --- the stand-in for training: a bf16 matmul loop, its progress in a shared counter -------------


def matmul_loop(counter, stop, go):
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    while not stop.is_set():
        if not go.is_set():  # paused outside the interference windows
            time.sleep(0.02)
            continue
        for _ in range(10):
            c = a @ b
        torch.cuda.synchronize()
        with counter.get_lock():
            counter.value += 10
    del c


def matmul_rate(counter, seconds):
    """TFLOP/s of the matmul loop over the next `seconds`."""
    v0, t0 = counter.value, time.time()
    time.sleep(seconds)
    return (counter.value - v0) * 2 * 8192**3 / (time.time() - t0) / 1e12


# --- GPU decode inside one process (threads, own CUDA streams), beside a training stand-in --------


def inproc(sets, ks, seconds, q):
    try:
        _inproc(sets, ks, seconds, q)
    except Exception as e:
        traceback.print_exc()
        q.put({"error": f"{type(e).__name__}: {e}".splitlines()[0][:300]})


def _inproc(sets, ks, seconds, q):
    """PyNvVideoCodec in K threads of ONE process, each with its own decoder and CUDA stream, and a bf16
    matmul thread on its own stream in the same process (one CUDA context: no time-slicing between
    processes). Per set and K: clips/s and CPU cores alone, then clips/s and matmul TFLOP/s together."""
    import threading
    import numpy as np
    import torch
    import taehv_launch.train.data.clips  # noqa: F401

    torch.cuda.init()
    done, go, stop = [0], threading.Event(), threading.Event()

    def mm():
        st = torch.cuda.Stream()
        with torch.cuda.stream(st):
            a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
            while not stop.is_set():
                if not go.is_set():
                    time.sleep(0.01)
                    continue
                for _ in range(10):
                    a @ b
                st.synchronize()
                done[0] += 10

    def tflops(secs):
        v0, t0 = done[0], time.time()
        time.sleep(secs)
        return (done[0] - v0) * 2 * 8192**3 / (time.time() - t0) / 1e12

    threading.Thread(target=mm, daemon=True).start()
    streams = [torch.cuda.Stream() for _ in range(max(ks))]
    decs, out = [], {"rows": [], "stream_arg": "torch side stream"}
    for st in streams:
        try:
            decs.append(NvCodec(st))
            f0 = sets[0][1]["files"][0]
            decs[-1].clip(f0, sets[0][1]["lengths"][f0], np.random.default_rng(0))
        except Exception as e:  # the decoder refused the stream handle: default stream then
            out["stream_arg"] = f"default stream ({type(e).__name__}: {e})".splitlines()[0][:200]
            decs[-1] = NvCodec()

    def run(k, sset, secs):
        counts, errs, end = [0] * k, [], time.time() + secs

        def body(i):
            rng = np.random.default_rng(100 + i)
            with torch.cuda.stream(streams[i]):
                while time.time() < end:
                    p = sset["files"][int(rng.integers(len(sset["files"])))]
                    try:
                        decs[i].clip(p, sset["lengths"][p], rng)
                        counts[i] += 1
                    except Exception as e:
                        errs.append(f"{type(e).__name__}: {e}".splitlines()[0][:120])

        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.time()
        th = [threading.Thread(target=body, args=(i,)) for i in range(k)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        r1, wall = resource.getrusage(resource.RUSAGE_SELF), time.time() - t0
        cpu = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / wall
        return sum(counts) / wall, cpu, len(errs), (errs[0] if errs else "")

    go.set()
    time.sleep(1.0)
    out["matmul_alone"] = tflops(2.0)
    go.clear()
    for sname, sset in sets:
        for k in ks:
            torch.cuda.reset_peak_memory_stats()
            alone = run(k, sset, seconds)
            go.set()
            time.sleep(0.3)
            res, box = [None], [0.0]
            th = threading.Thread(target=lambda: res.__setitem__(0, run(k, sset, seconds)))
            th.start()
            time.sleep(0.5)
            box[0] = tflops(seconds - 1.0)
            th.join()
            go.clear()
            row = {
                "set": sname,
                "threads": k,
                "clips_per_s": alone[0],
                "cpu_cores": alone[1],
                "fails": alone[2],
                "error": alone[3],
                "clips_per_s_with_matmul": res[0][0],
                "matmul_tflops_with": box[0],
                "torch_max_alloc_mib": torch.cuda.max_memory_allocated() / 2**20,
                "smi": smi("utilization.gpu,utilization.decoder,memory.used"),
            }
            out["rows"].append(row)
            print(
                f"   inproc {sname} k={k}: {alone[0]:.1f} clips/s ({alone[1]:.1f} cores), with matmul "
                f"{res[0][0]:.1f} clips/s and {box[0]:.0f} TFLOP/s, fails {alone[2]} {alone[3][:60]}",
                flush=True,
            )
    go.set()
    time.sleep(0.5)
    out["matmul_alone_end"] = tflops(2.0)
    stop.set()
    q.put(out)


# --- the parent ----------------------------------------------------------------------------


def smi(query, apps=False):
    kind = "--query-compute-apps" if apps else "--query-gpu"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"{kind}={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        return [line.split(", ") for line in out.strip().splitlines() if line.strip()]
    except Exception:
        return []


def ffmpeg_libs_for_torchcodec():
    """torchcodec loads libavcodec.so.N by its plain name; point such names at PyAV's bundled FFmpeg."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("av")
        libs = os.path.join(os.path.dirname(os.path.dirname(spec.origin)), "av.libs")
    except Exception:
        return ""
    import torch

    site = os.path.dirname(os.path.dirname(torch.__file__))
    cuda_dirs = sorted(
        {os.path.dirname(p) for p in glob.glob(os.path.join(site, "nvidia", "**", "lib*.so*"), recursive=True)}
    )
    d = tempfile.mkdtemp(prefix="fflibs")
    for f in glob.glob(os.path.join(libs, "*.so.*")):
        b = os.path.basename(f)
        stem = b.split("-")[0]
        major = b.split(".so.")[1].split(".")[0]
        if stem.startswith(("libav", "libsw")):
            os.symlink(f, os.path.join(d, f"{stem}.so.{major}"))
    # av.libs itself too: the linked libraries' own hashed dependencies (libdrm-*.so...) are found through
    # $ORIGIN, which is the symlink's folder here (2026-11-24 run 2 failed on exactly that; untested since)
    os.environ["LD_LIBRARY_PATH"] = ":".join(
        [d, libs, os.path.join(os.path.dirname(torch.__file__), "lib")]
        + cuda_dirs
        + [os.environ.get("LD_LIBRARY_PATH", "")]
    )
    return os.environ["LD_LIBRARY_PATH"]


def torchcodec_load_error():
    """'' if torchcodec loads its FFmpeg 9 core here, else why not (the dynamic loader's lines)."""
    code = "import torch, torchcodec._internally_replaced_utils as u; print(u.load_core_libraries())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if r.returncode == 0:
        return ""
    return "\n".join(line for line in r.stderr.splitlines() if "Error" in line or ".so" in line)[-3000:]


def video_sets(root):
    import cv2

    sets = {}
    for d in sorted(glob.glob(os.path.join(root, "*"))):
        files = sorted(f for f in glob.glob(os.path.join(d, "*")) if os.path.isfile(f))
        if not files:
            continue
        lengths, info = {}, ""
        for f in files:
            cap = cv2.VideoCapture(f)
            lengths[f] = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
            info = f"{int(cap.get(cv2.CAP_PROP_FRAME_WIDTH))}x{int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))}"
            cap.release()
        mib = sum(os.path.getsize(f) for f in files) / 2**20
        sets[os.path.basename(d)] = {
            "files": files,
            "lengths": lengths,
            "desc": f"{len(files)} files {info}, {min(lengths.values())}-{max(lengths.values())} frames, {mib:.1f} MiB",
        }
    return sets


class Pool:
    def __init__(self, name, n, ctx):
        self.name, self.cmd_qs, self.res_q = name, [ctx.Queue() for _ in range(n)], ctx.Queue()
        self.procs = [
            ctx.Process(target=worker, args=(i, name, self.cmd_qs[i], self.res_q), daemon=True) for i in range(n)
        ]
        for p in self.procs:
            p.start()
        ready = [self.res_q.get(timeout=180) for _ in range(n)]
        self.errors = sorted({r["error"] for r in ready if not r["ready"]})
        self.pids = [r.get("pid") for r in sorted(ready, key=lambda r: r["idx"]) if r["ready"]]  # worker i = pids[i]

    def run(self, n, sset, seconds, seed, threads):
        t_start = time.time() + 1.2 + (1.5 if "2160" in str(sset["desc"]) else 0)
        for i in range(n):
            self.cmd_qs[i].put(
                {
                    "op": "clips",
                    "files": sset["files"],
                    "lengths": sset["lengths"],
                    "seconds": seconds,
                    "t_start": t_start,
                    "seed": seed,
                    "threads": threads,
                }
            )
        time.sleep(max(0.0, t_start - time.time()) + seconds / 2)
        util = smi("utilization.gpu,utilization.decoder,memory.used")
        apps = {int(a[0]): float(a[1]) for a in smi("pid,used_memory", apps=True) if a[0].isdigit()}
        res = [self.res_q.get(timeout=seconds + 30) for _ in range(n)]
        return res, util, apps

    def probe(self, files, lengths):
        self.cmd_qs[0].put({"op": "probe", "files": files, "lengths": lengths})
        return self.res_q.get(timeout=60)["probe"]

    def close(self):
        for q in self.cmd_qs:
            q.put(None)
        for p in self.procs:
            p.join(timeout=20)
            if p.is_alive():
                p.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root")
    ap.add_argument("--out", required=True)
    ap.add_argument("--probe", default="", help="folder of odd/broken videos: which decoder can cut a clip from which")
    ap.add_argument("--decoders", default=",".join(DECODERS))
    ap.add_argument("--workers", default="1,8,12")
    ap.add_argument("--seconds", type=float, default=2.5)
    ap.add_argument("--interference-set", default="h264_1080p")
    ap.add_argument("--inproc-sets", default="", help="sets for the one-process threaded PyNvVideoCodec measurement")
    ap.add_argument("--inproc-threads", default="1,2,4")
    ap.add_argument("--budget", type=float, default=520, help="stop starting new rows after this many seconds")
    a = ap.parse_args()
    t_begin = time.time()
    os.makedirs(a.out, exist_ok=True)
    ff = ffmpeg_libs_for_torchcodec()
    ctx = mp.get_context("spawn")
    sets = video_sets(a.root)
    workers = [int(x) for x in a.workers.split(",")]
    import torch

    env = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cores": CORES,
        "fflibs_for_torchcodec": ff,
        "gpu": smi("name,driver_version"),
        "argv": sys.argv,
    }
    for mod in ("cv2", "av", "PyNvVideoCodec", "torchcodec", "numpy"):
        try:
            m = __import__(mod)
            env[mod] = getattr(m, "__version__", "?")
        except Exception as e:
            env[mod] = f"not importable: {type(e).__name__}: {e}".splitlines()[0][:200]
    result = {
        "env": env,
        "sets": {k: v["desc"] for k, v in sets.items()},
        "rows": [],
        "interference": {},
        "probe": {},
        "pool_errors": {},
        "skipped": [],
    }
    print(json.dumps(env, indent=1), flush=True)
    probe_files = sorted(glob.glob(os.path.join(a.probe, "*"))) if a.probe else []
    probe_len = {}
    if probe_files:
        import cv2

        for f in probe_files:
            cap = cv2.VideoCapture(f)
            probe_len[f] = max(
                1, int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) if 0 < cap.get(cv2.CAP_PROP_FRAME_COUNT) < 1e7 else 60
            )
            cap.release()

    def save():
        with open(os.path.join(a.out, "decoders.json"), "w") as f:
            json.dump(result, f, indent=1)
        if "scrub_paths" in sys.modules:  # run as a script: its files say what ran, not where
            sys.modules["scrub_paths"].scrub_file(os.path.join(a.out, "decoders.json"))

    if "torchcodec" in a.decoders:
        result["torchcodec_load_error"] = torchcodec_load_error()
        print("torchcodec load:", result["torchcodec_load_error"] or "ok", flush=True)
    if a.inproc_sets:
        q = ctx.Queue()
        chosen = [(n, sets[n]) for n in a.inproc_sets.split(",") if n in sets]
        p = ctx.Process(target=inproc, args=(chosen, [int(k) for k in a.inproc_threads.split(",")], a.seconds + 1.0, q))
        p.start()
        try:
            result["inproc"] = q.get(timeout=300)
        except Exception as e:
            result["inproc"] = {"error": f"{type(e).__name__}: {e}"}
        p.join(timeout=20)
        save()
    # the training stand-in, alone
    counter, stop, go = ctx.Value("q", 0), ctx.Event(), ctx.Event()
    mm = ctx.Process(target=matmul_loop, args=(counter, stop, go), daemon=True)
    mm.start()
    for name in [d for d in a.decoders.split(",") if d]:
        if time.time() - t_begin > a.budget:
            result["skipped"].append(f"{name}: time budget")
            continue
        t0 = time.time()
        try:
            pool = Pool(name, max(workers), ctx)
        except Exception as e:
            result["pool_errors"][name] = f"{type(e).__name__}: {e}"
            save()
            continue
        print(f"== {name}: {len(pool.pids)} workers up in {time.time() - t0:.1f}s {pool.errors}", flush=True)
        if pool.errors:
            result["pool_errors"][name] = pool.errors
            pool.close()
            save()
            continue
        # interference: the matmul loop alone, then with this decoder on the interference set at 8 workers
        if a.interference_set in sets:
            go.set()
            time.sleep(1.0)
            base = matmul_rate(counter, 2.0)
            n = min(8, max(workers))
            rates = []

            def sample():
                time.sleep(2.5)
                rates.append(matmul_rate(counter, a.seconds - 1.0))

            import threading

            th = threading.Thread(target=sample)
            th.start()
            res, util, apps = pool.run(n, sets[a.interference_set], a.seconds + 1.0, 7, max(1, CORES // n))
            th.join()
            go.clear()
            clips = sum(r["count"] / r["wall"] for r in res if r["wall"] > 0)
            result["interference"][name] = {
                "set": a.interference_set,
                "workers": n,
                "matmul_tflops_alone": base,
                "matmul_tflops_with_decoder": rates[0] if rates else None,
                "decoder_clips_per_s_meanwhile": clips,
                "util": util,
            }
            print(
                f"   interference {a.interference_set} x{n}: matmul {base:.0f} -> {rates[0] if rates else float('nan'):.0f} TFLOP/s, decoder {clips:.1f} clips/s",
                flush=True,
            )
        broken = False
        for sname, sset in sets.items():
            for n in workers:
                if broken or time.time() - t_begin > a.budget:
                    result["skipped"].append(f"{name} {sname} x{n}: " + ("a worker died" if broken else "time budget"))
                    continue
                threads = max(1, CORES // n)
                try:
                    res, util, apps = pool.run(n, sset, a.seconds, n, threads)
                except Exception as e:
                    result["rows"].append(
                        {"decoder": name, "set": sname, "workers": n, "error": f"{type(e).__name__}: {e}"}
                    )
                    print(f"   {sname} x{n}: ERROR {e}", flush=True)
                    broken = True
                    continue
                wall = a.seconds
                row = {
                    "decoder": name,
                    "set": sname,
                    "workers": n,
                    "threads_each": threads,
                    "clips_per_s": sum(r["count"] / r["wall"] for r in res if r["wall"] > 0),
                    "clips": sum(r["count"] for r in res),
                    "fails": sum(r["fails"] for r in res),
                    "error": next((r["error"] for r in res if r["error"]), ""),
                    "cpu_cores": sum(r["cpu"] for r in res) / wall,
                    "torch_max_alloc_mib_per_worker": max((r.get("torch_max_alloc_mib", 0) for r in res), default=0),
                    "smi_mib_per_worker": max((apps.get(p, 0) for p in pool.pids[:n]), default=0),
                    "smi_mib_workers_total": sum(apps.get(p, 0) for p in pool.pids[:n]),
                    "gpu_util": util,
                }
                result["rows"].append(row)
                print(
                    f"   {sname} x{n} (t{threads}): {row['clips_per_s']:.1f} clips/s, {row['cpu_cores']:.1f} cores, "
                    f"fails {row['fails']} {row['error'][:80]}, smi {row['smi_mib_per_worker']:.0f} MiB/worker, util {util}",
                    flush=True,
                )
                save()
        if probe_files and not broken:
            try:
                result["probe"][name] = pool.probe(probe_files, probe_len)
            except Exception as e:
                result["probe"][name] = {"error": f"{type(e).__name__}: {e}"}
        pool.close()
        save()
    go.set()
    time.sleep(1.0)
    result["matmul_tflops_alone_end"] = matmul_rate(counter, 2.0)
    stop.set()
    mm.join(timeout=20)
    result["elapsed_s"] = time.time() - t_begin
    save()
    write_table(result, os.path.join(a.out, "decoders.md"))
    if "scrub_paths" in sys.modules:
        sys.modules["scrub_paths"].scrub_file(os.path.join(a.out, "decoders.md"))
    print(open(os.path.join(a.out, "decoders.md")).read(), flush=True)


def write_table(result, path):
    lines = [
        "| decoder | set | workers (threads each) | clips/s | CPU cores | GPU MiB/worker (smi; torch max) | GPU util % (SM, NVDEC) | fails |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if "clips_per_s" not in r:
            lines.append(f"| {r['decoder']} | {r['set']} | {r['workers']} | error: {r['error'][:80]} | | | | |")
            continue
        u = r["gpu_util"][0] if r["gpu_util"] else ["?", "?", "?"]
        mem = (
            f"{r['smi_mib_per_worker']:.0f}; {r['torch_max_alloc_mib_per_worker']:.0f}"
            if r["smi_mib_per_worker"]
            else "-"
        )
        lines.append(
            f"| {r['decoder']} | {r['set']} | {r['workers']} ({r['threads_each']}) | {r['clips_per_s']:.1f} | "
            f"{r['cpu_cores']:.1f} | {mem} | {u[0]}, {u[1]} | {r['fails']} {r['error'][:60]} |"
        )
    lines += [
        "",
        "| decoder | matmul TFLOP/s alone | with decoder (8 workers, 1080p H.264) | decoder clips/s meanwhile |",
        "|---|---|---|---|",
    ]
    for k, v in result["interference"].items():
        w = v["matmul_tflops_with_decoder"]
        lines.append(
            f"| {k} | {v['matmul_tflops_alone']:.0f} | {w:.0f} ({100 * (w / v['matmul_tflops_alone'] - 1):+.1f}%) | {v['decoder_clips_per_s_meanwhile']:.1f} |"
            if w
            else f"| {k} | {v['matmul_tflops_alone']:.0f} | ? | {v['decoder_clips_per_s_meanwhile']:.1f} |"
        )
    for k, v in result["pool_errors"].items():
        lines.append(f"\n{k}: not measured: {v}")
    if result["probe"]:
        lines += ["", "Probe (one clip from each odd/broken file):", ""]
        for k, v in result["probe"].items():
            lines.append(f"- {k}: " + "; ".join(f"{f}: {s}" for f, s in v.items()))
    ip = result.get("inproc") or {}
    if ip.get("rows"):
        lines += [
            "",
            f"PyNvVideoCodec in one process, K threads ({ip.get('stream_arg')}); matmul alone in that process: "
            f"{ip['matmul_alone']:.0f} TFLOP/s (end: {ip.get('matmul_alone_end', 0):.0f})",
            "",
            "| set | K threads | clips/s alone | CPU cores | clips/s beside matmul | matmul TFLOP/s meanwhile | torch max MiB | fails |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in ip["rows"]:
            lines.append(
                f"| {r['set']} | {r['threads']} | {r['clips_per_s']:.1f} | {r['cpu_cores']:.1f} | {r['clips_per_s_with_matmul']:.1f} | "
                f"{r['matmul_tflops_with']:.0f} | {r['torch_max_alloc_mib']:.0f} | {r['fails']} {r['error'][:60]} |"
            )
    elif ip:
        lines.append(f"\ninproc: {ip}")
    if result.get("torchcodec_load_error"):
        lines += ["", "torchcodec did not load:", "", "```", result["torchcodec_load_error"][-1500:], "```"]
    if result["skipped"]:
        lines.append("\nskipped: " + ", ".join(result["skipped"]))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import scrub_paths  # noqa: E402  (the evidence says what ran, not where: <repo>, <tmp>, <python>, ...)

    scrub_paths.scrub_stdio()
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
