#!/usr/bin/env bash
# Initial weights (init_from) of gpt2-124m (a 494.8 MB fp32 safetensors
# file) at world 2, torchrun-style (two ranks, 1 thread each, in two
# working directories standing for two hosts), under ddp (every rank holds
# all the weights) and zero3 (each rank holds half): a 2-step run with the
# file in both directories (each rank reads its own ranges) against the
# same run with the file in rank 0's only (rank 0 reads the other rank's
# ranges and sends them). Prints the header's weights line (bytes read or
# moved), rank 0's wall seconds and the start-up the relay adds.
#
# usage: bench/bench_init_weights.sh BUILD_DIR SCRATCH_DIR
set -euo pipefail
build=$(realpath "$1")
scratch=$2
ztrain=$build/bin/ztrain
src=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$scratch/host0" "$scratch/host1"
common=(--model gpt2-124m --set train.steps=2 --set train.micro_batch_size=1 --set model.seq_len=64
  --set train.global_batch_size=2 --set train.eval_every=0 --set device.threads=1
  --set train.save_final=false --set train.log_every=1)
if [ ! -s "$scratch/init.safetensors" ]; then
  "$ztrain" --model gpt2-124m --set train.steps=1 --set model.seq_len=64 --set train.global_batch_size=1 \
    --set train.eval_every=0 --set train.out_dir="$scratch/src" --overwrite "$src/configs/run.toml" > /dev/null
  mv "$scratch/src/model.safetensors" "$scratch/init.safetensors"
fi
port=29611
# run NAME STRATEGY: the pair; rank 0's output in $scratch/NAME.0.out, its wall in $wall.
run() {
  local name=$1 strategy=$2 t0 p1
  port=$((port + 1))
  t0=$(date +%s.%N)
  (cd "$scratch/host1" && RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$ztrain" \
    "$src/configs/run.toml" > "$scratch/$name.1.out" 2>&1) &
  p1=$!
  (cd "$scratch/host0" && RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$ztrain" \
    "${common[@]}" --strategy "$strategy" --set model.init_from=init.safetensors \
    --set train.out_dir="$scratch/$name" --overwrite "$src/configs/run.toml" > "$scratch/$name.0.out" 2>&1)
  wait "$p1"
  wall=$(echo "$(date +%s.%N) - $t0" | bc)
}
printf '| strategy | the file on | weights | wall (s) |\n|---|---|---|---|\n'
for strategy in ddp zero3; do
  ln -f "$scratch/init.safetensors" "$scratch/host0/init.safetensors"
  ln -f "$scratch/init.safetensors" "$scratch/host1/init.safetensors"
  run "$strategy.shared" "$strategy"
  shared=$wall
  printf '| %s | both hosts | %s | %.2f |\n' "$strategy" \
    "$(grep -m1 -o '(each rank read.*)' "$scratch/$strategy.shared.0.out")" "$shared"
  rm "$scratch/host1/init.safetensors"
  run "$strategy.relay" "$strategy"
  printf '| %s | rank 0'"'"'s host only | %s | %.2f (+%.2f) |\n' "$strategy" \
    "$(grep -m1 -o '(read by rank 0.*)' "$scratch/$strategy.relay.0.out")" "$wall" \
    "$(echo "$wall - $shared" | bc)"
done
