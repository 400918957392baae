#!/usr/bin/env bash
# Families on one H100 (#36 item 7): for each new family at its real architecture (random weights), at the
# h100 profile's size (480x720; LTX 480x704; the family's default n_frames), on the GPU machine from the
# repo root with the wheels installed as scripts/gpu_check.sh does (.whl/ carried; no internet):
#   memory  (a) the reference encode's peak GiB and time: one clip at chunk 1 (the record's encode_gib)
#               and 2 clips at the profile's chunk 2 (`taehv-launch bench step --no-step`)
#           (b) the training step's peak GiB at micro 1, 2, 4, 8, base decoder, no checkpointing (as the
#               h100 profile runs), and so the largest micro that fits the plan's 90% of 80 GiB
#   speed   (c) clips/s of a short real run (`taehv-launch 1 h100`, accumulation 1) online, then
#               `taehv-launch cache` (1 view per video) and the same run from the latent cache
# Order: the memory phase for every family first (the numbers the family records need), then the speed
# phase family by family. One family failing does not stop the others. A row is skipped when fewer than
# NEED_S seconds are left before DEADLINE (seconds from the start) and cut at ROW_S seconds.
#   FAMILIES="wan22 hunyuan15 ltx2 h3" PHASES="memory speed" STEPS=20 DEADLINE=530 bash scripts/gpu_families.sh
# MICRO_<family>=N forces the speed phase's micro-batch; COMPILE=all (the profile's) or reference/none.
# Raw outputs under $OUT; a compact table at the end (also $OUT/summary.txt).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_families}; W=${W:-/tmp/bf}; mkdir -p "$OUT" "$W"
FAMILIES=${FAMILIES:-wan22 hunyuan15 ltx2 h3}; PHASES=${PHASES:-memory speed}; STEPS=${STEPS:-20}
DEADLINE=${DEADLINE:-530}; ROW_S=${ROW_S:-240}; NEED_S=${NEED_S:-60}; COMPILE=${COMPILE:-all}
trap 'OUT="$OUT" python3 scripts/scrub_paths.py "$OUT"' EXIT  # evidence says what ran, not where
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
tl() { python3 -c 'from taehv_launch.cli import main; main()' "$@"; }
{ date -u +%Y-%m-%dT%H:%MZ; git rev-parse --short HEAD 2>/dev/null
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import torch, accelerate, deepspeed, diffusers; print(f"torch {torch.__version__}, accelerate {accelerate.__version__}, DeepSpeed {deepspeed.__version__}, diffusers {diffusers.__version__}")'
} 2>&1 | grep -v Warning | tee "$OUT/versions.txt"

shape() {  # FAMILY -> "N_FRAMES HEIGHT WIDTH"
  python3 -c 'import sys; from taehv_launch.plan.families import get_family as g; f = g(sys.argv[1]); print(f.default_n_frames, 480, 704 if f.space_stride > 16 else 720)' "$1"
}
left() { echo $(( DEADLINE - SECONDS )); }
guard() {  # NAME: 0 when there is time for a row, else says it is skipped
  if (( SECONDS + NEED_S > DEADLINE )); then echo "$1: skipped (${SECONDS}s of ${DEADLINE}s used)" | tee -a "$OUT/skipped.txt"; return 1; fi
}
limit() { local l=$(( DEADLINE + 20 - SECONDS )); (( l > ROW_S )) && l=$ROW_S; echo $l; }

assets() {  # FAMILY N H W: synthetic videos at the size and the family's real-architecture VAE, random weights
  timeout -k 20 "$(limit)" python3 - "$W" "$@" <<'PY' 2>&1 | grep -v Warning
import os, sys, time, torch, diffusers
from pathlib import Path
from taehv_launch.plan.families import get_family
from taehv_launch.train.data.synthetic import _build_once, write_demo_videos
w, kind, n, h, wd = Path(sys.argv[1]), sys.argv[2], *map(int, sys.argv[3:6])
fam, t0 = get_family(kind), time.perf_counter()
vids = w / f"videos_{h}x{wd}_{max(48, 4 * n)}"
_build_once(str(vids), lambda tmp: write_demo_videos(tmp, 16, h, wd, max(48, 4 * n)))
def build(tmp):  # on the GPU: random init of a 0.7-2.6 B-parameter VAE takes minutes on the CPU
    torch.manual_seed(0)
    with torch.device("cuda"):
        vae = getattr(diffusers, fam.class_name)(**fam.real_config)
    vae.to(torch.bfloat16).save_pretrained(os.path.join(tmp, "vae"))
ref = w / f"ref_vae_{kind}_real_c{fam.latent_channels}"
_build_once(str(ref), build)
print(f"assets {kind}: {vids} and {ref} ready in {time.perf_counter() - t0:.0f} s")
PY
}

memory() {  # FAMILY
  local f=$1 n h w; read -r n h w <<< "$(shape "$f")"
  guard "memory $f encode" || return
  timeout -k 20 "$(limit)" python3 -m taehv_launch.cli bench step --ref-vae-type "$f" --n-frames "$n" --height "$h" --width "$w" \
    --no-step --chunk 1 --encode-micro 1 --json > "$OUT/encode_${f}_c1.json" 2> "$OUT/encode_${f}_c1.log"
  echo "memory $f encode chunk 1: exit $?"; grep "^bench row" "$OUT/encode_${f}_c1.log" | tail -1
  guard "memory $f encode chunk 2" && { timeout -k 20 "$(limit)" python3 -m taehv_launch.cli bench step --ref-vae-type "$f" \
    --n-frames "$n" --height "$h" --width "$w" --no-step --chunk 2 --encode-micro 2 --json \
    > "$OUT/encode_${f}_c2.json" 2> "$OUT/encode_${f}_c2.log"; echo "memory $f encode chunk 2: exit $?"; }
  guard "memory $f step" || return
  # the step alone (no reference encode), TAEHV of the family, base decoder, micro 1 2 4 8, no checkpointing
  timeout -k 20 "$(limit)" python3 -m taehv_launch.cli bench step --ref-vae-type "$f" --n-frames "$n" --height "$h" --width "$w" \
    --micro 1 --micro 2 --micro 4 --micro 8 --checkpointing off --encode-micro 0 --json \
    > "$OUT/step_${f}.json" 2> "$OUT/step_${f}.log"
  echo "memory $f step: exit $?"; grep "^bench row" "$OUT/step_${f}.log" | grep -v "reference encode" | cut -c1-220
}

fit_micro() {  # FAMILY -> the largest measured micro whose plan peak fits 90% of 80 GiB (8 if unmeasured)
  python3 - "$OUT" "$1" <<'PY'
import json, sys
from taehv_launch.plan import memory as m
out, f = sys.argv[1:3]
rows = []
for name in (f"step_{f}.log", f"encode_{f}_c1.log", f"encode_{f}_c2.log"):
    try:
        rows += [json.loads(l.split(": ", 1)[1]) for l in open(f"{out}/{name}") if l.startswith("bench row: ")]
    except OSError:
        pass
enc = max([r["peak_gib"] for r in rows if "chunk" in r and not r.get("oom")] or [0.0])
ok = [r["micro"] for r in rows if "checkpointing" in r and not r.get("oom")
      and m.TRAINER_OVERHEAD_GIB + max(r["peak_gib"], enc) + m.CUDA_CONTEXT_GIB <= m.HEADROOM * 80]
print(max(ok) if ok else (1 if any(r.get("oom") for r in rows) else 8))
PY
}

speed() {  # FAMILY
  local f=$1 n h w micro var; read -r n h w <<< "$(shape "$f")"
  var=MICRO_$f; micro=${!var:-$(fit_micro "$f")}; echo "$micro" > "$OUT/${f}_micro.txt"
  local vids=$W/videos_${h}x${w}_$(( 4 * n > 48 ? 4 * n : 48 )) ref=$W/ref_vae_${f}_real_c$(python3 -c "from taehv_launch.plan.families import get_family as g; print(g('$f').latent_channels)")
  local common=(--set ref_vae_type="'$f'" --set data_root="'$vids'" --set ref_vae_path="'$ref'" --set output_dir="'$W/output'"
    --set height=$h --set width=$w --set micro_batch_size=$micro --set gradient_accumulation_steps=1
    --set max_train_steps=$STEPS --set log_every=5 --set validation_steps=100000 --set checkpointing_steps=100000
    --set lr_warmup_steps=1 --set compile="'$COMPILE'")
  run_row() {  # NAME [args]
    local name=$1 t0=$SECONDS; shift
    guard "speed $name" || return 1
    timeout -k 20 "$(limit)" python3 -m taehv_launch.cli "$@" > "$OUT/$name.log" 2>&1; local rc=$?
    echo "speed $name (micro $micro): exit $rc, $((SECONDS - t0)) s"; grep -E "^step|rror|Killed|out of memory" "$OUT/$name.log" | tail -3
    cp "$W/output/$name/speed.json" "$OUT/$name.speed.json" 2>/dev/null; cp "$W/output/$name/cache_speed.json" "$OUT/$name.cache_speed.json" 2>/dev/null
    return $rc
  }
  run_row "${f}_online" 1 h100 --run-name "${f}_online" "${common[@]}"
  rm -rf "$W/lc_$f"
  run_row "${f}_cache" cache 1 h100 --views 1 --run-name "${f}_cache" --set latent_cache="'$W/lc_$f'" "${common[@]}" &&
    run_row "${f}_cached" 1 h100 --run-name "${f}_cached" --set latent_cache="'$W/lc_$f'" "${common[@]}"
}

for f in $FAMILIES; do
  read -r n h w <<< "$(shape "$f")" || { echo "$f: not a family"; continue; }
  guard "assets $f" && assets "$f" "$n" "$h" "$w"
done
[[ " $PHASES " == *" memory "* ]] && for f in $FAMILIES; do memory "$f"; done
[[ " $PHASES " == *" speed "* ]] && for f in $FAMILIES; do speed "$f"; done

python3 - "$OUT" $FAMILIES <<'PY' | tee "$OUT/summary.txt"
import json, os, sys
out, fams = sys.argv[1], sys.argv[2:]
def rows(name):
    try:
        return [json.loads(l.split(": ", 1)[1]) for l in open(os.path.join(out, name)) if l.startswith("bench row: ")]
    except OSError:
        return []
def speed(name):
    try:
        return json.load(open(os.path.join(out, f"{name}.speed.json")))
    except (OSError, ValueError):
        return {}
g = lambda r: "OOM" if r.get("oom") else f"{r['peak_gib']:.2f}"
print("| family | encode 1 clip c1: GiB / s | 2 clips c2: GiB / s | step peak GiB micro 1/2/4/8 (base, no ckpt) | micro run | clips/s online | clips/s cached | peak alloc GiB online / cached |")
print("|---|---|---|---|---|---|---|---|")
for f in fams:
    e1, e2 = (rows(f"encode_{f}_c{c}.log")[:1] for c in (1, 2))
    enc = lambda e: (g(e[0]) + (f" / {e[0]['seconds']:.2f}" if not e[0].get("oom") else "")) if e else "-"
    step = {r["micro"]: g(r) for r in rows(f"step_{f}.log") if "checkpointing" in r}
    on, ca = speed(f"{f}_online"), speed(f"{f}_cached")
    micro = open(os.path.join(out, f"{f}_micro.txt")).read().strip() if os.path.isfile(os.path.join(out, f"{f}_micro.txt")) else "-"
    cps = lambda s: f"{s['clips_per_s_per_gpu']:.2f}" if s.get("clips_per_s_per_gpu") else "-"
    pk = lambda s: f"{s['peak_allocated_gib']:.1f}" if s.get("peak_allocated_gib") else "-"
    print(f"| {f} | {enc(e1)} | {enc(e2)} | {' / '.join(step.get(m, '-') for m in (1, 2, 4, 8))} | {micro} | {cps(on)} | {cps(ca)} | {pk(on)} / {pk(ca)} |")
PY
echo "total ${SECONDS}s; skipped rows: $(cat "$OUT/skipped.txt" 2>/dev/null | wc -l)"
