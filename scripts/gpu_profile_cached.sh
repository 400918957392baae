#!/usr/bin/env bash
# #38 item 3: where the step from the latent cache spends the GPU's time, and levers side by side. One device
# call (~8 minutes), from the repo root, .whl/ carried:
#   LEVERS="cudnn_benchmark=True" bash scripts/gpu_profile_cached.sh
# 1. scripts/gpu_levers.sh with LEVERS (the naive pipeline, the cache job, today's default from the cache, one row
#    per lever; DEADLINE seconds, default 400), into $OUT/levers.
# 2. The real trainer from that cache with --profile (profile_steps=3 after 2 warm steps; compile 'all' as the
#    default row, its Inductor cache warm from step 1), once per line of PROFILE_SETS ("-" = the defaults), while
#    the call has PROFILE_S seconds for it; scripts/trace_kernels.py reads each trace: GPU busy/idle per step, kernel
#    time by kind and the top kernels ($OUT/kernels_<i>.md; the traces gzipped in $OUT/traces.tgz when under 15 MiB).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_profile}; W=${W:-/tmp/blv}; mkdir -p "$OUT" "$W"
LEVERS=${LEVERS:-cudnn_benchmark=True}; DEADLINE=${DEADLINE:-400}; PROFILE_S=${PROFILE_S:-120}
PROFILE_SETS=${PROFILE_SETS:-"-"}
OUT="$OUT/levers" W="$W" LEVERS="$LEVERS" DEADLINE="$DEADLINE" bash scripts/gpu_levers.sh
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
cache="$W/latent-cache"; data="$W/videos_480x720"; ref=$(ls -d "$W"/ref_vae_*_real_* 2>/dev/null | head -1)
if [ ! -f "$cache/manifest.json" ] || [ -z "$ref" ]; then echo "gpu_profile: no cache or reference VAE in $W"; exit 1; fi
i=0
while IFS= read -r sets; do
  [ -z "${sets// }" ] && continue
  i=$(( i + 1 )); left=$(( 590 - SECONDS ))
  if (( left < PROFILE_S / 2 )); then echo "gpu_profile: ${left}s left: profile $i ($sets) not run"; continue; fi
  extra=(); [ "$sets" != "-" ] && for s in $sets; do extra+=(--set "$s"); done
  name="prof$i"; rm -rf "$W/output/$name"
  echo "gpu_profile: run $i ($sets) with ${left}s left"
  timeout -k 5 $(( left < PROFILE_S ? left : PROFILE_S )) python3 -m taehv_launch.cli 1 h100 --run-name "$name" \
    --set "data_root='$data'" --set "ref_vae_path='$ref'" --set "latent_cache='$cache'" \
    --set max_train_steps=8 --set log_every=2 --set validation_steps=8 --set checkpointing_steps=8 \
    --set lr_warmup_steps=1 --set max_restarts=0 --set gradient_accumulation_steps=1 --set max_validation_batches=1 \
    --set compile=all --set "output_dir='$W/output'" "${extra[@]}" --profile --set profile_steps=3 \
    > "$OUT/profile_$i.log" 2>&1
  echo "profile $i: exit $? after ${SECONDS}s" | tee -a "$OUT/profile_$i.log"
  trace=$(ls "$W/output/$name/logs/profile/"*.json 2>/dev/null | head -1)
  if [ -n "$trace" ]; then
    { echo "profile $i: --set $sets"; python3 scripts/trace_kernels.py "$trace" --top 30; } > "$OUT/kernels_$i.md" 2>&1
    head -n 16 "$OUT/kernels_$i.md"
    mkdir -p /tmp/traces && gzip -c "$trace" > "/tmp/traces/profile_$i.json.gz"
  fi
done <<< "$PROFILE_SETS"
if [ -d /tmp/traces ] && (( $(du -sm /tmp/traces | cut -f1) < 15 )); then tar -czf "$OUT/traces.tgz" -C /tmp/traces .; fi
tar -czf /tmp/levers.tgz -C "$OUT" levers && rm -rf "$OUT/levers" && mv /tmp/levers.tgz "$OUT/"
OUT="$OUT" python3 scripts/scrub_paths.py "$OUT" > /dev/null 2>&1
exit 0
