#!/usr/bin/env bash
# Issue 38 item 1's evidence on the GPU machine (one H100, 16 cores; ~7 minutes), from the repo root:
#   bash scripts/gpu_gop.sh SRC_DIR
# SRC_DIR: the sample videos scripts/make_bench_videos.py reads (../shared/testdata/videos here, which does not
# travel: copy its chaplin.mp4 smpte-2997.mp4 example2.mp4 fire2.mp4 big_buck_bunny_432_433.webm
# no_duration.webm into a carried folder). Carried beside it: .whl/ (scripts/gpu_check.sh's wheels),
# .whl-nv/nv.tar.xz (PyNvVideoCodec unpacked, as scripts/gpu_decode_bars.sh takes it) and PyAV for the video
# writer, as .whl-av/av-*.whl or unpacked in .whl-av/av.tar.xz (skipped where `import av` already works).
# It writes the long-GOP sets with x264's default keyframe interval (250 frames, as cameras write; no --gop):
#   480p  720x480,   16 files x 300 frames, crf 23 (the issue's)
#   1080p 1920x1080,  6 files x 150 frames, crf 18 (the issue's)
#   4K    3840x2160,  3 files x 150 frames, crf 18
# then per set: what the probe reads (size, keyframe interval), the loader alone (bench loader --decoder nvdec
# --workers 12 on 12 cores, threads chosen from the sources; on 1080p also 4 threads, the old default, and 14),
# and training from the latent cache at the default settings (h100 profile, compile all, 40 steps at
# accumulation 1, clips/s from speed.json; cache job: 2 views per video, compile none). Env: OUT (evidence
# folder), W (work folder), STEPS (40), BUDGET (seconds after which the 4K training row is skipped: 330),
# LOADER=0 (skip the loader-alone rows), THREADS_1080="10 14" (also train from the 1080p cache with these
# video_decode_threads, each its own row: cached_v1080_t<N>), SETS="v480 v1080" (the sets written), CACHE_ONLY=1
# (the sets and caches, no training row: for scripts that train their own rows).
set -uo pipefail
SRC=${1:?usage: bash scripts/gpu_gop.sh SRC_DIR (the sample videos make_bench_videos.py reads)}
OUT=${OUT:-/tmp/gpu_gop}; W=${W:-/tmp/gop}; STEPS=${STEPS:-40}; BUDGET=${BUDGET:-330}
LOADER=${LOADER:-1}; THREADS_1080=${THREADS_1080:-}; SETS=${SETS:-v480 v1080 v2160}
mkdir -p "$OUT" "$W"
trap 'OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"' EXIT  # evidence says what ran, not where: <repo>, <tmp>, ...
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
start=$(date +%s)
. scripts/gpu_rows.sh
device_site || exit 1
tl() { python3 -m taehv_launch.cli "$@"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, av, cv2, PyNvVideoCodec as n; print('torch', torch.__version__, 'pyav', av.__version__, \
'opencv', cv2.__version__, 'PyNvVideoCodec', getattr(n, '__version__', '?'), 'cores', len(__import__('os').sched_getaffinity(0)))" \
  | tee -a "$OUT/gpu.txt"

# 1. the sets, written side by side
M=scripts/make_bench_videos.py
want() { case " $SETS " in *" $1 "*) return 0;; esac; return 1; }
want v480 && python3 $M "$W/v480" 720 480 16 300 --src "$SRC" > "$OUT/make_480.log" 2>&1 &
want v1080 && python3 $M "$W/v1080" 1920 1080 6 150 --crf 18 --src "$SRC" > "$OUT/make_1080.log" 2>&1 &
want v2160 && python3 $M "$W/v2160" 3840 2160 3 150 --crf 18 --src "$SRC" > "$OUT/make_2160.log" 2>&1 &
wait
echo "sets written after $(( $(date +%s) - start )) s"; du -sh "$W"/v* | tee "$OUT/sets.txt"
for set in $SETS; do
  python3 -c "import sys; from taehv_launch.dataindex.sources import sample_sources; import glob; \
s = sample_sources(sorted(glob.glob(sys.argv[1] + '/*'))); print(sys.argv[2], s.line())" "$W/$set" "$set" \
    | tee -a "$OUT/sets.txt"
done

# 2. the loader alone: 12 DataLoader workers and the decode threads on 12 of the cores
PIN=""; command -v taskset > /dev/null && PIN="taskset -c 0-11" || echo "no taskset: the loader rows use every core"
loader() {  # SET NAME [--decode-threads N]
  local set=$1 name=$2; shift 2
  $PIN python3 -m taehv_launch.cli bench loader --data-root "$W/$set" --decoder nvdec --workers 12 \
    --seconds 6 --clips 16 --json "$@" > "$OUT/loader_$name.json" 2> "$OUT/loader_$name.log"
  echo "loader $name: exit $? after $(( $(date +%s) - start )) s"; grep -E "NVDEC decode threads|loader  nvdec" "$OUT/loader_$name.log"
}
if [ "$LOADER" = 1 ]; then
  loader v480 v480
  loader v1080 v1080
  loader v2160 v2160
  loader v1080 v1080_t4 --decode-threads 4
  loader v1080 v1080_t14 --decode-threads 14
fi

# 3. training from the latent cache at the default settings
REF=$W/ref_vae_cogvideox_real_c16
python3 - "$W" > "$OUT/ref.log" 2>&1 <<'PY'
import sys, torch
from pathlib import Path
from taehv_launch.bench.runs import make_assets
from taehv_launch.plan.schema import DEFAULTS
make_assets(dict(DEFAULTS), torch.device("cuda"), Path(sys.argv[1]), "/unused", print)
PY
cached() {  # SET [THREADS]: a cache of SET (once), then training from it (threads: video_decode_threads)
  local set=$1 name=cached_$1 extra=() common=(--set data_root="'$W/$1'" --set ref_vae_path="'$REF'" --set output_dir="'$W/output'")
  if [ -n "${2:-}" ]; then name=cached_${1}_t$2; extra=(--set video_decode_threads=$2); fi
  if [ ! -d "$W/lc_$set" ]; then
    tl cache 1 h100 --views 2 --run-name "cache_$set" --set latent_cache="'$W/lc_$set'" --set compile="'none'" \
      "${common[@]}" > "$OUT/cache_$set.log" 2>&1
    echo "cache $set: exit $? after $(( $(date +%s) - start )) s"
  fi
  [ "${CACHE_ONLY:-0}" = 1 ] && return 0
  tl 1 h100 --run-name "$name" "${common[@]}" "${extra[@]}" --set latent_cache="'$W/lc_$set'" --set max_train_steps=$STEPS \
    --set log_every=5 --set gradient_accumulation_steps=1 --set validation_steps=100000 \
    --set checkpointing_steps=100000 --set lr_warmup_steps=1 > "$OUT/$name.log" 2>&1
  echo "train $name: exit $? after $(( $(date +%s) - start )) s"
  grep -E "^data|decod|error|Error" "$OUT/$name.log" | head -6
  cp "$W/output/$name/speed.json" "$OUT/$name.speed.json" 2>/dev/null
  python3 -c "import json,sys; print('$name', round(json.load(open(sys.argv[1]))['clips_per_s'], 2), 'clips/s')" \
    "$OUT/$name.speed.json" 2>/dev/null
}
want v480 && cached v480  # only the sets this call wrote (a missing cache would be one error row)
want v1080 && cached v1080
for t in $THREADS_1080; do cached v1080 "$t"; done
if ! want v2160; then :; elif [ $(( $(date +%s) - start )) -lt "$BUDGET" ]; then cached v2160; else echo "4K training skipped: past BUDGET=$BUDGET s"; fi

# 4. the table
python3 - "$OUT" <<'PY' | tee "$OUT/table.md"
import json, re, sys
from pathlib import Path
out = Path(sys.argv[1])
def load(p):
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None
sets = dict(l.split(" ", 1) for l in (out / "sets.txt").read_text().splitlines() if l.startswith("v"))
base = (load(out / "cached_v480.speed.json") or {}).get("clips_per_s")
print("| sources | probe | loader alone: NVDEC threads | clips/s | CPU cores | training from the cache: clips/s | vs 480p | trainer's threads |")
print("|---|---|---|---|---|---|---|---|")
for name, set in (("v480", "v480"), ("v1080", "v1080"), ("v1080_t4", "v1080"), ("v1080_t14", "v1080"), ("v2160", "v2160")):
    doc = load(out / f"loader_{name}.json")
    row = next((r for r in (doc or {}).get("rows", []) if r.get("decoder") == "nvdec"), {})
    speed = load(out / f"cached_{set}.speed.json") if name == set else None
    clips = speed.get("clips_per_s") if speed else None
    log = out / f"cached_{set}.log"
    m = re.search(r"NVDEC decode threads: (\d+) threads", log.read_text()) if name == set and log.exists() else None
    cells = [
        set[1:] + "p" + ("" if name == set else ", threads as set"),
        sets.get(set, "?").split(" (")[0],
        f"{row.get('threads', '?')} ({row.get('threads_how', '?')})",
        f"{row['clips_per_s']:.1f}" if row else "-",
        f"{row['cpu_cores']:.1f}" if row else "-",
        f"{clips:.2f}" if clips else "-",
        f"{clips / base:.3f}" if clips and base else "-",
        m.group(1) if m else "-",
    ]
    print("| " + " | ".join(cells) + " |")
PY
echo "total $(( $(date +%s) - start )) s"
