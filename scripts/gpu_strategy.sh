#!/usr/bin/env bash
# Strategy per row (#28): per-GPU clips/s and peak memory of each data-parallel strategy for this
# model, side by side in one call, on the GPU machine from the repo root (wheels installed as in
# scripts/gpu_check.sh; videos in .benchdata/v480 from
# `python scripts/make_bench_videos.py .benchdata/v480 720 480 16 300`). Real trainer runs of the
# h100 profile as users run it (micro 8, compile 'all', 12 frames of 480x720, Seraena on) at
# accumulation 1 so that every micro-batch pays its gradient reduction; the reference VAE is the
# CogVideoX architecture with random weights (bench.runs.make_assets).
#   bash scripts/gpu_strategy.sh [ROW...]     (default: z0 z1 z2 z3)
#     z0        plain DDP: zero_stage=0, no DeepSpeed (the 1-GPU row)
#     z1, z2    DeepSpeed ZeRO-1 / ZeRO-2, TAEHV compiled whole
#     z3        ZeRO-3 with compile 'all': the trainer keeps TAEHV eager under ZeRO-3 (so, as committed,
#               the same as z3_eager); with docs/evidence/strategy/zero3_compile.diff applied, each
#               MemBlock is compiled as a ZeRO-3 leaf module, its gather hooks outside (the evidence row)
#     z3_eager  ZeRO-3 with compile='reference': TAEHV eager, the reference encoder compiled
#     z3_nchw   as z3, without channels-last
#     z3_entry, z3_module: probes, only with zero3_compile.diff applied (TAEHV_Z3_PROBE): TAEHV's
#               encode/decode compiled whole under ZeRO-3, and DistillNet.compile() (what DeepSpeed's
#               engine.compile() does without DeepCompile: torch.compile of the whole module with the
#               ZeRO-3 hooks inside it)
# GPUS=2 (or more) runs the same rows on that many GPUs of one host. Each row prints its speed.json
# (steady state: steps 11..STEPS; clips_per_s_per_gpu, peak_allocated_gib). DEADLINE (seconds from
# the start) skips a row when fewer than NEED_S seconds are left; a row gets at most ROW_S seconds
# and ends by DEADLINE + 30.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_strategy}; W=${W:-/tmp/bs}; STEPS=${STEPS:-24}; GPUS=${GPUS:-1}
DEADLINE=${DEADLINE:-100000}; ROW_S=${ROW_S:-240}; NEED_S=${NEED_S:-90}
mkdir -p "$OUT" "$W"
trap 'OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"' EXIT  # evidence says what ran, not where: <repo>, <tmp>, ...
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import torch, accelerate, deepspeed, diffusers; print(f"torch {torch.__version__}, accelerate {accelerate.__version__}, DeepSpeed {deepspeed.__version__}, diffusers {diffusers.__version__}")'
} 2>&1 | grep -v Warning | tee "$OUT/versions.txt"
python3 - "$W" <<'PY'
import sys, torch
from pathlib import Path
from taehv_launch.bench.runs import make_assets
from taehv_launch.plan.schema import DEFAULTS
make_assets(dict(DEFAULTS), torch.device("cuda"), Path(sys.argv[1]), ".benchdata/v480", print)
PY
common=(--set data_root="'.benchdata/v480'" --set ref_vae_path="'$W/ref_vae_cogvideox_real_c16'"
        --set output_dir="'$W/output'" --set gradient_accumulation_steps=1 --set max_train_steps=$STEPS
        --set log_every=5 --set validation_steps=100000 --set checkpointing_steps=100000 --set lr_warmup_steps=1)
row() {  # NAME [--set ...]
  name=$1; shift
  if (( SECONDS + NEED_S > DEADLINE )); then echo "row $name: skipped (${SECONDS}s of ${DEADLINE}s used)"; return; fi
  t0=$SECONDS lim=$(( DEADLINE + 30 - SECONDS )); (( lim > ROW_S )) && lim=$ROW_S
  timeout $lim python3 -c 'from taehv_launch.cli import main; main()' "$GPUS" h100 --run-name "$name" "${common[@]}" "$@" \
    > "$OUT/$name.log" 2>&1; echo "row $name ($GPUS GPUs $*): exit $?, $((SECONDS - t0)) s"
  grep -E "^compile|^step|rror|recompile_limit|cache_size_limit" "$OUT/$name.log" | tail -5
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: d.get(k) for k in ('clips_per_s_per_gpu','world_size','from_step','steps','peak_allocated_gib','peak_reserved_gib')})" \
    "$W/output/$name/speed.json" 2>&1 | tail -1
  cp "$W/output/$name/speed.json" "$OUT/$name.speed.json" 2>/dev/null
}
[ $# -gt 0 ] || set -- z0 z1 z2 z3
for r in "$@"; do
  case $r in
    z0|z1|z2|z3) row "$r" --set zero_stage=${r#z} ;;
    z3_eager)    row z3_eager --set zero_stage=3 --set compile="'reference'" ;;
    z3_nchw)     row z3_nchw --set zero_stage=3 --set channels_last=False ;;
    z3_entry|z3_module) TAEHV_Z3_PROBE=${r#z3_} row "$r" --set zero_stage=3 ;;
    *)           echo "unknown row $r (z0 z1 z2 z3 z3_eager z3_nchw z3_entry z3_module)"; exit 2 ;;
  esac
done
