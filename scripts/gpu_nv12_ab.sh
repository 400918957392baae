#!/usr/bin/env bash
# Issue 38 item 1: the NV12 -> RGB conversion in one Triton kernel (train/data/nv12.py) against the torch
# reference (TAEHV_NV12=torch), training from the long-GOP 1080p cache, rows alternating in one call
# (GPU machine, one H100, ~9 min):  bash scripts/gpu_nv12_ab.sh SRC_DIR
# scripts/gpu_gop.sh writes the sets and trains 480p then 1080p with the kernel (LOADER=0 SETS="v480 v1080");
# scripts/gpu_nv12_check.py compares both conversions byte for byte on real NVDEC surfaces and times them;
# then 1080p with the reference, with the kernel, with the reference again, and (while the call has time,
# EXTRA_BY s, default 480) 480p once more. Evidence in OUT.
set -uo pipefail
SRC=${1:?usage: bash scripts/gpu_nv12_ab.sh SRC_DIR}
OUT=${OUT:-/tmp/gpu_nv12}; W=${W:-/tmp/gop}; EXTRA_BY=${EXTRA_BY:-480}
. scripts/gpu_rows.sh
work_lock gpu_nv12_ab.sh "$SRC"
mkdir -p "$OUT"; start=$(date +%s)
LOADER=0 SETS="v480 v1080" OUT="$OUT" W="$W" bash scripts/gpu_gop.sh "$SRC" 2>&1 | grep -E "clips/s|exit|total"
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
python3 scripts/gpu_nv12_check.py "$W/v1080" "$W/v480" "$SRC" > "$OUT/nv12_check.txt" 2>&1
echo "nv12 check: exit $? after $(( $(date +%s) - start )) s"; grep -E "^torch|time|total" "$OUT/nv12_check.txt"
ROW_ENV=TAEHV_NV12  # each row says the conversion it ran with
TAEHV_NV12=torch row cached_v1080_torch v1080
row cached_v1080_b v1080
TAEHV_NV12=torch row cached_v1080_torch_b v1080
[ $(( $(date +%s) - start )) -lt "$EXTRA_BY" ] && row cached_v480_b v480
for n in cached_v480 cached_v1080 cached_v1080_torch cached_v1080_b cached_v1080_torch_b cached_v480_b; do
  row_line "$n"
done
echo "total $(( $(date +%s) - start )) s"
OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"
