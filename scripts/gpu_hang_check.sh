#!/usr/bin/env bash
# Issue 25's hang detector on the GPU machine, from the repo root, with the wheels of
# scripts/gpu_check.sh carried in .whl/ (installed into /tmp/site once):
#   bash scripts/gpu_hang_check.sh
# 2+ GPUs: a 2-rank NCCL job whose rank 1 sleeps inside the stop vote's all-reduce from step 4
#   (TAEHV_LAUNCH_TEST_HANG=1:4:collective). Expected: exit 76 after about hang_timeout (30 s), one
#   `error: job hung: rank 1 stuck in collective at step 4 ...` line, stacks/rank0.txt and rank1.txt,
#   and NCCL flight-recorder dumps (stacks/nccl_trace_rank_<r>) from both ranks.
# 1 GPU: NCCL refuses two ranks on one device, so: a 1-rank job whose rank 0 sleeps in its batch fetch
#   from step 4 (TAEHV_LAUNCH_TEST_HANG=0:4:data): exit 76, the line, stacks/rank0.txt (a 1-process
#   run has no process group, so no flight recorder); then a 1-rank NCCL process group runs an
#   all-reduce and dumps its flight recorder through the trainer's own function
#   (compat.flight_recorder_dumps).
# max_restarts=0: with the restart in place (issue 39) the launcher would start a hung job again (twice,
# then stop on max_restarts_without_progress) before it exits 76.
# Small and fast: synthetic 128x128 videos, no reference VAE (use_ref_vae=False), no compile.
# Writes $OUT (default /tmp/gpu_hang): the launcher's output, the run's heartbeat folder, the dumps' summary.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_hang}; W=${W:-/tmp/gpu_hang_work}; HANG_TIMEOUT=${HANG_TIMEOUT:-30}
mkdir -p "$OUT" "$W"
trap 'OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"' EXIT  # evidence says what ran, not where: <repo>, <tmp>, ...
if [ -d .whl ] && [ ! -f /tmp/site/.gpu_hang_installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && touch /tmp/site/.gpu_hang_installed || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
GPUS=$(nvidia-smi -L | wc -l)
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
  *H200*) PROFILE=${PROFILE:-h200} ;;
  *) PROFILE=${PROFILE:-h100} ;;
esac
python3 - <<'PY'
import glob, os, torch, torch._C._distributed_c10d as c10d
print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())
print("dump functions:", [n for n in ("_dump_nccl_trace", "_dump_fr_trace") if hasattr(c10d, n)])
from taehv_launch.compat import flight_recorder_buffer_var, torch_version
print("launcher sets the buffer size as", flight_recorder_buffer_var(torch_version()))
names = [b"TORCH_FR_BUFFER_SIZE", b"TORCH_NCCL_TRACE_BUFFER_SIZE", b"TORCH_FR_DUMP_TEMP_FILE",
         b"TORCH_NCCL_DEBUG_INFO_TEMP_FILE", b"TORCH_NCCL_DUMP_ON_TIMEOUT"]
libs = glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_c*.so"))
blob = b"".join(open(p, "rb").read() for p in libs)
print("variables libtorch knows:", [n.decode() for n in names if n in blob])
PY
python3 - "$W/vids" <<'PY'
import os, sys
from taehv_launch.train.data.synthetic import write_demo_videos
if not os.path.isdir(sys.argv[1]):
    os.makedirs(sys.argv[1]); write_demo_videos(sys.argv[1], 8, 128, 128, 48)
PY
if [ "$GPUS" -ge 2 ]; then N=2; HOOK=1:4:collective; else N=1; HOOK=0:4:data; fi
NAME=hang$N; RUN=$W/output/$NAME
rm -rf "$RUN"
echo "== $N rank(s) on $PROFILE, TAEHV_LAUNCH_TEST_HANG=$HOOK, hang_timeout $HANG_TIMEOUT s"
start=$(date +%s)
TAEHV_LAUNCH_TEST_HANG=$HOOK timeout 900 python3 -m taehv_launch.cli $N "$PROFILE" --run-name $NAME \
  --master-port 29561 --set output_dir="'$W/output'" --set data_root="'$W/vids'" --set use_ref_vae=False \
  --set encoder_loss_weight=0 --set height=128 --set width=128 --set micro_batch_size=1 \
  --set gradient_accumulation_steps=1 --set max_train_steps=10000 --set log_every=1 --set compile="'none'" \
  --set validation_steps=100000 --set checkpointing_steps=100000 --set validation_at_start=False \
  --set dataloader_num_workers=2 --set hang_timeout=$HANG_TIMEOUT --set max_restarts=0 > "$OUT/$NAME.out" 2> "$OUT/$NAME.err"
code=$?
echo "exit $code (expected 76) after $(( $(date +%s) - start )) s"
echo "-- stderr:"; cat "$OUT/$NAME.err"
grep -E "TAEHV_LAUNCH_TEST_HANG|reported a hang" "$OUT/$NAME.out" "$RUN/launch.log" 2>/dev/null
echo "-- $RUN/heartbeat:"; ls -la "$RUN/heartbeat" "$RUN/heartbeat/stacks"
rm -rf "$OUT/heartbeat"; cp -r "$RUN/heartbeat" "$OUT/heartbeat" 2>/dev/null
for f in "$RUN"/heartbeat/stacks/rank*.txt; do echo "-- $f"; cat "$f"; done
if [ "$N" = 1 ]; then
  echo "== flight recorder of a 1-rank NCCL process group"
  python3 - "$OUT/fr_1rank" <<'PY'
import os, sys
os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
import torch, torch.distributed as dist
from taehv_launch.compat import flight_recorder_dumps
out = sys.argv[1]; os.makedirs(out, exist_ok=True)
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29571", rank=0, world_size=1,
                        device_id=torch.device("cuda:0"))
x = torch.ones(1 << 20, device="cuda")
for _ in range(3):
    dist.all_reduce(x)
torch.cuda.synchronize()
dumps = flight_recorder_dumps()
for kind, data in dumps.items():
    with open(os.path.join(out, f"{kind}_trace_rank_0"), "wb") as f:
        f.write(data)
print("dumped:", sorted(dumps) or "nothing")
dist.destroy_process_group()
PY
fi
if [ "$N" = 2 ]; then
  echo "== torchfrtrace (PyTorch's analyser) on the run's NCCL dumps"
  timeout 300 python3 -c "from torch.distributed.flight_recorder.fr_trace import main; main()" \
    "$RUN/heartbeat/stacks" -p nccl_trace_rank_ 2>&1 | tail -n 40
fi
echo "== flight-recorder dumps"
python3 - "$RUN/heartbeat/stacks" "$OUT/fr_1rank" <<'PY'
import glob, os, pickle, sys
for folder in sys.argv[1:]:
    for path in sorted(glob.glob(os.path.join(folder, "*_trace_rank_*"))):
        d = pickle.load(open(path, "rb"))
        entries = d.get("entries", [])
        print(f"{path}: {len(entries)} entries, version {d.get('version')}")
        for e in entries[-3:]:
            print("   ", e.get("profiling_name"), "seq", e.get("collective_seq_id"), "state", e.get("state"),
                  "sizes", e.get("input_sizes"))
PY
