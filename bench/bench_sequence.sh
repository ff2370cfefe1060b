#!/usr/bin/env bash
# Sequence parallelism (Ulysses, [parallel] sequence) and context
# parallelism (ring attention, [parallel] context) on this machine:
# 1. The longest sequence each split trains within a device budget per
#    rank: the longest multiple of 1024 tokens whose `ztrain estimate`
#    fits BUDGET, then one real step there under [device] memory_limit =
#    BUDGET (which fails the run if the device's measured peak passes it),
#    with the measured peak printed beside the estimate.
# 2. Speed: tokens per second at sequence 2 and at context 2 (2 ranks of 1
#    thread each) against the unsharded run (1 rank of 2 threads) at one
#    length, alternated three times so a slow minute moves every side.
#
# usage: bench/bench_sequence.sh [BUILD_DIR] [BUDGET] [SPEED_TOKENS]
#   defaults: build, 256MiB, 4096
set -euo pipefail
build=${1:-build}
budget=${2:-256MiB}
speed_tokens=${3:-4096}
here=$(cd "$(dirname "$0")/.." && pwd)
ztrain=$(cd "$build" && pwd)/bin/ztrain
config=$here/configs/run.toml
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none)

model=(--model llama-tiny --set model.n_layer=2 --set model.activation_checkpointing=true
  --set train.global_batch_size=1 --set train.save_final=false --set train.eval_every=0
  --set train.log_every=1)

# fits KEY S T: whether the estimate of [parallel] KEY = S at T tokens fits
# the budget
budget_bytes=$(python3 -c "
u = {'KiB': 2**10, 'MiB': 2**20, 'GiB': 2**30}
b = '$budget'
print(int(float(b[:-3]) * u[b[-3:]]))")
fits() {
  local total
  total=$("$ztrain" estimate --world "$2" "${model[@]}" --set model.seq_len="$3" \
    --set parallel."$1"="$2" "$config" 2> /dev/null |
    awk '$1 == "device" && $2 == "total" { print $3 }')
  [ -n "$total" ] && [ "$total" -le "$budget_bytes" ]
}
# peak NAME CATEGORY: the worst rank's measured device peak of CATEGORY
peak() {
  grep '"split": "train"' "$out/$1/metrics.jsonl" | tail -n 1 |
    sed -n "s/.*\"device\": {[^}]*\"$2\": \([0-9]*\).*/\1/p"
}

echo "1. the longest sequence within $budget of device memory per rank (llama-tiny, 2 layers, checkpointing)"
printf "%-12s %9s %16s %16s %10s\n" split tokens "estimate total" "measured total" "step s"
for split in "sequence 1" "sequence 2" "sequence 4" "context 2" "context 4"; do
  read -r key s <<< "$split"
  name="longest_${key}_$s"
  t=1024
  while fits "$key" "$s" $((2 * t)); do t=$((2 * t)); done
  step=$((t / 2))
  while [ "$step" -ge 1024 ]; do
    if fits "$key" "$s" $((t + step)); then t=$((t + step)); fi
    step=$((step / 2))
  done
  estimate=$("$ztrain" estimate --world "$s" "${model[@]}" --set model.seq_len="$t" \
    --set parallel."$key"="$s" "$config" | awk '$1 == "device" && $2 == "total" { print $3 }')
  run=("$ztrain" "${model[@]}" --set model.seq_len="$t" --set parallel."$key"="$s"
    --set train.steps=1 --set device.memory_limit="$budget" --set device.threads=$((2 / (s > 2 ? 2 : s)))
    --set train.out_dir="$out/$name" "$config")
  start=$(date +%s.%N)
  if [ "$s" -eq 1 ]; then "${run[@]}" > "$out/$name.out" 2>&1; else
    "${mpirun[@]}" -np "$s" "${run[@]}" > "$out/$name.out" 2>&1
  fi || { tail -n 5 "$out/$name.out"; echo "the run at $t tokens failed"; exit 1; }
  seconds=$(echo "$(date +%s.%N) - $start" | bc)
  printf "%-12s %9s %16s %16s %10.1f\n" "$split" "$t" "$estimate" "$(peak "$name" total)" "$seconds"
done

echo
echo "2. tokens/s at $speed_tokens tokens: sequence 2 and context 2 (2 ranks x 1 thread) against one rank (2 threads)"
speed=(--set model.seq_len="$speed_tokens" --set train.steps=6)
tps() {  # tps NAME: the run's tokens per second, from its summary line
  python3 -c "
import re, sys
m = re.search(r'^done: .*? \| ([0-9.]+)([kMG]?) tok/s', open(sys.argv[1]).read(), re.M)
print(float(m.group(1)) * {'': 1, 'k': 1e3, 'M': 1e6, 'G': 1e9}[m.group(2)])" "$out/$1.out"
}
for round in 1 2 3; do
  "$ztrain" "${model[@]}" "${speed[@]}" --set device.threads=2 --set train.out_dir="$out/one_$round" \
    "$config" > "$out/one_$round.out" 2>&1
  for key in sequence context; do
    "${mpirun[@]}" -np 2 "$ztrain" "${model[@]}" "${speed[@]}" --set parallel.$key=2 \
      --set device.threads=1 --set train.out_dir="$out/${key}_$round" "$config" \
      > "$out/${key}_$round.out" 2>&1
  done
  one=$(tps "one_$round") ulysses=$(tps "sequence_$round") ring=$(tps "context_$round")
  printf "round %d: one rank %.0f tok/s; sequence 2 %.0f tok/s, ratio %.3f; context 2 %.0f tok/s, ratio %.3f\n" \
    "$round" "$one" "$ulysses" "$(echo "$ulysses / $one" | bc -l)" "$ring" "$(echo "$ring / $one" | bc -l)"
done
