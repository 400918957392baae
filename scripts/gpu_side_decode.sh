#!/usr/bin/env bash
# Issue 38 item 1: would NVDEC in a process of its own free the step? (GPU machine, one H100, ~9 min):
#   bash scripts/gpu_side_decode.sh SRC_DIR
# scripts/gpu_gop.sh writes the sets and trains 480p then 1080p from their caches (LOADER=0 SETS="v480 v1080");
# then 480p training rows beside a second process (scripts/gpu_side_load.py) cutting long-GOP 1080p clips at
# RATE clips/s (default 24, what 1080p training takes) with 11 threads: NVDEC only, then as the trainer cuts
# them (NV12 kernel, crop, resize) in that process's own CUDA context; then 480p and 1080p alone again.
# 480p beside the side load near 480p alone says the interpreter lock shared in-process is what costs 1080p.
set -uo pipefail
SRC=${1:?usage: bash scripts/gpu_side_decode.sh SRC_DIR}
OUT=${OUT:-/tmp/gpu_side}; W=${W:-/tmp/gop}; RATE=${RATE:-24}; EXTRA_BY=${EXTRA_BY:-500}
. scripts/gpu_rows.sh
work_lock gpu_side_decode.sh "$SRC"
mkdir -p "$OUT"; start=$(date +%s)
LOADER=0 SETS="v480 v1080" OUT="$OUT" W="$W" bash scripts/gpu_gop.sh "$SRC" 2>&1 | grep -E "clips/s|exit|total"
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
beside() {  # MODE NAME: a 480p row with the side load running
  python3 scripts/gpu_side_load.py "$W/v1080" "$1" "$RATE" 11 > "$OUT/side_$2.txt" 2>&1 &
  local pid=$!; sleep 6
  row "$2" v480
  kill -TERM $pid; wait $pid; cat "$OUT/side_$2.txt"
}
beside nvdec cached_v480_side_nvdec
beside trainer cached_v480_side_trainer
row cached_v480_b v480
[ $(( $(date +%s) - start )) -lt "$EXTRA_BY" ] && row cached_v1080_b v1080
for n in cached_v480 cached_v1080 cached_v480_side_nvdec cached_v480_side_trainer cached_v480_b cached_v1080_b; do
  row_line "$n"
done
echo "total $(( $(date +%s) - start )) s"
OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"
