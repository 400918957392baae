#!/usr/bin/env bash
# Issue 38 item 1: where long-GOP 1080p training from the cache is limited (GPU machine, one H100, ~7 min):
#   bash scripts/gpu_gop_limit.sh SRC_DIR
# Runs scripts/gpu_gop.sh's 1080p training row (LOADER=0 SETS=v1080) with `nvidia-smi dmon -s u` recording the
# NVDEC (dec) and SM utilization each second, then scripts/nvdec_seek_probe.py on the same set (SimpleDecoder vs
# the low-level decoder with and without non-reference frames skipped; THREADS, default "12 14") and the loader
# alone at 12 threads. Evidence in OUT (default /tmp/gpu_gop).
set -uo pipefail
SRC=${1:?usage: bash scripts/gpu_gop_limit.sh SRC_DIR}
OUT=${OUT:-/tmp/gpu_gop}; W=${W:-/tmp/gop}; THREADS=${THREADS:-12 14}
mkdir -p "$OUT"
nvidia-smi dmon -s u -d 1 -o T > "$OUT/dmon.txt" 2>&1 &
DMON=$!
trap 'kill $DMON 2>/dev/null' EXIT
mark() { echo "$(date +%H:%M:%S) $*" | tee -a "$OUT/marks.txt"; }
mark "training rows start"
LOADER=0 SETS="v1080" OUT="$OUT" W="$W" bash scripts/gpu_gop.sh "$SRC" 2>&1 | tail -n 12
mark "training rows end"
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
for t in $THREADS; do
  mark "probe threads $t"
  python3 scripts/nvdec_seek_probe.py "$W/v1080" --threads "$t" --seconds 8 --check $([ "$t" = 12 ] && echo 24 || echo 0) \
    2>&1 | tee "$OUT/probe_t$t.jsonl"
done
mark "loader alone 12 threads"
taskset -c 0-11 python3 -m taehv_launch.cli bench loader --data-root "$W/v1080" --decoder nvdec --workers 12 \
  --seconds 6 --clips 16 --decode-threads 12 --json > "$OUT/loader_v1080_t12.json" 2> "$OUT/loader_v1080_t12.log"
grep -E "loader  nvdec" "$OUT/loader_v1080_t12.log"
mark "end"
kill $DMON 2>/dev/null
OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"
