#!/usr/bin/env bash
# Issue 38 item 1: the clip kernel (train/data/nv12.py nv12_clip: NV12 -> the clip's RGB pixels, crop, resize and
# flip in one Triton kernel a frame, the default) against the colour kernel followed by finish()'s torch ops
# (TAEHV_NV12=frame, the path before it), training from the long-GOP 1080p and 480p caches, rows alternating in one
# call (GPU machine, one H100, ~10 min):  bash scripts/gpu_clip_ab.sh SRC_DIR
# scripts/gpu_gop.sh writes the sets and trains 480p then 1080p at the defaults (LOADER=0 SETS="v480 v1080");
# scripts/gpu_nv12_check.py compares both paths on real NVDEC surfaces and times them; then 1080p with
# TAEHV_NV12=frame, 480p and 1080p at the defaults again, and (while the call has time, EXTRA_BY s, default 500)
# 1080p with TAEHV_NV12=frame once more. Evidence in OUT.
set -uo pipefail
SRC=${1:?usage: bash scripts/gpu_clip_ab.sh SRC_DIR}
OUT=${OUT:-/tmp/gpu_clip}; W=${W:-/tmp/gop}; EXTRA_BY=${EXTRA_BY:-500}
. scripts/gpu_rows.sh
work_lock gpu_clip_ab.sh "$SRC"
mkdir -p "$OUT"; start=$(date +%s)
LOADER=0 SETS="v480 v1080" OUT="$OUT" W="$W" bash scripts/gpu_gop.sh "$SRC" 2>&1 | grep -E "clips/s|exit|total"
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
python3 scripts/gpu_nv12_check.py "$W/v1080" "$W/v480" "$SRC" > "$OUT/nv12_check.txt" 2>&1
echo "nv12 check: exit $? after $(( $(date +%s) - start )) s"; grep -E "^torch|clip kernel|^clips|total" "$OUT/nv12_check.txt"
ROW_ENV=TAEHV_NV12  # each row says the path it ran with
TAEHV_NV12=frame row cached_v1080_frame v1080
row cached_v480_b v480
row cached_v1080_b v1080
[ $(( $(date +%s) - start )) -lt "$EXTRA_BY" ] && TAEHV_NV12=frame row cached_v1080_frame_b v1080
for n in cached_v480 cached_v1080 cached_v1080_frame cached_v480_b cached_v1080_b cached_v1080_frame_b; do
  row_line "$n" || continue
  grep -hoE "decoding training clips on the GPU \([^)]*\)" "$OUT/$n.log" | head -1
done
echo "total $(( $(date +%s) - start )) s"
OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"
