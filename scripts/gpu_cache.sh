#!/usr/bin/env bash
# Latent-cache evidence for docs/benchmarks.md, on the GPU machine from the repo root (wheels installed
# as in scripts/gpu_check.sh; videos in .benchdata/ from scripts/make_bench_videos.py).
#   bash scripts/gpu_cache.sh   -> cache throughput at 8 views/video, training from the cache with TAEHV
#                                  compiled, and a --profile run from the cache (phases)
set -uo pipefail
OUT=${OUT:-/tmp/gpu_cache}; W=${W:-/tmp/bc}; mkdir -p "$OUT" "$W"
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
common=(--set data_root="'.benchdata/v480'" --set ref_vae_path="'$REF'" --set output_dir="'$W/output'")
tl cache 1 h100 --views 8 --run-name cache8 --set latent_cache="'$W/lc8'" "${common[@]}" > "$OUT/cache8.log" 2>&1
echo "cache: exit $?"; grep "^cache:" "$OUT/cache8.log" | tail -2; cat "$W/output/cache8/cache_speed.json"; du -sh "$W/lc8"
cp "$W/lc8/manifest.json" "$OUT/cache8_manifest.json"
OUT=$OUT W=$W bash scripts/gpu_speed.sh train cached_all 20 --set latent_cache="'$W/lc8'" --set compile="'all'" \
  --set gradient_accumulation_steps=1
OUT=$OUT W=$W bash scripts/gpu_speed.sh train cached_profile 16 --set latent_cache="'$W/lc8'" \
  --set gradient_accumulation_steps=1 --profile --set profile_steps=3
