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
row() {  # NAME SRC_TREE
  local name=$1
  [ $(( $(date +%s) - start )) -lt "$ROWS_BY" ] || { echo "$name skipped: past ROWS_BY"; return; }
  PYTHONPATH=/tmp/site:$2 python3 -m taehv_launch.cli 1 h100 --run-name "$name" --set data_root="'$W/v1080'" \
    --set ref_vae_path="'$W/ref_vae_cogvideox_real_c16'" --set output_dir="'$W/output'" --set latent_cache="'$W/lc_v1080'" \
    --set max_train_steps=40 --set log_every=5 --set gradient_accumulation_steps=1 --set validation_steps=100000 \
    --set checkpointing_steps=100000 --set lr_warmup_steps=1 > "$OUT/$name.log" 2>&1
  echo "$name: exit $? after $(( $(date +%s) - start )) s"
  cp "$W/output/$name/speed.json" "$OUT/$name.speed.json" 2>/dev/null
}
row cached_v1080_old "$OLD_SRC"
row cached_v1080_new2 "$PWD/src"
row cached_v1080_old2 "$OLD_SRC"
for n in cached_v1080 cached_v1080_old cached_v1080_new2 cached_v1080_old2; do
  [ -f "$OUT/$n.speed.json" ] || continue
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('|', sys.argv[2], '|', round(d['clips_per_s'], 2), '|', \
round(d['peak_reserved_gib'], 1), '|')" "$OUT/$n.speed.json" "$n" | tee -a "$OUT/rows.md"
  grep -hoE "NVDEC decode threads: [0-9]+ threads" "$OUT/$n.log" | head -1
done
echo "total $(( $(date +%s) - start )) s"
OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"
