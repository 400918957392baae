#!/usr/bin/env bash
# Issue 38 item 1: does long-GOP 1080p from the cache wait on its decode? More NVDEC threads than the decode model
# chooses (11), rows alternating (one H100, ~9 min), from the repo root:   bash scripts/gpu_more_threads.sh SRC_DIR
# The plan's memory model refuses more than 11 threads on an 80 GB GPU (it counts 1.9 GiB a thread, measured with
# the float frames the clip kernel no longer makes), so the THREADS rows run as `1 h200` (the same settings but
# micro 16, set back to 8 here; only the plan's GPU size differs) and nvidia-smi's memory.used is sampled every 2 s
# (smi.txt: what the NVDEC sessions take beside torch's reserved memory). Everything in OUT/threads.tgz.
set -uo pipefail
SRC=${1:?usage: bash scripts/gpu_more_threads.sh SRC_DIR}
OUT=${OUT:-/tmp/gpu_more_threads}; W=${W:-/tmp/gop}; THREADS=${THREADS:-14}; LAST_BY=${LAST_BY:-470}
. scripts/gpu_rows.sh
call_start gpu_more_threads.sh "$SRC" threads
trap 'pack; cp "$OUT/rows.md" "$R/" 2> /dev/null' EXIT  # the table beside the archive
cached_sets "$SRC"
nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -lms 2000 > "$OUT/smi.txt" 2>&1 &
smi=$!
trap 'kill "$smi" 2> /dev/null; pack; cp "$OUT/rows.md" "$R/" 2> /dev/null' EXIT  # the sampler stops with it
more() { ROW_PROFILE=h200 row "$1" "$2" --set micro_batch_size=8 --set video_decode_threads="$THREADS"; }
for r in "row cached_v1080 v1080" "more cached_v1080_t$THREADS v1080" "row cached_v480 v480" \
         "more cached_v1080_t${THREADS}_b v1080" "row cached_v1080_b v1080"; do
  if [ $(( $(date +%s) - start )) -ge "$LAST_BY" ]; then echo "${r} not run: past LAST_BY=$LAST_BY s"; continue; fi
  $r
  set -- $r; row_line "$2"; grep -hoE "NVDEC decode threads: [0-9]+ threads[^(]*" "$OUT/$2.log" | head -1
  grep -m1 -E "^error|Error" "$OUT/$2.log"
done
kill "$smi"
echo "total $(( $(date +%s) - start )) s"
