#!/usr/bin/env bash
# Issue 38 item 1, with the step on the high-priority stream: does long-GOP 1080p wait on its clips? Rows in one
# call (GPU machine, one H100, ~8 min):  bash scripts/gpu_decode_depth.sh SRC_DIR
# First scripts/gpu_nv12_check.py on SRC_DIR's videos (NVDEC's pitched surfaces and random frames up to 4K against
# the torch ops). Then scripts/gpu_gop.sh writes the 1080p set and trains from its cache at the defaults
# (LOADER=0 SETS=v1080: 3 batches decoding ahead, the threads chosen); then 6 batches ahead (TAEHV_DECODE_DEPTH,
# a measurement switch of commit 56adf80, reverted after this call: no gain; run the script there to reproduce
# that row), 8 decode threads, and (while the call has time, EXTRA_BY s, default 450) the
# defaults again. Evidence in OUT.
set -uo pipefail
SRC=${1:?usage: bash scripts/gpu_decode_depth.sh SRC_DIR}
OUT=${OUT:-/tmp/gpu_depth}; W=${W:-/tmp/gop}; EXTRA_BY=${EXTRA_BY:-450}
. scripts/gpu_rows.sh
work_lock gpu_decode_depth.sh "$SRC"
mkdir -p "$OUT"; start=$(date +%s)
device_site || exit 1
timeout 120 python3 scripts/gpu_nv12_check.py "$SRC" > "$OUT/nv12_check.txt" 2>&1
echo "nv12 check: exit $? after $(( $(date +%s) - start )) s"; tail -8 "$OUT/nv12_check.txt"
LOADER=0 SETS="v1080" OUT="$OUT" W="$W" bash scripts/gpu_gop.sh "$SRC" 2>&1 | grep -E "clips/s|exit|total"
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
ROW_ENV=TAEHV_DECODE_DEPTH
TAEHV_DECODE_DEPTH=6 row cached_v1080_d6 v1080
row cached_v1080_t8 v1080 --set video_decode_threads=8
[ $(( $(date +%s) - start )) -lt "$EXTRA_BY" ] && row cached_v1080_b v1080
for n in cached_v1080 cached_v1080_d6 cached_v1080_t8 cached_v1080_b; do
  row_line "$n"
done
echo "total $(( $(date +%s) - start )) s"
OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"
