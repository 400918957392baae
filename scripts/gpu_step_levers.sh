#!/usr/bin/env bash
# Issue 38 item 1: two levers for the step's share of the GPU and the interpreter at long-GOP 1080p, rows in one
# call (GPU machine, one H100, ~10 min):  bash scripts/gpu_step_levers.sh SRC_DIR
# scripts/gpu_gop.sh writes the sets and trains 480p then 1080p from their caches at the defaults; then 1080p with
# the step on a high-priority CUDA stream (TAEHV_STEP_PRIORITY=-5, the decode threads' streams keep the lowest),
# 1080p and 480p with compile_mode=reduce-overhead (CUDA graphs: fewer launches under the interpreter lock).
# TAEHV_STEP_PRIORITY was a measurement switch, never committed (run.py set the stream after the Trainer was
# built); the key step_stream_priority replaced it and is now the default (high), so at today's commit the
# gop rows here already run on the high-priority stream: scripts/gpu_step_priority.sh is the A/B.
set -uo pipefail
SRC=${1:?usage: bash scripts/gpu_step_levers.sh SRC_DIR}
OUT=${OUT:-/tmp/gpu_step}; W=${W:-/tmp/gop}; EXTRA_BY=${EXTRA_BY:-500}
. scripts/gpu_rows.sh
work_lock gpu_step_levers.sh "$SRC"
mkdir -p "$OUT"; start=$(date +%s)
LOADER=0 SETS="v480 v1080" OUT="$OUT" W="$W" bash scripts/gpu_gop.sh "$SRC" 2>&1 | grep -E "clips/s|exit|total"
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
ROW_ENV=TAEHV_STEP_PRIORITY
TAEHV_STEP_PRIORITY=-5 row cached_v1080_prio v1080
grep -h "step stream priority" "$OUT/cached_v1080_prio.log"
row cached_v1080_ro v1080 --set compile_mode=reduce-overhead
[ $(( $(date +%s) - start )) -lt "$EXTRA_BY" ] && row cached_v480_ro v480 --set compile_mode=reduce-overhead
for n in cached_v480 cached_v1080 cached_v1080_prio cached_v1080_ro cached_v480_ro; do
  row_line "$n"
done
echo "total $(( $(date +%s) - start )) s"
OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"
