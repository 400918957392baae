#!/usr/bin/env bash
# Issue 38 item 1: what holds long-GOP 1080p back in training, and two levers, rows alternating in one call
# (GPU machine, one H100, ~8 min):  bash scripts/gpu_decode_levers.sh SRC_DIR
# scripts/gpu_gop.sh writes the 1080p set and trains from its cache at the defaults (LOADER=0 SETS=v1080);
# scripts/gpu_decode_probe.py measures the GIL under 11 decode threads and finish()'s GPU time; then rows:
# 6 decode threads, the interpreter's switch interval at 0.5 ms (TAEHV_SWITCH_INTERVAL, default 5 ms), the
# defaults again, and (while the call has time, EXTRA_BY s, default 480) 6 threads again. Evidence in OUT.
# TAEHV_SWITCH_INTERVAL was a measurement switch of commit df5f632, reverted after this call (no gain): run
# the script at that commit to reproduce its row.
set -uo pipefail
SRC=${1:?usage: bash scripts/gpu_decode_levers.sh SRC_DIR}
OUT=${OUT:-/tmp/gpu_levers}; W=${W:-/tmp/gop}; EXTRA_BY=${EXTRA_BY:-480}
. scripts/gpu_rows.sh
work_lock gpu_decode_levers.sh "$SRC"
mkdir -p "$OUT"; start=$(date +%s)
LOADER=0 SETS="v1080" OUT="$OUT" W="$W" bash scripts/gpu_gop.sh "$SRC" 2>&1 | grep -E "clips/s|exit|total"
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
timeout 60 python3 scripts/gpu_decode_probe.py "$W/v1080" 11 > "$OUT/probe.txt" 2>&1
echo "probe: exit $? after $(( $(date +%s) - start )) s"; cat "$OUT/probe.txt"
ROW_ENV=TAEHV_SWITCH_INTERVAL  # each row says the switch interval it ran with
row cached_v1080_t6 v1080 --set video_decode_threads=6
TAEHV_SWITCH_INTERVAL=0.0005 row cached_v1080_si v1080
row cached_v1080_b v1080
[ $(( $(date +%s) - start )) -lt "$EXTRA_BY" ] && row cached_v1080_t6_b v1080 --set video_decode_threads=6
for n in cached_v1080 cached_v1080_t6 cached_v1080_si cached_v1080_b cached_v1080_t6_b; do
  row_line "$n"
done
echo "total $(( $(date +%s) - start )) s"
OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"
