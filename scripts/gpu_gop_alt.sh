#!/usr/bin/env bash
# Issue 38 item 1, long-GOP 1080p against 480p from the latent cache at the default settings, rows alternating
# in one call (GPU machine, one H100, ~9 min):  bash scripts/gpu_gop_alt.sh SRC_DIR
# scripts/gpu_gop.sh writes the sets and trains 480p then 1080p (LOADER=0 SETS="v480 v1080"); this script then
# trains 480p and 1080p once more (runs cached_v480_b, cached_v1080_b) and, while the call has time (EXTRA_BY s,
# default 470), 480p with video_decode_threads=10 (is 480p itself held back by its decode?). Evidence in OUT.
set -uo pipefail
SRC=${1:?usage: bash scripts/gpu_gop_alt.sh SRC_DIR}
OUT=${OUT:-/tmp/gpu_gop}; W=${W:-/tmp/gop}; EXTRA_BY=${EXTRA_BY:-470}
mkdir -p "$OUT"; start=$(date +%s)
LOADER=0 SETS="v480 v1080" OUT="$OUT" W="$W" bash scripts/gpu_gop.sh "$SRC" 2>&1 | grep -E "clips/s|exit|total"
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
. scripts/gpu_rows.sh
row cached_v480_b v480
row cached_v1080_b v1080
[ $(( $(date +%s) - start )) -lt "$EXTRA_BY" ] && row cached_v480_t10 v480 --set video_decode_threads=10
for n in cached_v480 cached_v1080 cached_v480_b cached_v1080_b cached_v480_t10; do
  row_line "$n" || continue
  grep -hoE "NVDEC decode threads: [0-9]+ threads" "$OUT/$n.log" | head -1
done
echo "total $(( $(date +%s) - start )) s"
OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"
