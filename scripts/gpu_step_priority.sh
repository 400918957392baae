#!/usr/bin/env bash
# Issue 38 item 1: the step on the highest-priority CUDA stream (step_stream_priority=high, the default) against
# the default stream (step_stream_priority=default), long-GOP 1080p and 480p from the latent cache, rows
# alternating in one call (GPU machine, one H100, ~10 min):  bash scripts/gpu_step_priority.sh SRC_DIR
# scripts/gpu_gop.sh writes the sets and trains 480p then 1080p at the defaults (LOADER=0 SETS="v480 v1080");
# then 1080p on the default stream, 480p and 1080p at the defaults again, and (while the call has time, EXTRA_BY s,
# default 515) 480p on the default stream. Evidence in OUT.
set -uo pipefail
SRC=${1:?usage: bash scripts/gpu_step_priority.sh SRC_DIR}
OUT=${OUT:-/tmp/gpu_prio}; W=${W:-/tmp/gop}; EXTRA_BY=${EXTRA_BY:-515}
. scripts/gpu_rows.sh
work_lock gpu_step_priority.sh "$SRC"
mkdir -p "$OUT"; start=$(date +%s)
LOADER=0 SETS="v480 v1080" OUT="$OUT" W="$W" bash scripts/gpu_gop.sh "$SRC" 2>&1 | grep -E "clips/s|exit|total"
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
row cached_v1080_dflt v1080 --set step_stream_priority=default
row cached_v480_b v480
row cached_v1080_b v1080
[ $(( $(date +%s) - start )) -lt "$EXTRA_BY" ] && row cached_v480_dflt v480 --set step_stream_priority=default
for n in cached_v480 cached_v1080 cached_v1080_dflt cached_v480_b cached_v1080_b cached_v480_dflt; do
  row_line "$n" || continue
  grep -hoE "the step on [^:(]*" "$OUT/$n.log" | head -1
done
echo "total $(( $(date +%s) - start )) s"
OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"
