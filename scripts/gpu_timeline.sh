#!/usr/bin/env bash
# Issue 38 item 1: the step's GPU timeline from the latent cache, long-GOP 1080p against 480p sources (one H100,
# ~7 min), from the repo root:   bash scripts/gpu_timeline.sh SRC_DIR
# The sets and caches of gpu_gop.sh (CACHE_ONLY=1), then per row (prof_v1080, prof_v480) STEPS steps (40) at the
# h100 defaults with --profile (profile_steps 20: steps 3-22 traced); scripts/trace_kernels.py --skip 5 reads
# steps 8-22: per CUDA stream busy time, the step's stream idle, the stepping thread's GPU waits and launches, the
# top kernels, the other threads' CUDA API calls (<row>.kernels.md). Everything in OUT/timeline.tgz (the device
# returns at most 8 files, 16 MiB each); the gzipped traces (larger) stay in W.
set -uo pipefail
SRC=${1:?usage: bash scripts/gpu_timeline.sh SRC_DIR}
OUT=${OUT:-/tmp/gpu_timeline}; W=${W:-/tmp/gop}; STEPS=${STEPS:-40}; TRACED=${TRACED:-20}
. scripts/gpu_rows.sh
call_start gpu_timeline.sh "$SRC" timeline
cached_sets "$SRC"
for r in "prof_v1080 v1080" "prof_v480 v480"; do
  set -- $r
  rm -rf "$W/output/$1"
  row "$1" "$2" --set max_train_steps="$STEPS" --profile --set profile_steps="$TRACED"
  row_line "$1"
  trace=$(ls "$W/output/$1/logs/profile/"*.json 2>/dev/null | head -1)
  if [ -n "$trace" ]; then
    python3 scripts/trace_kernels.py "$trace" --skip 5 --top 25 > "$OUT/$1.kernels.md" 2>&1
    grep -E "traced steps|step's stream" "$OUT/$1.kernels.md"; sed -n '/| CUDA stream/,/^$/p' "$OUT/$1.kernels.md" | head -8
    gzip -c "$trace" > "$W/$1.trace.json.gz"  # not in OUT: over the 16 MiB a file the device returns
  fi
  grep -A9 "where a step" "$OUT/$1.log" | head -10
done
echo "total $(( $(date +%s) - start )) s"
