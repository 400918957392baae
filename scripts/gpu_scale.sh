#!/usr/bin/env bash
# Weak scaling 1 -> 2 GPUs and ZeRO-2 vs plain DDP (zero_stage=0), on the 2 x H200 machine from the
# repo root (wheels installed as in scripts/gpu_check.sh; videos in .benchdata/ from
# scripts/make_bench_videos.py). The h200 profile as users run it (micro 16, Seraena crop 256; compile
# 'all' since 2026-11-24, 'reference' in the rows of 11-23), accumulation 1 so that every micro-batch
# pays its gradient reduction.
#   bash scripts/gpu_scale.sh online   -> 1 GPU ZeRO-2, 2 GPUs ZeRO-2, 2 GPUs DDP; CogVideoX encode online
#   bash scripts/gpu_scale.sh cached   -> a 2-view latent cache on 2 GPUs, then the same three rows from it
#   bash scripts/gpu_scale.sh one      -> 1 GPU: compile='reference' (the old default) vs the default 'all'
# Each row prints its speed.json (steady state: steps 11..STEPS; clips_per_s_per_gpu).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_scale}; W=${W:-/tmp/bc}; STEPS=${STEPS:-24}; mkdir -p "$OUT" "$W"
trap 'OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"' EXIT  # evidence says what ran, not where: <repo>, <tmp>, ...
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
tl() { python3 -c 'from taehv_launch.cli import main; main()' "$@"; }
REF=$W/ref_vae_cogvideox_real_c16
python3 - "$W" <<'PY'
import sys, torch
from pathlib import Path
from taehv_launch.bench.runs import make_assets
from taehv_launch.plan.schema import DEFAULTS
make_assets(dict(DEFAULTS), torch.device("cuda"), Path(sys.argv[1]), ".benchdata/v480", print)
PY
common=(--set data_root="'.benchdata/v480'" --set ref_vae_path="'$REF'"
        --set output_dir="'$W/output'" --set gradient_accumulation_steps=1 --set max_train_steps=$STEPS
        --set log_every=5 --set validation_steps=100000 --set checkpointing_steps=100000 --set lr_warmup_steps=1)
row() {  # NAME GPUS [--set ...]
  name=$1 gpus=$2; shift 2
  timeout 280 python3 -c 'from taehv_launch.cli import main; main()' "$gpus" h200 --run-name "$name" "${common[@]}" "$@" \
    > "$OUT/$name.log" 2>&1; echo "row $name ($gpus GPUs $*): exit $?"
  grep -E "^step|error" "$OUT/$name.log" | tail -3
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: d.get(k) for k in ('clips_per_s','clips_per_s_per_gpu','world_size','from_step','steps','peak_allocated_gib','min_free_gib')})" \
    "$W/output/$name/speed.json" 2>&1 | tail -1
  cp "$W/output/$name/speed.json" "$OUT/$name.speed.json" 2>/dev/null
}
case "$1" in
  one)    row one_reference 1 --set compile="'reference'"; row one_all 1 ;;
  online) row online_1_z2 1; row online_2_z2 2; row online_2_ddp 2 --set zero_stage=0 ;;
  cached) tl cache 2 h200 --views 2 --run-name cache2 --set latent_cache="'$W/lc2'" "${common[@]:0:6}" \
            > "$OUT/cache2.log" 2>&1; echo "cache: exit $?"; grep "^cache:" "$OUT/cache2.log" | tail -2
          row cached_1_z2 1 --set latent_cache="'$W/lc2'"; row cached_2_z2 2 --set latent_cache="'$W/lc2'"
          row cached_2_ddp 2 --set latent_cache="'$W/lc2'" --set zero_stage=0 ;;
esac
