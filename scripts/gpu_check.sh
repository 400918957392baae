#!/usr/bin/env bash
# GPU evidence run (used with the device tool; works on any GPU node with the package importable).
#   bash scripts/gpu_check.sh bench|train1|train2 [OUTDIR]
# bench : `taehv-launch bench` for the memory model and speed ratios
# train1: real assets (480x720 videos, real-architecture CogVideoX VAE with random weights),
#         validate-env and a short 1-GPU training run
# train2: validate-env 2 GPUs, 2-GPU ZeRO-2 run + resume, a ZeRO-3 run
# scale : 1/2/4 GPUs at the same micro-batch, resume at 4 ranks, 2 "nodes" x 2 GPUs on one machine
set -uo pipefail
mode=$1
out=${2:-${OUT:-/tmp/gpu-check}}
mkdir -p "$out"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src
fi
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T="python3 -m taehv_launch.cli"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
assets() {
  python3 - <<'PY'
import os, torch, diffusers
from taehv_launch.train.synthetic import write_demo_videos
if not os.path.isdir("/tmp/vids"):
    os.makedirs("/tmp/vids"); write_demo_videos("/tmp/vids", 8, 480, 720, 36)
if not os.path.isdir("/tmp/refvae/vae"):
    torch.manual_seed(0); diffusers.AutoencoderKLCogVideoX().save_pretrained("/tmp/refvae/vae")
print("assets ready")
PY
}
common=(--set data_root=/tmp/vids --set ref_vae_path=/tmp/refvae --set gradient_accumulation_steps=1
        --set log_every=5 --set dataloader_num_workers=4 --set lr_warmup_steps=5)
case $mode in
  bench)
    $T bench --micro 1 --micro 2 --micro 4 --micro 8 --ref-vae-type cogvideox --chunk 1 --chunk 4 | tee "$out/bench_cogvideox.txt"
    for k in hunyuan wan; do $T bench --micro 1 --ref-vae-type $k --chunk 1 | tee "$out/bench_$k.txt"; done
    ;;
  train1)
    assets
    $T validate-env 1 h200 "${common[@]}" | tee "$out/validate_env_1gpu.txt"
    $T 1 h200 --run-name g1 "${common[@]}" --set max_train_steps=20 --set validation_steps=20 \
      --set checkpointing_steps=10 2>&1 | tail -n 25 | tee "$out/train_1gpu.txt"
    ;;
  train2)
    assets
    $T validate-env 2 h200 "${common[@]}" | tee "$out/validate_env_2gpu.txt"
    $T 2 h200 --run-name g2 "${common[@]}" --set max_train_steps=30 --set validation_steps=30 \
      --set checkpointing_steps=15 2>&1 | tail -n 25 | tee "$out/train_2gpu.txt"
    $T 2 h200 --run-name g2 --resume auto "${common[@]}" --set max_train_steps=40 --set validation_steps=40 \
      --set checkpointing_steps=20 2>&1 | tail -n 12 | tee "$out/resume_2gpu.txt"
    $T 2 h200 --run-name g2z3 "${common[@]}" --set zero_stage=3 --set max_train_steps=10 --set validation_steps=10 \
      --set checkpointing_steps=10 2>&1 | tail -n 12 | tee "$out/train_2gpu_zero3.txt"
    ;;
  scale)
    assets
    # same micro-batch on 1, 2, 4 GPUs: samples/s per GPU side by side in one run
    for n in 1 2 4; do
      $T $n h200 --run-name s$n "${common[@]}" --set train_batch_size=8 --set max_train_steps=15 \
        --set validation_steps=15 --set checkpointing_steps=15 2>&1 | grep -E "^step|error" | tee "$out/scale_$n.txt"
    done
    $T 4 h200 --run-name s4 --resume auto "${common[@]}" --set train_batch_size=8 --set max_train_steps=20 \
      --set validation_steps=20 --set checkpointing_steps=20 2>&1 | grep -E "^step|resumed|error" | tee "$out/resume_4.txt"
    # the multi-node path on one machine: 2 "nodes" x 2 GPUs, each launcher sees its own GPUs
    split=(4 h200 --num-nodes 2 --gpus-per-node 2 --master-addr 127.0.0.1 --master-port 29611 --run-name split
           "${common[@]}" --set train_batch_size=8 --set max_train_steps=15 --set validation_steps=15
           --set checkpointing_steps=15)
    CUDA_VISIBLE_DEVICES=0,1 $T "${split[@]}" --node-rank 0 > "$out/split_node0.txt" 2>&1 &
    CUDA_VISIBLE_DEVICES=2,3 $T "${split[@]}" --node-rank 1 > "$out/split_node1.txt" 2>&1
    wait
    grep -E "^step|processes|exited|error" "$out/split_node0.txt" "$out/split_node1.txt"
    ;;
esac
