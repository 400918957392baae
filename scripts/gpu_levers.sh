#!/usr/bin/env bash
# #38 item 3, the cached path toward the GPU's limit: one lever per row, side by side in ONE
# `taehv-launch bench compare 1 h100 --cached 1` run on one GPU: the naive pipeline, the cache job, then
# the real trainer from the latent cache once per row. One device call, from the repo root, .whl/ carried
# (installed as scripts/gpu_check.sh does; no internet):
#   bash scripts/gpu_levers.sh                         # DEADLINE=500 s of the call's 540
# NO_WHL=1 uses the package already installed (this script's checks on a machine without a GPU:
# `NO_WHL=1 bash scripts/gpu_levers.sh` stops at "needs a GPU" once every row's --set is accepted).
# Rows (each a --cached-row on top of the run from the cache; LEVERS, one row per line, replaces them):
#   today's default                          the bench's own from-cache row (compile 'all', mode default)
#   compile_mode=reduce-overhead             CUDA graphs for TAEHV's encode and decode
#   micro_batch_size=9                       the largest micro-batch the h100 plan fits (69.5 of 72 GiB)
#   compile_mode=max-autotune-no-cudagraphs  Triton autotuning: the longest warm-up, so it goes last
# Shared by every row: accumulation 1 (the 1-GPU row's 16 micro-batches per step outlast the call), STEPS
# trainer steps (speed.json leaves out the first 10), one validation batch, synthetic 480x720 videos and a
# real-architecture CogVideoX VAE with random weights (bench compare's own assets). The cache job runs with
# compile off (its speed is not what this measures; the runs from the cache get compile='all' back).
# Time: `bench compare --deadline` gives each run what is left (none starts with under 30 s), each trainer
# run stops at ROW_S; a run cut off is a row that says so. Outputs under $OUT: table.md (lever, clips/s,
# ratio vs naive, peak GiB), compare.json, bench.log, the runs' logs, versions.txt.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_levers}; W=${W:-/tmp/blv}; mkdir -p "$OUT" "$W"
DEADLINE=${DEADLINE:-500}; ROW_S=${ROW_S:-200}; STEPS=${STEPS:-25}; PROFILE=${PROFILE:-h100}
LEVERS=${LEVERS:-"compile_mode=reduce-overhead
micro_batch_size=9
compile_mode=max-autotune-no-cudagraphs"}
trap 'OUT="$OUT" python3 scripts/scrub_paths.py "$OUT" >/dev/null 2>&1' EXIT  # evidence says what ran, not where
if [ -d .whl ] && [ -z "${NO_WHL:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
{ date -u +%Y-%m-%dT%H:%MZ; git rev-parse --short HEAD 2>/dev/null
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import torch, accelerate, deepspeed, diffusers; print(f"torch {torch.__version__}, accelerate {accelerate.__version__}, DeepSpeed {deepspeed.__version__}, diffusers {diffusers.__version__}")'
} 2>&1 | grep -v Warning | tee "$OUT/versions.txt"

rows=()
while IFS= read -r lever; do [ -n "${lever// }" ] && rows+=(--cached-row "$lever"); done <<< "$LEVERS"
left=$(( DEADLINE - SECONDS - 15 ))
echo "gpu_levers: the default and $(( ${#rows[@]} / 2 )) lever rows; ${left}s left for the bench; runs stop at ${ROW_S}s"
if (( left < 120 )); then echo "gpu_levers: only ${left}s left after the set-up: nothing measured"; exit 1; fi
# the backstop ends the bench 10 s after its own deadline; the bench stops its runs itself before that
timeout -k 10 $(( left + 10 )) python3 -c 'from taehv_launch.cli import main; main()' bench compare 1 "$PROFILE" \
  --steps 3 --trainer-steps "$STEPS" --cached 1 --no-online --workdir "$W" --json \
  --set gradient_accumulation_steps=1 --set max_validation_batches=1 --set compile=none \
  --cached-set compile=all "${rows[@]}" --row-timeout "$ROW_S" --deadline "$left" \
  > "$OUT/compare.stdout.json" 2> "$OUT/bench.log"
code=$?
echo "bench compare: exit $code after ${SECONDS}s (1: some row not measured; 124: cut by the backstop)" | tee -a "$OUT/bench.log"
cp "$W/compare.json" "$OUT/" 2>/dev/null
cp "$W"/*.log "$OUT/" 2>/dev/null
grep -hE "^(bench:|  naive|error)" "$OUT/bench.log" | tail -n 20

python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
try:
    report = json.loads((out / "compare.json").read_text())
except (OSError, ValueError) as err:
    print(f"no compare.json: {err}")
    sys.exit(0)

def num(v, spec):
    return "-" if v is None else format(v, spec)

lines = [
    f"{report['date']}, {report['device']}, torch {report['torch']}, {report['shape']}, "
    f"{report['ref_vae_type']} reference VAE (random weights); `{report['command']}`",
    "",
    "| lever | clips/s | vs naive | peak GiB | note |",
    "|---|---|---|---|---|",
]
for r in report["rows"]:
    if r["what"] == "naive":
        name, note = "naive pipeline", f"encode {r['encode_s'] * 1000:.0f} ms + step {r['step_s'] * 1000:.0f} ms"
    elif r.get("not_training"):
        continue  # the cache job (compile off here): not a lever
    elif r["what"] == "ours, from the latent cache":
        name, note = "from the cache: today's default", ""
    else:
        name, note = f"from the cache: {r.get('detail', '')}", ""
    if r.get("clips_per_s") is None:
        note = f"not measured: {r.get('not_measured', '')}"
    ratio = r.get("ratio_vs_naive")
    lines.append(
        f"| {name} | {num(r.get('clips_per_s'), '.2f')} | {num(ratio, '.2f') + 'x' if ratio else '-'} | "
        f"{num(r.get('peak_allocated_gib'), '.1f')} | {note} |"
    )
text = "\n".join(lines) + "\n"
(out / "table.md").write_text(text)
print(text)
PY
echo "gpu_levers: done after ${SECONDS}s"
exit $code
