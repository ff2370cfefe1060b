#!/usr/bin/env bash
# Activations kept in bf16 against kept in fp32 ([train] activation_dtype),
# both bf16 runs, on this machine:
# 1. Memory: the measured device peak of activations of one step of a
#    llama-tiny at TOKENS tokens, 8 and 16 layers, checkpointing off and
#    on, each kind's bytes per further layer, and the ratios.
# 2. Speed: the median step time of the same model (8 layers,
#    checkpointing off; 128 wide, and 512) kept in fp32 and in bf16,
#    alternated three times so a slow minute moves both sides; the ratio
#    bf16 / fp32 per round. The conversions grow with the width, the
#    matmuls with its square.
#
# usage: bench/bench_activation_dtype.sh [BUILD_DIR] [TOKENS]
#   defaults: build, 2048
set -euo pipefail
build=${1:-build}
tokens=${2:-2048}
here=$(cd "$(dirname "$0")/.." && pwd)
ztrain=$(cd "$build" && pwd)/bin/ztrain
config=$here/configs/run.toml
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

model=(--model llama-tiny --set model.n_kv_head=4 --set model.seq_len="$tokens"
  --set train.global_batch_size=1 --set train.save_final=false --set train.eval_every=0
  --set train.log_every=1 --set train.precision=bf16 --set device.threads=2)
# peak NAME: the measured device peak of activations
peak() {
  grep '"split": "train"' "$out/$1/metrics.jsonl" | tail -n 1 |
    sed -n 's/.*"device": {[^}]*"activations": \([0-9]*\).*/\1/p'
}
run() {  # run NAME ARGS...
  local name=$1
  shift
  "$ztrain" "${model[@]}" "$@" --set train.out_dir="$out/$name" "$config" > "$out/$name.out" 2>&1 ||
    { tail -n 5 "$out/$name.out"; echo "run $name failed"; exit 1; }
}

echo "1. activations of one step at $tokens tokens (llama-tiny, bf16 weights), bytes"
printf "%-14s %-6s %14s %14s %16s\n" checkpointing kept "8 layers" "16 layers" "per layer"
declare -A per
for ckpt in false true; do
  for kept in fp32 bf16; do
    for layers in 8 16; do
      run "m_${ckpt}_${kept}_$layers" --set model.n_layer="$layers" --set train.steps=1 \
        --set train.activation_dtype="$kept" --set model.activation_checkpointing="$ckpt"
    done
    a8=$(peak "m_${ckpt}_${kept}_8") a16=$(peak "m_${ckpt}_${kept}_16")
    per[$ckpt$kept]=$(((a16 - a8) / 8))
    printf "%-14s %-6s %14d %14d %16d\n" "$ckpt" "$kept" "$a8" "$a16" "${per[$ckpt$kept]}"
  done
  printf "%-14s bf16 / fp32: 16 layers %.3f, per layer %.3f\n" "$ckpt" \
    "$(echo "$(peak "m_${ckpt}_bf16_16") / $(peak "m_${ckpt}_fp32_16")" | bc -l)" \
    "$(echo "${per[${ckpt}bf16]} / ${per[${ckpt}fp32]}" | bc -l)"
done

echo
echo "2. seconds a step at $tokens tokens, 8 layers 128 and 512 wide, 2 threads (median of steps 3-12): kept in bf16 against kept in fp32"
step_s() {  # step_s NAME: the median step time of steps 3 on
  python3 -c "
import json, statistics, sys
t = [r['step_time_s'] for r in map(json.loads, open(sys.argv[1]))
     if r.get('split') == 'train' and r['step'] >= 3]
print(statistics.median(t))" "$out/$1/metrics.jsonl"
}
for width in 128 512; do
  for round in 1 2 3; do
    for kept in fp32 bf16; do
      run "s_${width}_${kept}_$round" --set model.n_layer=8 --set model.n_embd="$width" \
        --set train.steps=12 --set train.activation_dtype="$kept"
    done
    f=$(step_s "s_${width}_fp32_$round") b=$(step_s "s_${width}_bf16_$round")
    printf "width %d, round %d: fp32 kept %.4f s, bf16 kept %.4f s, ratio %.3f\n" "$width" "$round" \
      "$f" "$b" "$(echo "$b / $f" | bc -l)"
  done
done
