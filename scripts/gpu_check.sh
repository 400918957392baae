#!/usr/bin/env bash
# GPU evidence run (used with the device tool; works on any GPU node with the package importable).
#   bash scripts/gpu_check.sh bench|train1|train2 [OUTDIR]
# bench : `taehv-launch bench` for the memory model and speed ratios
# train1: real assets (480x720 videos, real-architecture CogVideoX VAE with random weights),
#         validate-env and a short 1-GPU training run
# train2: validate-env 2 GPUs, 2-GPU ZeRO-2 run + resume, a ZeRO-3 run
# scale : 1/2/4 GPUs at the same micro-batch, resume at 4 ranks, 2 "nodes" x 2 GPUs on one machine
# layout: resume on another GPU count and ZeRO stage (2 GPUs ZeRO-2 -> 1 GPU ZeRO-3 -> 2 GPUs ZeRO-2):
#         is the state carried over?
# curve : 2 GPUs, 20 steps at a constant LR: uninterrupted ZeRO-2, against ZeRO-2 to step 10 then
#         ZeRO-3 (portable state), against ZeRO-2 resumed as ZeRO-2 (DeepSpeed's own files)
set -uo pipefail
mode=$1
out=${2:-${OUT:-/tmp/gpu-check}}
mkdir -p "$out"
trap 'OUT="$out" python3 scripts/scrub_paths.py "$out"' EXIT  # evidence says what ran, not where: <repo>, <tmp>, ...
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
from taehv_launch.train.data.synthetic import write_demo_videos
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
      $T $n h200 --run-name s$n "${common[@]}" --set micro_batch_size=8 --set max_train_steps=15 \
        --set validation_steps=15 --set checkpointing_steps=15 2>&1 | grep -E "^step|error" | tee "$out/scale_$n.txt"
    done
    $T 4 h200 --run-name s4 --resume auto "${common[@]}" --set micro_batch_size=8 --set max_train_steps=20 \
      --set validation_steps=20 --set checkpointing_steps=20 2>&1 | grep -E "^step|resumed|error" | tee "$out/resume_4.txt"
    # the multi-node path on one machine: 2 "nodes" x 2 GPUs, each launcher sees its own GPUs
    split=(4 h200 --num-nodes 2 --gpus-per-node 2 --master-addr 127.0.0.1 --master-port 29611 --run-name split
           "${common[@]}" --set micro_batch_size=8 --set max_train_steps=15 --set validation_steps=15
           --set checkpointing_steps=15)
    CUDA_VISIBLE_DEVICES=0,1 $T "${split[@]}" --node-rank 0 > "$out/split_node0.txt" 2>&1 &
    CUDA_VISIBLE_DEVICES=2,3 $T "${split[@]}" --node-rank 1 > "$out/split_node1.txt" 2>&1
    wait
    grep -E "^step|processes|exited|error" "$out/split_node0.txt" "$out/split_node1.txt"
    ;;
  layout)
    assets
    L=(--run-name lay "${common[@]}" --set micro_batch_size=4 --set log_every=1 --set validation_steps=1000)
    $T 2 h200 "${L[@]}" --set zero_stage=2 --set max_train_steps=10 --set checkpointing_steps=10 2>&1 \
      | grep -E "^step 10|processes|exited|error" | tee "$out/layout_1.txt"
    # one more step each at a negligible LR: the next checkpoint shows what the resume loaded
    for spec in "1 3 11" "2 2 12"; do
      set -- $spec
      $T $1 h200 "${L[@]}" --set zero_stage=$2 --set max_train_steps=$3 --set checkpointing_steps=1 \
        --set learning_rate=1e-12 --resume auto 2>&1 | grep -E "note .*written|resumed|^step|exited|error" \
        | tee "$out/layout_$3.txt"
    done
    python3 - <<'PY' | tee "$out/layout_carried.txt"
from pathlib import Path
from taehv_launch.train.durability.portable import carried_over
run = Path("output/lay")
for a, b in ((10, 11), (11, 12)):
    print(f"checkpoint-{a} -> checkpoint-{b}:", carried_over(run / f"checkpoint-{a}", run / f"checkpoint-{b}", 0.9, 0.95))
PY
    ;;
  curve)
    assets
    S=("${common[@]}" --set micro_batch_size=4 --set log_every=1 --set validation_steps=1000 --set checkpointing_steps=10
       --set lr_scheduler=constant --set seraena_checkpoint_buffer_mb=${BUFFER_MB:-1024})   # 1024: the replay buffer is saved
    $T 2 h200 --run-name full "${S[@]}" --set zero_stage=2 --set max_train_steps=20 2>&1 | grep -E "exited|error"
    for run in z3 z2; do
      $T 2 h200 --run-name $run "${S[@]}" --set zero_stage=2 --set max_train_steps=10 2>&1 | grep -E "exited|error"
      $T 2 h200 --run-name $run "${S[@]}" --set zero_stage=${run#z} --set max_train_steps=20 --resume auto 2>&1 \
        | grep -E "note .*written|resumed|exited|error"
    done
    python3 - <<'PY' | tee "$out/layout_curve.txt"
from pathlib import Path
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
def losses(run):
    out = {}
    for f in sorted(Path(f"output/{run}/logs").glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0}); acc.Reload()
        out.update({e.step: e.value for e in acc.Scalars("train/loss")})
    return out
a, z3, z2 = losses("full"), losses("z3"), losses("z2")
import os
print(f"train/loss, 2 x H200, constant LR; resumed at step 10; seraena_checkpoint_buffer_mb={os.environ.get('BUFFER_MB', 1024)}")
print("step  ZeRO-2 throughout | ->ZeRO-3 (portable)  rel diff | ->ZeRO-2 (DeepSpeed files)  rel diff")
for s in sorted(a):
    print(f"{s:4d}  {a[s]:.6f}          | {z3[s]:.6f}  {abs(a[s] - z3[s]) / a[s]:.1e}"
          f"            | {z2[s]:.6f}  {abs(a[s] - z2[s]) / a[s]:.1e}")
PY
    ;;
esac
