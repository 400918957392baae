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
row() {  # NAME SET [extra --set ...]
  local name=$1 set=$2; shift 2
  python3 -m taehv_launch.cli 1 h100 --run-name "$name" --set data_root="'$W/$set'" \
    --set ref_vae_path="'$W/ref_vae_cogvideox_real_c16'" --set output_dir="'$W/output'" --set latent_cache="'$W/lc_$set'" \
    --set max_train_steps=40 --set log_every=5 --set gradient_accumulation_steps=1 --set validation_steps=100000 \
    --set checkpointing_steps=100000 --set lr_warmup_steps=1 "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $? after $(( $(date +%s) - start )) s"
  cp "$W/output/$name/speed.json" "$OUT/$name.speed.json" 2>/dev/null
}
row cached_v480_b v480
row cached_v1080_b v1080
[ $(( $(date +%s) - start )) -lt "$EXTRA_BY" ] && row cached_v480_t10 v480 --set video_decode_threads=10
for n in cached_v480 cached_v1080 cached_v480_b cached_v1080_b cached_v480_t10; do
  [ -f "$OUT/$n.speed.json" ] || continue
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('|', sys.argv[2], '|', round(d['clips_per_s'], 2), '|', \
round(d['peak_reserved_gib'], 1), '|')" "$OUT/$n.speed.json" "$n" | tee -a "$OUT/rows.md"
  grep -hoE "NVDEC decode threads: [0-9]+ threads" "$OUT/$n.log" | head -1
done
echo "total $(( $(date +%s) - start )) s"
OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"
