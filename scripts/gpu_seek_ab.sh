#!/usr/bin/env bash
# Issue 38 item 1: train/data/nvdec_seek.py (the clip's pictures alone mapped out of NVDEC, non-reference pictures
# outside the clip not decoded) against SimpleDecoder (TAEHV_NVDEC_SEEK=0), one GPU, ~9.5 min, from the repo root:
#   bash scripts/gpu_seek_ab.sh SRC_DIR
# gpu_gop.sh's 480p and long-GOP 1080p sets and caches, and a 2000-frame 720p file (keyframe every 250: clips
# far into a file); scripts/nvdec_seek_check.py on them and SRC_DIR's H.264 files (the same clips both ways, clips/s
# of the decode threads alone); then training rows from the cache at the h100 defaults, the path on and off
# alternating, while the call has time (LAST_BY s, default 470). Env: CHECK_SETS (the check's folders under W),
# CHECK_ARGS (its options), SESSIONS (also the decode threads alone on SRC_DIR's files with that many NVDEC
# sessions a thread), ROWS (WAY:NAME:SET ..., WAY on or off). Everything in OUT/seek.tgz, the table beside it.
set -uo pipefail
SRC=${1:?usage: bash scripts/gpu_seek_ab.sh SRC_DIR}
OUT=${OUT:-/tmp/gpu_seek_ab}; W=${W:-/tmp/gop}; LAST_BY=${LAST_BY:-470}
. scripts/gpu_rows.sh
call_start gpu_seek_ab.sh "$SRC" seek
trap 'pack; cp "$OUT/rows.md" "$R/" 2> /dev/null' EXIT  # the table beside the archive
python3 scripts/make_bench_videos.py "$W/vlong" 1280 720 1 2000 --src "$SRC" > "$OUT/make_long.log" 2>&1 &
cached_sets "$SRC"
wait
mkdir -p "$W/h264" && cp "$SRC"/*.mp4 "$W/h264/" 2> /dev/null
check() {  # NAME SET...: nvdec_seek_check.py on $W/SET..., CHECK_ARGS added
  local name=$1; shift
  python3 scripts/nvdec_seek_check.py "${@/#/$W/}" ${CHECK_ARGS:---clips 10 --seconds 5 --rounds 1} \
    > "$OUT/$name.jsonl" 2>&1
  echo "$name: exit $? after $(( $(date +%s) - start )) s"; grep -v '"file"' "$OUT/$name.jsonl" | grep -v '"seek"'
  grep '"file"' "$OUT/$name.jsonl" | grep -v '"differing": 0,' | head -5
  grep '"seek"' "$OUT/$name.jsonl" | head -9
}
check check ${CHECK_SETS:-v1080 v480 h264 vlong}
[ -n "${SESSIONS:-}" ] && CHECK_ARGS="--clips 0 --seconds 5 --rounds 1 --sessions $SESSIONS" check "check_s$SESSIONS" h264
on() { ROW_ENV=TAEHV_NVDEC_SEEK TAEHV_NVDEC_SEEK=1 row "$@"; }
off() { ROW_ENV=TAEHV_NVDEC_SEEK TAEHV_NVDEC_SEEK=0 row "$@"; }
# ROWS: WAY:NAME:SET ..., WAY on (the path) or off (SimpleDecoder)
for r in ${ROWS:-on:seek_v1080:v1080 off:plain_v1080:v1080 on:seek_v480:v480 on:seek_v1080_b:v1080 \
         off:plain_v1080_b:v1080 on:seek_v480_b:v480}; do
  IFS=: read -r way name set <<< "$r"
  if [ $(( $(date +%s) - start )) -ge "$LAST_BY" ]; then echo "$name not run: past LAST_BY=$LAST_BY s"; continue; fi
  "$way" "$name" "$set"
  row_line "$name"; grep -hoE "NVDEC decode threads: [0-9]+ threads[^(]*" "$OUT/$name.log" | head -1
  grep -m1 -E "^error|Traceback" "$OUT/$name.log" | cut -c1-200
done
echo "total $(( $(date +%s) - start )) s"
