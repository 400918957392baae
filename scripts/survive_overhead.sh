#!/usr/bin/env bash
# Issue 25's "no slowdown" check: the same 2-rank trainer run, alternating between the tree before the
# heartbeat / hang / straggler / rollback bookkeeping (BASE, unpacked into .gpuwork/base by
#   mkdir -p .gpuwork/base && git archive d616d48 src | tar -x -C .gpuwork/base
# on the development machine; carry .gpuwork/base and .whl) and this checkout, ROUNDS times each,
# then each side's median clips/s from the trainer's speed.json (steady state, warm-up left out).
#   bash scripts/survive_overhead.sh [GPUS PROFILE]     default: 2 cpu (two gloo ranks)
#   EXTRA="--set k=v ...": more options for both sides
#   A GPU profile trains, unless EXTRA names its own data_root, on 16 synthetic SIZE x SIZE clips
#   (default 128: short steps, so the per-step bookkeeping weighs the most) without a reference VAE.
set -uo pipefail
GPUS=${1:-2}; PROFILE=${2:-cpu}; ROUNDS=${ROUNDS:-3}; STEPS=${STEPS:-60}
W=${W:-/tmp/survive}; OUT=${OUT:-$W/out}; mkdir -p "$W" "$OUT"
trap 'OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"' EXIT  # evidence says what ran, not where: <repo>, <tmp>, ...
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
# the base tree's cpu profile does not hide the GPU itself (gloo's barrier would ask for cuda:<rank>)
[ "$PROFILE" = cpu ] && export CUDA_VISIBLE_DEVICES=
if [ -d .whl ] && ! python3 -c "import deepspeed, diffusers" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
fi
GPU_SET=()
if [ "$PROFILE" != cpu ] && [[ "${EXTRA:-}" != *data_root* ]]; then
  SIZE=${SIZE:-128}
  PYTHONPATH=/tmp/site:$PWD/src python3 - "$W/vids$SIZE" "$SIZE" <<'PY' || exit 1
import os, sys
from taehv_launch.train.data.synthetic import write_demo_videos
if not os.path.isdir(sys.argv[1]):
    os.makedirs(sys.argv[1]); write_demo_videos(sys.argv[1], 16, int(sys.argv[2]), int(sys.argv[2]), 48)
PY
  GPU_SET=(--set data_root="'$W/vids$SIZE'" --set use_ref_vae=False --set encoder_loss_weight=0
           --set height="$SIZE" --set width="$SIZE" --set gradient_accumulation_steps=1 --set compile="'none'" --set validation_at_start=False)
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  PYTHONPATH=/tmp/site python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
fi
run() {  # SIDE SRC ROUND
  local side=$1 src=$2 round=$3 name="$1-$3"
  rm -rf "${W:?}/output/$name"  # a fresh run each time, never one continued from an earlier call
  PYTHONPATH=/tmp/site:$src python3 -m taehv_launch.cli "$GPUS" "$PROFILE" --run-name "$name" \
    --set output_dir="'$W/output'" --set max_train_steps="$STEPS" --set log_every=10 \
    --set validation_steps=100000 --set checkpointing_steps=100000 "${GPU_SET[@]}" ${EXTRA:-} > "$OUT/$name.log" 2>&1
  local code=$?
  python3 - "$W/output/$name/speed.json" "$side" "$round" "$code" <<'PY'
import json, sys
path, side, rnd, code = sys.argv[1:]
try:
    s = json.load(open(path))
    print(f"{side:5s} round {rnd}: exit {code}, {s['clips_per_s']:.2f} clips/s")
except (OSError, ValueError, KeyError) as exc:
    print(f"{side:5s} round {rnd}: exit {code}, no speed.json ({exc})")
PY
}
for r in $(seq 1 "$ROUNDS"); do
  run base "$PWD/.gpuwork/base/src" "$r"
  run ours "$PWD/src" "$r"
done | tee "$OUT/rounds.txt"
python3 - "$OUT/rounds.txt" <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\w+)\s+round \d+: exit 0, ([\d.]+) clips/s", line)
    if m:
        rows.setdefault(m[1], []).append(float(m[2]))
if {"base", "ours"} <= rows.keys():
    b, o = statistics.median(rows["base"]), statistics.median(rows["ours"])
    spread = max(max(v) / min(v) - 1 for v in rows.values())
    print(f"median clips/s: base {b:.2f}, ours {o:.2f}; ours/base {o / b:.3f}; "
          f"largest spread within one side {spread * 100:.1f}% (the noise)")
else:
    print("incomplete: see the logs in", sys.argv[1].rsplit("/", 1)[0])
PY
