#!/usr/bin/env bash
# ZeRO-Infinity against DeepSpeed's on this CPU (issue 34): the same Llama
# (configs/examples/llama_nvme.toml's shape at LAYERS layers, 1 x SEQ
# tokens a step, bf16, parameters and optimizer state in swap files under
# NVME_DIR, world 1, 2 threads), ztrain's zero3_nvme and DeepSpeed 0.19's
# (bench/deepspeed_infinity.py, with the two settings without which it
# fails on its second step, and sub_group_size 1e8 where its 1e9 default
# runs out of RAM), alternating for ROUNDS rounds. Prints each
# run's median step after the first, peak RSS, and ztrain's speed against
# DeepSpeed's from the better rounds.
#
#   bench/bench_nvme_peer.sh [BUILD_DIR] [PYTHON] [LAYERS] [SEQ] [STEPS] [ROUNDS] [NVME_DIR]
# PYTHON: an interpreter with torch, transformers and deepspeed (and
# libaio for DeepSpeed's async_io op).
set -euo pipefail
build=${1:-build}
python=${2:-python3}
layers=${3:-8}
seq=${4:-128}
steps=${5:-3}
rounds=${6:-1}
nvme=${7:-/var/tmp/ztrain-nvme-peer}
src=$(cd "$(dirname "$0")/.." && pwd)
ztrain=$(realpath "$build/bin/ztrain")
out=$(mktemp -d)
mkdir -p "$nvme/ztrain" "$nvme/deepspeed"
trap 'rm -rf "$out" "$nvme/ztrain" "$nvme/deepspeed"' EXIT

ours() {  # ours ROUND
  /usr/bin/time -f '%M' -o "$out/ours.$1.rss" "$ztrain" --set model.n_layer="$layers" \
    --set model.seq_len="$seq" --set train.steps="$steps" --set device.threads=2 \
    --set strategy.offload_optimizer.nvme_path="$nvme/ztrain" \
    --set strategy.offload_param.nvme_path="$nvme/ztrain" --set train.out_dir="$out/run.$1" \
    "$src/configs/examples/llama_nvme.toml" > "$out/ours.$1.log" 2>&1 || {
    cat "$out/ours.$1.log"
    exit 1
  }
  grep '"split": "train"' "$out/run.$1/metrics.jsonl" | tail -n +2 |
    sed -n 's/.*"step_time_s": \([0-9.e+-]*\).*/\1/p' | sort -g |
    awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }' > "$out/ours.$1.step"
}
theirs() {  # theirs ROUND
  "$python" "$src/bench/deepspeed_infinity.py" --layers "$layers" --seq "$seq" --steps "$steps" \
    --nvme-path "$nvme/deepspeed" > "$out/theirs.$1.log" 2>&1 || {
    tail -n 40 "$out/theirs.$1.log"
    exit 1
  }
  rm -rf "${nvme:?}/deepspeed/"*
  sed -n 's/^RESULT .*"median_step_s": \([0-9.]*\).*/\1/p' "$out/theirs.$1.log" > "$out/theirs.$1.step"
}
for r in $(seq "$rounds"); do
  ours "$r"
  printf 'round %d: ztrain %.2f s/step (peak RSS %.2f GiB)\n' "$r" "$(cat "$out/ours.$r.step")" \
    "$(awk '{ print $1 / 2^20 }' "$out/ours.$r.rss")"
  theirs "$r"
  printf 'round %d: DeepSpeed %.2f s/step (%s)\n' "$r" "$(cat "$out/theirs.$r.step")" \
    "$(grep -o '"peak_rss_gib": [0-9.]*' "$out/theirs.$r.log")"
done
params=$(grep -o '"params": [0-9]*' "$out/theirs.1.log" | cut -d' ' -f2)
best() { sort -g | head -n 1; }
a=$(cat "$out"/ours.*.step | best)
b=$(cat "$out"/theirs.*.step | best)
awk -v a="$a" -v b="$b" -v p="$params" -v l="$layers" -v s="$seq" 'BEGIN {
  printf "%d layers (%.2fB parameters), 1 x %d tokens: ztrain %.2f s/step, DeepSpeed %.2f s/step: %.2fx\n",
    l, p / 1e9, s, a, b, b / a }'
