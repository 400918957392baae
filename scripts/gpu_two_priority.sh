#!/usr/bin/env bash
# step_stream_priority=high (the default) on two GPUs as users run them (GPU machine, 2 x H100, ~8 min):
#   bash scripts/gpu_two_priority.sh SRC_DIR
# Writes a small long-GOP 480p set (8 files x 120 frames), then trains `taehv-launch 2 h100` online from it with
# NVDEC decode: plain DDP (the 2-GPU default), ZeRO-2, and (while the call has time, EXTRA_BY s, default 380) plain
# DDP with step_stream_priority=default; STEPS (24) steps at accumulation 1. Each row: exit code, the last step
# line (losses finite), the model line's stream and speed.json. Evidence in OUT.
set -uo pipefail
SRC=${1:?usage: bash scripts/gpu_two_priority.sh SRC_DIR}
OUT=${OUT:-/tmp/gpu_two}; W=${W:-/tmp/two}; STEPS=${STEPS:-24}; EXTRA_BY=${EXTRA_BY:-380}
. scripts/gpu_rows.sh
work_lock gpu_two_priority.sh "$SRC"  # a folder, and W for this call alone (a second copy would reuse its run names)
mkdir -p "$OUT"; start=$(date +%s)
trap 'OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"' EXIT
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
device_site || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 scripts/make_bench_videos.py "$W/v480" 720 480 8 120 --src "$SRC" > "$OUT/make_480.log" 2>&1 || exit 1
REF=$W/ref_vae_cogvideox_real_c16
python3 - "$W" > "$OUT/ref.log" 2>&1 <<'PY'
import sys, torch
from pathlib import Path
from taehv_launch.bench.runs import make_assets
from taehv_launch.plan.schema import DEFAULTS
make_assets(dict(DEFAULTS), torch.device("cuda"), Path(sys.argv[1]), "/unused", print)
PY
echo "set and reference after $(( $(date +%s) - start )) s"
row() {  # NAME [--set ...]
  local name=$1; shift
  timeout 230 python3 -m taehv_launch.cli 2 h100 --run-name "$name" --set data_root="'$W/v480'" \
    --set ref_vae_path="'$REF'" --set output_dir="'$W/output'" --set max_train_steps=$STEPS --set log_every=4 \
    --set gradient_accumulation_steps=1 --set validation_steps=100000 --set checkpointing_steps=100000 \
    --set lr_warmup_steps=1 "$@" > "$OUT/$name.log" 2>&1
  echo "$name ($*): exit $? after $(( $(date +%s) - start )) s"
  grep -hoE "the step on [^:(]*" "$OUT/$name.log" | sort | uniq -c
  grep -E "^step" "$OUT/$name.log" | tail -1
  grep -iE "error|traceback" "$OUT/$name.log" | head -3
  cp "$W/output/$name/speed.json" "$OUT/$name.speed.json" 2>/dev/null
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: d.get(k) for k in ('clips_per_s','clips_per_s_per_gpu','world_size','peak_reserved_gib')})" \
    "$OUT/$name.speed.json" 2>&1 | tail -1
}
row two_ddp
row two_z2 --set zero_stage=2
[ $(( $(date +%s) - start )) -lt "$EXTRA_BY" ] && row two_ddp_dflt --set step_stream_priority=default
echo "total $(( $(date +%s) - start )) s"
