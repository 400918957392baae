#!/usr/bin/env bash
# #38: compile_layout on the online path (reference encode + TAEHV step), side by side in one device call
# (~6 minutes), from the repo root, .whl/ carried:  bash scripts/gpu_online_layout.sh
# Two `bench compare 1 h100` runs on the same assets and work folder (the naive pipeline and the real trainer
# online, accumulation 1, STEPS trainer steps): today's default (compile_layout='force'), then
# compile_layout='auto' (Inductor's own layout choice). Outputs under $OUT: table.md, both compare.json, logs.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_online}; W=${W:-/tmp/blo}; STEPS=${STEPS:-25}; mkdir -p "$OUT" "$W"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
for layout in force auto; do
  left=$(( 580 - SECONDS ))
  timeout -k 5 $(( left - 5 )) python3 -m taehv_launch.cli bench compare 1 h100 --steps 3 --trainer-steps "$STEPS" \
    --workdir "$W" --json --set gradient_accumulation_steps=1 --set max_validation_batches=1 \
    --set "compile_layout='$layout'" --row-timeout 260 --deadline $(( left - 15 )) \
    > "$OUT/compare_$layout.stdout.json" 2> "$OUT/bench_$layout.log"
  echo "layout $layout: exit $? after ${SECONDS}s"
  cp "$W/compare.json" "$OUT/compare_$layout.json" 2>/dev/null
done
python3 - "$OUT" <<'PY' | tee "$OUT/table.md"
import json, sys
from pathlib import Path
print("| compile_layout | naive clips/s | online clips/s | vs naive | peak GiB |\n|---|---|---|---|---|")
for layout in ("force", "auto"):
    try:
        rows = json.loads((Path(sys.argv[1]) / f"compare_{layout}.json").read_text())["rows"]
    except (OSError, ValueError) as err:
        print(f"| {layout} | not measured: {err} | | | |"); continue
    naive = next(r for r in rows if r["what"] == "naive")
    ours = next((r for r in rows if r["what"].startswith("ours")), {})
    c, n = ours.get("clips_per_s"), naive["clips_per_s"]
    rate, ratio = ("-", "-") if c is None else (f"{c:.2f}", f"{c / n:.2f}x")
    print(f"| {layout} | {n:.2f} | {rate} | {ratio} | {ours.get('peak_allocated_gib', '-')} |")
PY
tar -czf /tmp/online_logs.tgz -C "$W" $(cd "$W" && ls *.log 2>/dev/null) && mv /tmp/online_logs.tgz "$OUT/"
OUT="$OUT" python3 scripts/scrub_paths.py "$OUT" > /dev/null 2>&1
exit 0
