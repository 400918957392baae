# Sourced by the GPU row scripts (gpu_gop_alt.sh, gpu_convert_ab.sh, gpu_nv12_ab.sh, gpu_decode_levers.sh,
# gpu_seek_ab.sh, ...): one
# training row from a latent cache at the h100 defaults, and its line of the table. Needs W (work folder: sets,
# caches, reference VAE, output), OUT (evidence folder) and start (the call's start, seconds since the epoch).
# work_lock, first thing in a script: refuses a SRC_DIR that is not a folder and a second copy on the same W.
# device_site: the carried wheels (.whl/), PyNvVideoCodec (.whl-nv/) and PyAV (.whl-av/) into /tmp/site, once per
# machine, and PYTHONPATH on it and src/ (needs no W or OUT; gpu_gop.sh and the scripts that skip it call it).
# call_start and cached_sets: the start of the scripts that train their own rows from gpu_gop.sh's sets.

row() {  # NAME SET [extra --set ...]: 40 steps at accumulation 1 from $W/lc_SET; ROW_ENV names a variable to echo;
  # ROW_PROFILE: the profile (h100)
  local name=$1 set=$2 rc; shift 2
  python3 -m taehv_launch.cli 1 "${ROW_PROFILE:-h100}" --run-name "$name" --set data_root="'$W/$set'" \
    --set ref_vae_path="'$W/ref_vae_cogvideox_real_c16'" --set output_dir="'$W/output'" --set latent_cache="'$W/lc_$set'" \
    --set max_train_steps=40 --set log_every=5 --set gradient_accumulation_steps=1 --set validation_steps=100000 \
    --set checkpointing_steps=100000 --set lr_warmup_steps=1 "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  echo "$name${ROW_ENV:+ ($ROW_ENV=${!ROW_ENV:-})}: exit $rc after $(( $(date +%s) - start )) s"
  cp "$W/output/$name/speed.json" "$OUT/$name.speed.json" 2>/dev/null
}

row_line() {  # NAME: "| NAME | clips/s | peak reserved GiB |" from its speed.json, also into rows.md; 1 when none
  [ -f "$OUT/$1.speed.json" ] || return 1
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('|', sys.argv[2], '|', round(d['clips_per_s'], 2), '|', \
round(d['peak_reserved_gib'], 1), '|')" "$OUT/$1.speed.json" "$1" | tee -a "$OUT/rows.md"
}

work_lock() {  # SCRIPT SRC: SRC a folder, and W taken by this call alone (a second copy would reuse its run names)
  [ -d "$2" ] || { echo "error: $1: SRC_DIR ${2@Q} is not a folder: give the folder of sample videos" >&2; exit 2; }
  mkdir -p "$W" || exit 2
  exec 9> "$W/.rows.lock"
  if command -v flock > /dev/null && ! flock -n 9; then
    echo "error: $1: another call is using $W: wait for it, or give this one its own W=" >&2; exit 2
  fi
}

device_site() {  # 1 when an install fails
  if [ ! -d /tmp/site/PyNvVideoCodec ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || return 1
    tar -xJf .whl-nv/nv.tar.xz -C /tmp/site || return 1
  fi
  export PYTHONPATH=/tmp/site:$PWD/src
  python3 -c "import av" 2>/dev/null && return 0
  if [ -f .whl-av/av.tar.xz ]; then tar -xJf .whl-av/av.tar.xz -C /tmp/site
  else python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl-av/av-*.whl
  fi
}

call_start() {  # SCRIPT SRC FOLDER: W locked, the carried wheels installed; the evidence goes to $OUT/FOLDER and is
  # packed into $OUT/FOLDER.tgz on exit, even when the call's limit kills it (the device returns 8 files). Sets R
  # (the outer OUT), OUT, PACKED and start.
  work_lock "$1" "$2"
  R=$OUT; PACKED=$3; OUT=$R/$3; mkdir -p "$OUT"; start=$(date +%s)
  trap pack EXIT
  device_site || { echo "error: $1: the carried wheels did not install" >&2; exit 1; }
  export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
}

pack() {  # call_start's archive, paths scrubbed
  OUT="$OUT" python3 scripts/scrub_paths.py "$OUT" > /dev/null
  tar czf "$R/$PACKED.tgz" -C "$R" "$PACKED"
}

cached_sets() {  # SRC: gpu_gop.sh's 480p and long-GOP 1080p sets and their latent caches, no training row
  CACHE_ONLY=1 LOADER=0 SETS="v480 v1080" OUT="$OUT" W="$W" bash scripts/gpu_gop.sh "$1" 2>&1 | grep -E "exit|written"
}
