#!/usr/bin/env bash
# Tensor parallelism's memory and traffic per rank, measured, beside the
# formulas: gpt2-124m (seq_len 256, 2 sequences a micro-batch, ddp, fp32,
# one data rank) trained STEPS steps at tensor 1, 2 and 4; for each the
# device's measured peak per rank of parameters, optimizer state and
# activations in the last step (metrics.jsonl), the parameter bytes of
# ztrain's split and of Megatron-LM's formula, and the all-reduce bytes
# of the step over all ranks against the per-layer formula.
#
# Formulas (L layers, C width, V vocabulary, P positions, T degree, 4
# bytes an element):
#   ours: L (12 C^2 + 7 C) / T + L 6 C + V_T C + P C + 2 C, where V_T is
#     the largest vocabulary part, ceil(V / T) (the blocks' split
#     projections with their split biases, the vocabulary-parallel tied
#     embedding; norms, row-parallel biases, positions and the final norm
#     whole);
#   Megatron-LM's (its theoretical memory): the same with every split
#     weight divided by T exactly, (L (12 C^2 + 7 C) + V C) / T + ...;
#     they differ by the part of a row a padded vocabulary would spread;
#   all-reduce bytes a step (ring, all ranks): 2 (T - 1) x 4 x (N C (4 L
#     + 2) + 3 N) for N tokens a micro-step, plus the gradient norm's and
#     the step agreement's few floats.
# Then the same at tensor 2 and 4 with [parallel] tensor_sequence
# (Megatron's sequence parallelism): the activations, and the bytes of the
# step's all-gathers, reduce-scatters and all-reduces against tensor
# parallelism's all-reduces alone.
# These are byte counts, not timings: the two cores of this machine are
# oversubscribed at tensor 4.
#
# usage: bench/bench_tensor_memory.sh [BUILD_DIR] [STEPS]
#   defaults: build, 2
set -euo pipefail
build=${1:-build}
steps=${2:-2}
here=$(cd "$(dirname "$0")/.." && pwd)
ztrain=$(cd "$build" && pwd)/bin/ztrain
config=$here/configs/run.toml
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

L=12 C=768 V=50257 P=256 N=512
model=(--model gpt2-124m --set model.seq_len=$P --set train.micro_batch_size=2
  --set train.global_batch_size=2 --set train.steps="$steps" --set train.log_every=1
  --set train.eval_every=0 --set train.save_final=false)

# peak NAME CATEGORY: the worst rank's measured device peak of CATEGORY
peak() {
  grep '"split": "train"' "$out/$1/metrics.jsonl" | tail -n 1 |
    sed -n "s/.*\"device\": {[^}]*\"$2\": \([0-9]*\).*/\1/p"
}
# comm_bytes NAME KIND...: the last step's bytes over all ranks of the
# collectives of those kinds
comm_bytes() {
  python3 - "$out/$1/metrics.jsonl" "${@:2}" << 'PY'
import json, sys
last = [json.loads(l) for l in open(sys.argv[1]) if '"split": "train"' in l][-1]
print(sum(last.get("comm", {}).get(k, {}).get("bytes", 0) for k in sys.argv[2:]))
PY
}
# train NAME T ARGS...: gpt2-124m at tensor T into $out/NAME
train() {
  local name=$1 t=$2
  shift 2
  "$ztrain" --nproc "$t" "${model[@]}" --set parallel.tensor="$t" --set train.out_dir="$out/$name" \
    "$@" "$config" > "$out/$name.log" 2>&1 || { cat "$out/$name.log" >&2; exit 1; }
}

printf "%-6s %14s %14s %14s %14s %14s %14s %14s\n" tensor params ours megatron optimizer \
  activations "all-reduce" "its formula"
for t in 1 2 4; do
  name=t$t
  train $name $t
  ours=$((4 * (L * (12 * C * C + 7 * C) / t + L * 6 * C + (V + t - 1) / t * C + P * C + 2 * C)))
  megatron=$(python3 -c "print(round(4 * (($L * (12 * $C**2 + 7 * $C) + $V * $C) / $t + $L * 6 * $C + $P * $C + 2 * $C)))")
  traffic=0
  [ "$t" -gt 1 ] &&
    traffic=$((2 * (t - 1) * 4 * (N * C * (4 * L + 2) + 3 * N) + 4 * (2 * (t - 1) + 2 * (t - 1) * 3)))
  printf "%-6s %14s %14s %14s %14s %14s %14s %14s\n" "$t" "$(peak $name params)" "$ours" \
    "$megatron" "$(peak $name optimizer)" "$(peak $name activations)" \
    "$(comm_bytes $name all_reduce)" "$traffic"
done
echo
printf "%-6s %14s %14s %18s %18s\n" tensor activations "tensor alone" "bytes moved" "tensor alone"
for t in 2 4; do
  train sp$t $t --set parallel.tensor_sequence=true
  printf "%-6s %14s %14s %18s %18s\n" "$t" "$(peak sp$t activations)" "$(peak t$t activations)" \
    "$(comm_bytes sp$t all_reduce all_gather reduce_scatter)" "$(comm_bytes t$t all_reduce)"
done
