#!/usr/bin/env bash
# Issue 37 items 2 and 5 on the GPU machine (one H100), from the repo root, .whl/ carried (scripts/gpu_check.sh's
# wheels) and the repo's sample videos copied into a carried folder VIDS (../shared/testdata/videos does not travel):
#   bash scripts/gpu_quality.sh distil VIDS      learning at the real size (item 5):
#       1. the teacher: scripts/train_sanity_reference.py (a small CogVideoX-architecture VAE trained as an
#          autoencoder on the training split; no trained CogVideoX weights can be downloaded there)
#       2. TAEHV distilled from it at the h100 profile's 480x720 (12 frames), Seraena on, micro 4, accumulation 1,
#          STEPS steps (1000), validation before the first step and every VAL_EVERY steps (250)
#       3. `taehv-launch eval` of the export on the held-out clips, decoder on the teacher's latents and end to end
#       keeps the teacher and the export under $KEEP (carry them into the recipe call)
#   bash scripts/gpu_quality.sh recipe VIDS KEEP  the decoder-only recipe (item 2): start from KEEP's export,
#       freeze_encoder=True, reconstruction_loss=l1, Seraena on, FT_STEPS steps (400); then `eval` before vs after
#   bash scripts/gpu_quality.sh all VIDS          both in one call (the teacher does not fit the transfer back)
# Env: OUT (evidence folder), W (work folder), KEEP (where distil leaves teacher/ and start/), STEPS, VAL_EVERY,
# FT_STEPS, TEACHER_STEPS (1200), TEACHER_S (seconds, 200).
set -uo pipefail
MODE=${1:?usage: bash scripts/gpu_quality.sh distil|recipe VIDS [KEEP]}; VIDS=${2:?the sample videos folder}
OUT=${OUT:-/tmp/gpu_quality}; W=${W:-/tmp/gq}; KEEP=${KEEP:-${3:-$W/keep}}; mkdir -p "$OUT" "$W" "$KEEP"
STEPS=${STEPS:-1000}; VAL_EVERY=${VAL_EVERY:-250}; FT_STEPS=${FT_STEPS:-400}
trap 'OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"' EXIT  # evidence says what ran, not where
if [ -d .whl ] && [ ! -d /tmp/site/diffusers ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
tl() { python3 -c 'from taehv_launch.cli import main; main()' "$@"; }
{ date -u +%Y-%m-%dT%H:%MZ; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import torch, accelerate, diffusers; print(f"torch {torch.__version__}, accelerate {accelerate.__version__}, diffusers {diffusers.__version__}")'
} | tee "$OUT/versions.txt"
DATA=$W/real; rm -rf "$DATA"; mkdir -p "$DATA"; cp "$VIDS"/* "$DATA"/
common=(--set data_root="'$DATA'" --set output_dir="'$W/out'" --set height=480 --set width=720 --set n_frames=12
        --set micro_batch_size=4 --set gradient_accumulation_steps=1 --set lr_warmup_steps=50
        --set validation_at_start=True --set checkpointing_steps=100000 --set log_every=50 --set compile="'none'"
        --set dataloader_num_workers=12)
evalrow() {  # NAME WEIGHTS...
  local name=$1; shift
  tl eval "$@" --data-root "$DATA" --ref-vae-path "$KEEP/teacher" --height 480 --width 720 --n-frames 12 \
    --max-clips 8 > "$OUT/eval_$name.txt" 2> "$OUT/eval_$name.log"
  echo "eval $name: exit $?"; cat "$OUT/eval_$name.txt"
}
if [ "$MODE" = all ]; then
  bash "$0" distil "$VIDS" && bash "$0" recipe "$VIDS"; exit $?
elif [ "$MODE" = distil ]; then
  python3 scripts/train_sanity_reference.py "$DATA" "$KEEP/teacher" "${TEACHER_STEPS:-1200}" "${TEACHER_S:-200}" 2>&1 \
    | grep -v Warn | tee "$OUT/teacher-training.log"
  tl 1 h100 --run-name distil480 "${common[@]}" --set ref_vae_path="'$KEEP/teacher'" \
    --set max_train_steps="$STEPS" --set validation_steps="$VAL_EVERY" > "$OUT/distil480.log" 2>&1
  echo "distil480: exit $?"; grep -E "^validation|^step ($STEPS|50|500)/|error" "$OUT/distil480.log"
  mkdir -p "$KEEP/start" && cp "$W"/out/distil480/final_model/* "$KEEP/start/" && ls -la "$KEEP/start"
  mkdir -p "$OUT/distil480_logs" && cp "$W"/out/distil480/logs/events* "$OUT/distil480_logs/" 2>/dev/null
  evalrow distil "$KEEP/start/taecvx.pth"
elif [ "$MODE" = recipe ]; then
  tl 1 h100 --run-name recipe "${common[@]}" --set ref_vae_path="'$KEEP/teacher'" \
    --set pretrained_model_path="'$KEEP/start/taecvx.pth'" --set freeze_encoder=True --set reconstruction_loss="'l1'" \
    --set max_train_steps="$FT_STEPS" --set validation_steps=$((FT_STEPS / 2)) > "$OUT/recipe.log" 2>&1
  echo "recipe: exit $?"; grep -E "^  trains|^validation|^step ($FT_STEPS)/|error" "$OUT/recipe.log"
  mkdir -p "$OUT/recipe_logs" && cp "$W"/out/recipe/logs/events* "$OUT/recipe_logs/" 2>/dev/null
  evalrow recipe "$KEEP/start/taecvx.pth" "$W/out/recipe/final_model/taecvx.pth"
  python3 - "$KEEP/start/taecvx.pth" "$W/out/recipe/final_model/taecvx.pth" <<'PY'
import sys, torch
a, b = (torch.load(p, map_location="cpu", weights_only=True) for p in sys.argv[1:3])
enc = [k for k in a if k.startswith("encoder.")]
same = all(torch.equal(a[k], b[k]) for k in enc)
dec = sum(not torch.equal(a[k], b[k]) for k in a if k.startswith("decoder."))
print(f"encoder tensors {len(enc)}, bit-identical after the recipe: {same}; decoder tensors changed: {dec}")
PY
else
  echo "unknown mode $MODE: distil or recipe"; exit 2
fi
