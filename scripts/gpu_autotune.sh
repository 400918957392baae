#!/usr/bin/env bash
# #38 item 3's last lever: Inductor's autotuning (compile_mode=max-autotune-no-cudagraphs) from the latent cache,
# on its own, because its warm-up outlasts a `bench compare` row (340 s were not enough on 2026-11-27). One
# device call, from the repo root, .whl/ carried (installed as scripts/gpu_levers.sh does):
#   MODE=max-autotune-no-cudagraphs STEPS=25 LIMIT=470 bash scripts/gpu_autotune.sh
# bench compare's assets (16 synthetic 720x480 videos, a real-architecture CogVideoX VAE with random weights),
# the cache job (1 view, compile none), then ONE trainer run from the cache (h100 profile, accumulation 1,
# compile all in MODE, STEPS steps; speed.json leaves out the first 10) stopped at LIMIT seconds. Compare its
# clips/s with `gpu_levers.sh`'s default row measured on the same kind of GPU. Outputs under OUT: train.log,
# cache.log, speed.json, versions.txt, autotune.txt (the autotune passes and their benchmarking seconds).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_autotune}; W=${W:-/tmp/bat}; STEPS=${STEPS:-25}; LIMIT=${LIMIT:-470}
MODE=${MODE:-max-autotune-no-cudagraphs}
mkdir -p "$OUT" "$W"
trap 'OUT="$OUT" python3 scripts/scrub_paths.py "$OUT" >/dev/null 2>&1' EXIT
if [ -d .whl ] && [ -z "${NO_WHL:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
{ date -u +%Y-%m-%dT%H:%MZ; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__)'; } 2>&1 | tee "$OUT/versions.txt"
python3 - "$W" > "$OUT/assets.log" 2>&1 <<'PY' || { cat "$OUT/assets.log"; exit 1; }
import sys, torch
from pathlib import Path
from taehv_launch.bench.runs import make_assets
from taehv_launch.plan.schema import DEFAULTS
cfg = dict(DEFAULTS) | {"height": 480, "width": 720, "n_frames": 12, "max_frame_delta": 2}
print(make_assets(cfg, torch.device("cuda"), Path(sys.argv[1]), None, print))
PY
tl() { python3 -m taehv_launch.cli "$@"; }
common=(--set data_root="'$W/videos_480x720'" --set ref_vae_path="'$W/ref_vae_cogvideox_real_c16'"
  --set output_dir="'$W/output'" --set latent_cache="'$W/lc'")
tl cache 1 h100 --views 1 --run-name cache --set compile="'none'" "${common[@]}" > "$OUT/cache.log" 2>&1
echo "cache: exit $? after ${SECONDS}s"
timeout -k 10 "$LIMIT" python3 -m taehv_launch.cli 1 h100 --run-name autotune "${common[@]}" \
  --set compile_mode="'$MODE'" --set max_train_steps="$STEPS" --set log_every=5 --set gradient_accumulation_steps=1 \
  --set validation_steps=100000 --set checkpointing_steps=100000 --set lr_warmup_steps=1 > "$OUT/train.log" 2>&1
echo "train ($MODE): exit $? after ${SECONDS}s (124: stopped at LIMIT=$LIMIT s)"
cp "$W/output/autotune/speed.json" "$OUT/" 2>/dev/null
grep -o "AUTOTUNE benchmarking takes [0-9.]* seconds" "$OUT/train.log" \
  | awk '{s += $4} END {printf "%d autotune passes, %.0f s of benchmarking\n", NR, s}' | tee "$OUT/autotune.txt"
grep -E "^step|steps?/s|clips/s" "$OUT/train.log" | tail -n 4
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$MODE', round(d['clips_per_s'], 2), 'clips/s, peak', round(d['peak_reserved_gib'], 1), 'GiB')" \
  "$OUT/speed.json" 2>/dev/null || echo "no speed.json: the run did not reach its steps"
