#!/usr/bin/env bash
# Issue 38 item 1: who holds the interpreter lock, and how busy the cores are, while the trainer runs from the
# latent cache on 480p and on long-GOP 1080p sources (one H100, ~9 min), from the repo root:
#   bash scripts/gpu_gil.sh SRC_DIR
# Carried beside gpu_gop.sh's (.whl/, .whl-nv/, .whl-av/): .whl-spy/py_spy-*.whl (`pip download py-spy`).
# 1. scripts/gpu_nv12_check.py SRC_DIR (the clip kernel against the torch path on NVDEC's surfaces).
# 2. The sets and caches of gpu_gop.sh (CACHE_ONLY=1).
# 3. Per row (spy_v1080, spy_v480, then spy_v1080_b and spy_v480_b while the call has time): STEPS steps (100)
#    at the h100 defaults; once the log says step 10, py-spy samples the trainer for SPY_S s (20) at RATE Hz
#    (100), non-blocking, only samples where a thread holds the lock (scripts/gil_share.py: <row>.gil.md);
#    scripts/cpu_threads.py samples the trainer's threads for the whole call (cpu.txt). All in OUT/gil.tgz.
set -uo pipefail
SRC=${1:?usage: bash scripts/gpu_gil.sh SRC_DIR}
OUT=${OUT:-/tmp/gpu_gil}; W=${W:-/tmp/gop}; STEPS=${STEPS:-100}; SPY_S=${SPY_S:-20}; RATE=${RATE:-100}
LAST_BY=${LAST_BY:-470}  # seconds into the call after which no further row starts
. scripts/gpu_rows.sh
call_start gpu_gil.sh "$SRC" gil
spy_whl=$(ls .whl-spy/py_spy-*.whl 2>/dev/null | head -1)
[ -n "$spy_whl" ] || { echo "error: gpu_gil.sh: no .whl-spy/py_spy-*.whl: pip download py-spy -d .whl-spy" >&2; exit 2; }
rm -rf /tmp/spy && python3 -m zipfile -e "$spy_whl" /tmp/spy
SPY=$(ls /tmp/spy/py_spy-*.data/scripts/py-spy 2>/dev/null | head -1)
[ -n "$SPY" ] || { echo "error: gpu_gil.sh: $spy_whl holds no py-spy binary: pip download py-spy again" >&2; exit 2; }
chmod +x "$SPY"
timeout 120 python3 scripts/gpu_nv12_check.py "$SRC" > "$OUT/nv12_check.txt" 2>&1
echo "nv12 check: exit $? after $(( $(date +%s) - start )) s"; tail -n 3 "$OUT/nv12_check.txt"
cached_sets "$SRC"
python3 scripts/cpu_threads.py --out "$OUT/cpu.txt" --skip 50 > /dev/null 2>&1 &
cpu=$!
trap 'kill "$cpu" 2> /dev/null; pack' EXIT  # the sampler does not outlive the script

trainer_pid() {  # the process running train/main.py with the most threads (not accelerate's launcher)
  local best="" most=0 p n
  for p in $(pgrep -f "train/main.py"); do
    n=$(ls "/proc/$p/task" 2>/dev/null | wc -l)
    (( n > most )) && { most=$n; best=$p; }
  done
  echo "$best"
}

spy_row() {  # NAME SET
  local name=$1 set=$2 rp pid
  row "$name" "$set" --set max_train_steps="$STEPS" &
  rp=$!
  for _ in $(seq 1 400); do
    grep -q "^step 10/" "$OUT/$name.log" 2>/dev/null && break
    kill -0 "$rp" 2>/dev/null || break
    sleep 0.5
  done
  pid=$(trainer_pid)
  if [ -n "$pid" ]; then
    timeout $(( SPY_S + 20 )) "$SPY" record --pid "$pid" --duration "$SPY_S" --gil --threads --nonblocking \
      --format raw -r "$RATE" -o "$OUT/$name.spy.txt" > "$OUT/$name.spy.log" 2>&1
  fi
  wait "$rp"
  python3 scripts/gil_share.py "$OUT/$name.spy.txt" --seconds "$SPY_S" --rate "$RATE" > "$OUT/$name.gil.md" 2>&1
  row_line "$name"
  head -n 8 "$OUT/$name.gil.md"
}

for r in "spy_v1080 v1080" "spy_v480 v480" "spy_v1080_b v1080" "spy_v480_b v480"; do
  if [ $(( $(date +%s) - start )) -ge "$LAST_BY" ]; then echo "${r%% *} not run: past LAST_BY=$LAST_BY s"; continue; fi
  spy_row $r
done
kill "$cpu"; wait "$cpu"; cat "$OUT/cpu.txt"
echo "total $(( $(date +%s) - start )) s"
