#!/usr/bin/env bash
# Issue 38 item 1 with nvdec_skip (non-reference pictures outside the clip not decoded), GPU machine, ~8 min:
#   bash scripts/gpu_gop_skip.sh SRC_DIR
# 1. scripts/gpu_gop.sh's training rows from the cache (LOADER=0, SETS="v480 v1080": 480p and long-GOP 1080p at
#    the default settings, the new path on); 2. the 1080p row again with TAEHV_NVDEC_SKIP=0 (SimpleDecoder for
#    every clip, as before); 3. scripts/nvdec_skip_check.py: the same RGB clips with the path on and off on both
#    sets and the H.264 files of SRC_DIR, and clips/s of 12 decode threads each way. Evidence in OUT.
set -uo pipefail
SRC=${1:?usage: bash scripts/gpu_gop_skip.sh SRC_DIR}
OUT=${OUT:-/tmp/gpu_gop}; W=${W:-/tmp/gop}
mkdir -p "$OUT"
mark() { echo "$(date +%H:%M:%S) $*" | tee -a "$OUT/marks.txt"; }
mark "training rows, skip on"
LOADER=0 SETS="v480 v1080" OUT="$OUT" W="$W" bash scripts/gpu_gop.sh "$SRC" 2>&1 | grep -vE "^\|" | tail -n 14
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
mark "1080p training row, skip off"
REF=$W/ref_vae_cogvideox_real_c16
TAEHV_NVDEC_SKIP=0 python3 -m taehv_launch.cli 1 h100 --run-name cached_v1080_noskip --set data_root="'$W/v1080'" \
  --set ref_vae_path="'$REF'" --set output_dir="'$W/output'" --set latent_cache="'$W/lc_v1080'" --set max_train_steps=40 \
  --set log_every=5 --set gradient_accumulation_steps=1 --set validation_steps=100000 \
  --set checkpointing_steps=100000 --set lr_warmup_steps=1 > "$OUT/cached_v1080_noskip.log" 2>&1
echo "exit $?"; cp "$W/output/cached_v1080_noskip/speed.json" "$OUT/cached_v1080_noskip.speed.json"
for n in cached_v480 cached_v1080 cached_v1080_noskip; do
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], round(d['clips_per_s'], 2), 'clips/s', \
round(d['peak_reserved_gib'], 1), 'GiB reserved')" "$OUT/$n.speed.json" "$n" | tee -a "$OUT/rows.txt"
  grep -hE "NVDEC decode threads" "$OUT/$n.log" | head -1 | cut -c1-160
done
mark "frame check and decode rates"
mkdir -p "$W/h264" && cp "$SRC"/chaplin.mp4 "$SRC"/example2.mp4 "$SRC"/fire2.mp4 "$SRC"/smpte-2997.mp4 "$W/h264/" 2>/dev/null
python3 scripts/nvdec_skip_check.py "$W/v1080" "$W/v480" "$W/h264" --clips 20 --threads 12 --seconds 6 \
  2>&1 | tee "$OUT/skip_check.jsonl" | grep -v '"file"'
echo "check exit ${PIPESTATUS[0]}"; grep -c '"differing": 0' "$OUT/skip_check.jsonl"
mark "end"
OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"
