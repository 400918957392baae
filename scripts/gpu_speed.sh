#!/usr/bin/env bash
# Speed evidence for docs/benchmarks.md, run on the GPU machine from the repo root after installing
# the wheels (scripts/gpu_check.sh says how). Real H.264 videos in .benchdata/v480 and v720 (written
# from ../shared/testdata/videos by scripts/make_bench_videos.py). Usage: bash scripts/gpu_speed.sh STEP...
#   compare     bench --compare 1 h100 (naive vs the real trainer, with --phases). Pass
#               --set gradient_accumulation_steps=1 (or 2): the h100 1-GPU row accumulates 16 micro-batches
#               per step, and 30 such steps outlast a 10-minute device call. If a call is cut off, its
#               trainer keeps the GPU: `pkill -9 -f "[t]rain/main.py"` first.
#   levers      bench --compare 1 h100 --levers (one row per lever, in-process)
#   train NAME STEPS [--set ...]   one real trainer run; prints its speed.json
#   loader DIR  bench --loader on DIR at 4, 8, 12 workers
set -uo pipefail
OUT=${OUT:-/tmp/gpu_speed}; W=${W:-/tmp/bc}; mkdir -p "$OUT" "$W"
trap 'OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"' EXIT  # evidence says what ran, not where: <repo>, <tmp>, ...
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
tl() { python3 -c 'from taehv_launch.cli import main; main()' "$@"; }
case "$1" in
  compare) shift; tl bench --compare 1 h100 --steps 3 --trainer-steps 30 --data-root .benchdata/v480 --workdir $W "$@" \
             2>&1 | tee "$OUT/compare.log"; cp $W/compare.json "$OUT/" ;;
  levers)  shift; tl bench --compare 1 h100 --levers --steps 3 --trainer-steps 30 --chunk 4 --chunk 2 \
             --data-root .benchdata/v480 --workdir $W "$@" 2>&1 | tee "$OUT/levers.log"; cp $W/compare.json "$OUT/levers.json" ;;
  train)   name=$2 steps=$3; shift 3
           tl 1 h100 --run-name "$name" --set output_dir="'$W/output'" --set data_root="'.benchdata/v480'" \
             --set ref_vae_path="'$W/ref_vae_cogvideox_real_c16'" --set max_train_steps=$steps --set log_every=5 \
             --set validation_steps=100000 --set checkpointing_steps=100000 --set lr_warmup_steps=1 "$@" \
             > "$OUT/$name.log" 2>&1; echo "train $name: exit $?"
           grep -E "^step|error|Error" "$OUT/$name.log" | tail -4; cat "$W/output/$name/speed.json" 2>/dev/null; echo ;;
  loader)  dir=$2; shift 2; tl bench --loader --data-root "$dir" --workers 4 --workers 8 --workers 12 --seconds 6 \
             --clips 48 --json "$@" > "$OUT/loader_$(basename $dir).json" 2> "$OUT/loader_$(basename $dir).log"
           cat "$OUT/loader_$(basename $dir).log" ;;
esac
