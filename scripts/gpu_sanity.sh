#!/usr/bin/env bash
# Learning sanity on the GPU machine (docs/benchmarks.md): 2000 steps at 128x128 on the real clips of
# ../shared/testdata/videos (copied to .benchdata/real), Seraena on, validation before the first step
# and every 250 steps. Two runs side by side on one GPU:
#   distil       distillation from a real-architecture CogVideoX VAE with random weights
#   autoencoder  use_ref_vae=False: the decoder learns TAEHV's own frozen, untrained encodings (no teacher;
#                docs call it decoder-only)
# Writes $OUT/sanity-*.log and the runs' TensorBoard logs; plot with scripts/plot_curve.py RUN_DIR OUT.png.
#   bash scripts/gpu_sanity.sh            the two runs above
#   bash scripts/gpu_sanity.sh teacher    one distil run whose reference is a small CogVideoX-architecture VAE
#                                         trained first as an autoencoder on the training split
#                                         (scripts/train_sanity_reference.py): latents that hold the picture
set -uo pipefail
OUT=${OUT:-/tmp/gpu_sanity}; W=${W:-/tmp/bc}; mkdir -p "$OUT" "$W"
trap 'OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"' EXIT  # evidence says what ran, not where: <repo>, <tmp>, ...
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
REF=$W/ref_vae_cogvideox_real_c16
if [ "${1:-}" = teacher ]; then
  REF=$W/teacher
  python3 scripts/train_sanity_reference.py .benchdata/real "$REF" ${TEACHER_STEPS:-1200} 300 2>&1 \
    | grep -v Warn | tee "$OUT/sanity-teacher-training.log"
fi
python3 - "$W" <<'PY'
import sys, torch
from pathlib import Path
from taehv_launch.bench.runs import make_assets
from taehv_launch.plan.schema import DEFAULTS
make_assets(dict(DEFAULTS), torch.device("cuda"), Path(sys.argv[1]), ".benchdata/real", print)
PY
common=(--set output_dir="'$W/sanity'" --set data_root="'.benchdata/real'" --set ref_vae_path="'$REF'"
        --set height=128 --set width=128 --set micro_batch_size=4 --set gradient_accumulation_steps=1
        --set max_train_steps=${STEPS:-2000} --set lr_warmup_steps=100 --set validation_steps=250
        --set validation_at_start=True --set checkpointing_steps=100000 --set log_every=100 --set compile="'none'")
tl() { python3 -c 'from taehv_launch.cli import main; main()' "$@"; }
if [ "${1:-}" = teacher ]; then
  # 12 loader workers: the 128x128 clips come from 720p-1080p sources (the clips drawn do not depend on it)
  tl 1 h100 --run-name sanity-teacher --master-port 29513 "${common[@]}" --set dataloader_num_workers=12 \
    > "$OUT/sanity-teacher.log" 2>&1
  echo "== teacher"; grep -E "^validation|^step (100|1000|2000)/|error" "$OUT/sanity-teacher.log"
  mkdir -p "$OUT/teacher" && cp "$W"/sanity/sanity-teacher/logs/events* "$OUT/teacher/" 2>/dev/null
  python3 scripts/plot_curve.py "$W/sanity/sanity-teacher" "$OUT/learning_curve.png"
  exit 0
fi
tl 1 h100 --run-name sanity-distil --master-port 29511 "${common[@]}" > "$OUT/sanity-distil.log" 2>&1 &
tl 1 h100 --run-name sanity-autoencoder --master-port 29512 "${common[@]}" --set use_ref_vae=False \
   --set encoder_loss_weight=0 > "$OUT/sanity-autoencoder.log" 2>&1 &
wait
for r in distil autoencoder; do
  echo "== $r"; grep -E "^validation|^step (100|1000|2000)/|error" "$OUT/sanity-$r.log"
  mkdir -p "$OUT/$r" && cp -r "$W/sanity/sanity-$r/logs" "$OUT/$r/" 2>/dev/null
done
