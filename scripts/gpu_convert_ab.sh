#!/usr/bin/env bash
# Issue 38 item 1, one lever on its own rows: the NV12->RGB conversion of a clip's frames in one stack (this
# tree) against one frame at a time (OLD_SRC, default .snap/src: `git archive <commit> src | tar -x -C .snap`),
# training from the cache on long-GOP 1080p at the default settings, rows alternating (GPU machine, ~7 min):
#   bash scripts/gpu_convert_ab.sh SRC_DIR
# scripts/gpu_gop.sh writes the 1080p set, its cache and the first row (this tree); then OLD, NEW, OLD while the
# call has time (ROWS_BY s, default 400). Evidence in OUT.
set -uo pipefail
SRC=${1:?usage: bash scripts/gpu_convert_ab.sh SRC_DIR}
OUT=${OUT:-/tmp/gpu_gop}; W=${W:-/tmp/gop}; ROWS_BY=${ROWS_BY:-400}; OLD_SRC=${OLD_SRC:-$PWD/.snap/src}
mkdir -p "$OUT"; start=$(date +%s)
LOADER=0 SETS="v1080" OUT="$OUT" W="$W" bash scripts/gpu_gop.sh "$SRC" 2>&1 | grep -E "clips/s|exit|total"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
. scripts/gpu_rows.sh
ab() {  # NAME SRC_TREE: a long-GOP 1080p row with the trainer of SRC_TREE, while the call has time (ROWS_BY)
  [ $(( $(date +%s) - start )) -lt "$ROWS_BY" ] || { echo "$1 skipped: past ROWS_BY"; return; }
  PYTHONPATH=/tmp/site:$2 row "$1" v1080
}
ab cached_v1080_old "$OLD_SRC"
ab cached_v1080_new2 "$PWD/src"
ab cached_v1080_old2 "$OLD_SRC"
for n in cached_v1080 cached_v1080_old cached_v1080_new2 cached_v1080_old2; do
  row_line "$n" || continue
  grep -hoE "NVDEC decode threads: [0-9]+ threads" "$OUT/$n.log" | head -1
done
echo "total $(( $(date +%s) - start )) s"
OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"
