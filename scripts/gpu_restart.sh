#!/usr/bin/env bash
# Issue 39's restart in place on the GPU machine (2 GPUs), from the repo root, with the wheels of
# scripts/gpu_check.sh carried in .whl/ (installed into /tmp/site once):
#   bash scripts/gpu_restart.sh
# Two 2-rank NCCL jobs on synthetic 128x128 videos (no reference VAE), checkpoint every 20 steps,
# compile=COMPILE (default 'all', the compile cache in $W/output/.compile-cache kept warm by a first
# untimed run), hang_timeout=30:
#   kill: SIGKILL of rank 1 after checkpoint-20 is complete and step 25 is logged;
#   stop: SIGSTOP of rank 1 at the same point (the launcher reports the hang, kills it, restarts).
# Each job must end with exit 0 after one restart. Prints, per case, the seconds from the signal to
# the first step logged past the checkpoint (events.jsonl's restarted.first_step_at), and the
# restart's own recovery_s (from the recorded failure). Goal: at most 120 s, the hang timeout included.
# Writes $OUT (default /tmp/gpu_restart): each job's output, events.jsonl, and restart.txt.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_restart}; W=${W:-/tmp/gpu_restart_work}; COMPILE=${COMPILE:-all}
mkdir -p "$OUT" "$W"
trap 'OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"' EXIT
if [ -d .whl ] && [ ! -f /tmp/site/.gpu_restart_installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && touch /tmp/site/.gpu_restart_installed || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
date -u +%Y-%m-%dT%H:%MZ | tee "$OUT/restart.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/restart.txt"
python3 -c "import torch, accelerate; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'accelerate', accelerate.__version__)" | tee -a "$OUT/restart.txt"
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
  *H200*) PROFILE=${PROFILE:-h200} ;;
  *) PROFILE=${PROFILE:-h100} ;;
esac
[ "$(nvidia-smi -L | wc -l)" -ge 2 ] || { echo "error: needs 2 GPUs"; exit 2; }
python3 - "$W/vids" <<'PY'
import os, sys
from taehv_launch.train.data.synthetic import write_demo_videos
if not os.path.isdir(sys.argv[1]):
    os.makedirs(sys.argv[1]); write_demo_videos(sys.argv[1], 8, 128, 128, 48)
PY
job() {  # NAME STEPS: the launch, in the background; its pid in $JOB
  rm -rf "$W/output/$1"
  python3 -m taehv_launch.cli 2 "$PROFILE" --run-name "$1" --master-port 29563 --set output_dir="'$W/output'" \
    --set data_root="'$W/vids'" --set use_ref_vae=False --set encoder_loss_weight=0 --set height=128 --set width=128 \
    --set micro_batch_size=1 --set gradient_accumulation_steps=1 --set max_train_steps="$2" --set log_every=1 \
    --set compile="'$COMPILE'" --set validation_steps=100000 --set checkpointing_steps=20 \
    --set validation_at_start=False --set dataloader_num_workers=2 --set hang_timeout=30 \
    > "$OUT/$1.out" 2> "$OUT/$1.err" &
  JOB=$!
}
echo "== warm-up (fills the compile cache, untimed)"
job warm 25; wait $JOB; echo "warm-up exit $?"
for CASE in kill stop; do
  SIG=KILL; [ $CASE = stop ] && SIG=STOP
  echo "== $CASE: SIG$SIG to rank 1 after step 25 (checkpoint-20 complete)" | tee -a "$OUT/restart.txt"
  job $CASE 60; RUN=$W/output/$CASE
  PID=$(python3 - "$RUN" <<'PY'
import json, sys, time
from pathlib import Path
run = Path(sys.argv[1])
for _ in range(6000):
    try:
        if json.loads((run / "progress.json").read_text())["step"] >= 25 and (run / "checkpoint-20" / "COMPLETE").exists():
            print(json.loads((run / "heartbeat" / "rank1").read_text())["pid"]); break
    except (OSError, ValueError, KeyError):
        pass
    time.sleep(0.1)
PY
)
  [ -n "$PID" ] || { echo "error: $CASE never reached step 25"; kill $JOB; continue; }
  T0=$(python3 -c 'import time; print(time.time())'); kill -$SIG "$PID"
  wait $JOB; CODE=$?
  cp "$RUN/events.jsonl" "$OUT/$CASE.events.jsonl" 2>/dev/null
  python3 - "$RUN" "$T0" "$CODE" <<'PY' | tee -a "$OUT/restart.txt"
import json, sys
from pathlib import Path
run, t0, code = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
ev = [json.loads(l) for l in (run / "events.jsonl").read_text().splitlines()] if (run / "events.jsonl").exists() else []
rs = [e for e in ev if e.get("event") == "restart"]
done = [e for e in ev if e.get("event") == "restarted"]
print(f"exit {code}; restarts {len(rs)}; reason: {rs[0]['reason'] if rs else '-'}")
if done:
    print(f"signal to first new step: {done[0]['first_step_at'] - t0:.1f} s; recorded failure to first new step: {done[0]['recovery_s']} s")
else:
    print("no first new step recorded")
PY
done
