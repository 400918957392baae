#!/usr/bin/env bash
# Issue 23's evidence on the GPU machine, from the repo root, with the wheels carried:
#   .whl/ (scripts/gpu_check.sh's), .whl-nv/nv.tar.xz (PyNvVideoCodec unpacked: PyNvVideoCodec/,
#   pynvvideocodec-*.dist-info/, pynvvideocodec./), .decvid/ (scripts/make_bench_videos.py sets),
#   .decprobe/ (the repo's odd test videos).
#   bash scripts/gpu_decode_bars.sh check            the GPU decode path's test (scripts/gpu_decode_check.py)
#   bash scripts/gpu_decode_bars.sh loader           bench loader, nvdec at 12 workers per source resolution
#   bash scripts/gpu_decode_bars.sh cached SET...    latent cache of each set, training from it (480p vs 1080p)
#   bash scripts/gpu_decode_bars.sh online SET...    online training on each set
#   (SET: a folder name under .decvid, e.g. h264_480p h264_1080p; DECODER=opencv for the CPU rows)
set -uo pipefail
OUT=${OUT:-/tmp/gpu_decode}; W=${W:-$PWD/.gpuwork}; mkdir -p "$OUT" "$W"
trap 'OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"' EXIT  # evidence says what ran, not where: <repo>, <tmp>, ...
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
if [ ! -d /tmp/site/PyNvVideoCodec ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
  tar -xJf .whl-nv/nv.tar.xz -C /tmp/site || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD/src
tl() { python3 -m taehv_launch.cli "$@"; }
DECODER=${DECODER:-auto}
REF=$W/ref_vae_cogvideox_real_c16
ref() {
  python3 - "$W" <<'PY'
import sys, torch
from pathlib import Path
from taehv_launch.bench.runs import make_assets
from taehv_launch.plan.schema import DEFAULTS
make_assets(dict(DEFAULTS), torch.device("cuda"), Path(sys.argv[1]), "/unused", print)
PY
}
train() {  # NAME SET STEPS [--set ...]
  local name=$1 set=$2 steps=$3; shift 3
  tl 1 h100 --run-name "$name" --set output_dir="'$W/output'" --set data_root="'.decvid/$set'" \
    --set ref_vae_path="'$REF'" --set max_train_steps=$steps --set log_every=5 --set gradient_accumulation_steps=1 \
    --set validation_steps=100000 --set checkpointing_steps=100000 --set lr_warmup_steps=1 \
    --set video_decoder="'$DECODER'" "$@" > "$OUT/$name.log" 2>&1
  echo "train $name: exit $?"
  grep -E "^data|decod|error|Error" "$OUT/$name.log" | head -6
  grep -E "^step" "$OUT/$name.log" | tail -3
  cp "$W/output/$name/speed.json" "$OUT/$name.speed.json" 2>/dev/null && cat "$OUT/$name.speed.json"; echo
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, accelerate, cv2; print('torch', torch.__version__, 'accelerate', accelerate.__version__, 'opencv', cv2.__version__)"
mode=$1; shift
case $mode in
  check)  python3 scripts/gpu_decode_check.py .decvid --odd .decprobe --out "$OUT/decode_check.json" 2>&1 \
            | grep -v "^\[" | tee "$OUT/decode_check.txt" ;;
  loader) for set in h264_480p h264_720p h264_1080p hevc_1080p h264_2160p; do
            # = taehv-launch bench loader --data-root .decvid/$set --decoder nvdec --workers 12 --seconds 8 --json
            python3 -c "import sys; from taehv_launch.bench import loader; sys.exit(loader.run('.decvid/$set', 480, 720, \
              12, 8, [12], ['nvdec'], 8.0, 48, True))" > "$OUT/loader_nvdec_$set.json" 2> "$OUT/loader_nvdec_$set.log"
            echo "$set: $(tail -1 "$OUT/loader_nvdec_$set.log")"
          done ;;
  cached) ref > /dev/null
          for set in "$@"; do
            tl cache 1 h100 --views 8 --run-name "cache_$set" --set latent_cache="'$W/lc_$set'" \
              --set data_root="'.decvid/$set'" --set ref_vae_path="'$REF'" --set output_dir="'$W/output'" \
              > "$OUT/cache_$set.log" 2>&1; echo "cache $set: exit $?"; grep "^cache:" "$OUT/cache_$set.log" | tail -1
            train "cached_${DECODER}_$set" "$set" ${STEPS:-40} --set latent_cache="'$W/lc_$set'"
          done ;;
  online) ref > /dev/null
          for set in "$@"; do train "online_${DECODER}_$set" "$set" ${STEPS:-30}; done ;;
esac
