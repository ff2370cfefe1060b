#!/usr/bin/env bash
# The offload strategies on gpt2-124m (fp32, 4 sequences of 64 tokens per
# rank and micro-step), in one script:
#  - at world 2 (2 ranks x 1 thread) and world 1 (1 rank x 2 threads):
#    zero3, zero3_offload, zero3_nvme and zero3_nvme_params (zero3_nvme
#    with offload_param.device = "nvme": the parameter shards in swap files
#    too), and zero2_offload at world 2,
#    step time as a ratio to zero3's, tokens/s, and the peak bytes per rank
#    in each tier;
#  - at world 2, DeepSpeed's ZeRO-2 and ZeRO-3 with CPU offload
#    (bench/deepspeed_step.py: the same model shape, batch, optimizer and
#    clipping, on the same cores), and ztrain's tokens/s against theirs
#    (goal: >= 1.5x). Skipped when PYTHON has no deepspeed.
# zero3_nvme keeps its swap files under NVME_DIR, which must be on a disk
# (not tmpfs). On the cpu device ztrain's offload copies nothing (host and
# device are the same RAM) while DeepSpeed's copies gradients and
# parameters between its buffers: the comparison is of what each framework
# does on this machine, not of a GPU's transfers. Runs alternate between
# variants; with ROUNDS > 1 each step time is the better round's.
#
#   bench/bench_offload.sh [BUILD_DIR] [PYTHON] [STEPS] [NVME_DIR] [ROUNDS]
set -euo pipefail
build=${1:-build}
python=${2:-python3}
steps=${3:-8}
nvme=${4:-$PWD/nvme-bench}
rounds=${5:-1}
src=$(cd "$(dirname "$0")/.." && pwd)
ztrain=$(realpath "$build/bin/ztrain")
out=$(mktemp -d)
mkdir -p "$nvme"
trap 'rm -rf "$out"' EXIT
common=(--model gpt2-124m --set model.seq_len=64 --set train.steps="$steps" --set train.log_every=1
  --set train.eval_every=0 --set train.save_final=false --set train.grad_accum=1
  --set train.micro_batch_size=4)
source "$src/bench/metrics.sh"

ours() {  # ours NAME WORLD VARIANT
  local name=$1 world=$2 strategy=$3 extra=()
  if [ "$strategy" = zero3_nvme_params ]; then
    strategy=zero3_nvme
    extra=(--set strategy.offload_param.device=nvme --set strategy.offload_param.nvme_path="$nvme")
  fi
  if [ "$strategy" = zero3_nvme ]; then
    extra+=(--set strategy.offload_optimizer.nvme_path="$nvme")
  fi
  "$ztrain" --nproc "$world" "${common[@]}" --set device.threads=$((2 / world)) \
    --strategy "$strategy" --set train.out_dir="$out/$name" "${extra[@]}" \
    "$src/configs/run.toml" > "$out/$name.log" 2>&1 || { cat "$out/$name.log"; exit 1; }
}
have_deepspeed=false
"$python" -c "import deepspeed, transformers" 2> /dev/null && have_deepspeed=true
theirs() {  # theirs NAME STAGE
  "$python" "$src/bench/deepspeed_step.py" --stage "$2" --offload --world 2 --threads 1 \
    --batch 4 --seq 64 --steps "$steps" > "$out/$1.log" 2>&1 || { cat "$out/$1.log"; exit 1; }
  sed -n 's/^RESULT .*"median_step_s": \([0-9.]*\).*/\1/p' "$out/$1.log" > "$out/$1.step"
}
# peak RUN TIER: the largest peak bytes of TIER over the run, in MiB.
peak() {
  grep '"split": "train"' "$out/$1/metrics.jsonl" |
    sed -n "s/.*\"$2\": {[^}]*\"total\": \([0-9]*\).*/\1/p" | sort -g | tail -n 1 |
    awk '{ printf "%.0f", $1 / 1048576 }'
}

variants=("2 zero3" "2 zero2_offload" "2 zero3_offload" "2 zero3_nvme" "2 zero3_nvme_params"
  "1 zero3" "1 zero3_offload" "1 zero3_nvme" "1 zero3_nvme_params")
for round in $(seq "$rounds"); do
  for v in "${variants[@]}"; do
    read -r world strategy <<< "$v"
    ours "$strategy.w$world.$round" "$world" "$strategy"
  done
  if $have_deepspeed; then
    theirs "ds_zero2_offload.$round" 2
    theirs "ds_zero3_offload.$round" 3
  fi
done

best_step() {  # best_step NAME: the better round's median step time
  for round in $(seq "$rounds"); do median "$1.$round" step_time_s; done | sort -g | head -n 1
}
printf "gpt2-124m, fp32, 4 x 64 tokens per rank and step, %s steps (medians of steps 3..)\n" "$steps"
printf "%-17s %5s %9s %8s %9s %10s %9s %9s\n" variant world "step (s)" tokens/s "/ zero3" "device MiB" "host MiB" "nvme MiB"
for v in "${variants[@]}"; do
  read -r world strategy <<< "$v"
  t=$(best_step "$strategy.w$world")
  z=$(best_step "zero3.w$world")
  printf "%-17s %5s %9.3f %8.1f %9.3f %10s %9s %9s\n" "$strategy" "$world" "$t" \
    "$(awk -v t="$t" -v w="$world" 'BEGIN { print w * 4 * 64 / t }')" \
    "$(awk -v a="$t" -v b="$z" 'BEGIN { print a / b }')" \
    "$(peak "$strategy.w$world.1" device)" "$(peak "$strategy.w$world.1" host)" \
    "$(peak "$strategy.w$world.1" nvme)"
done
$have_deepspeed || { echo "deepspeed not importable by $python: DeepSpeed comparison skipped"; exit 0; }
for pair in "zero2_offload ds_zero2_offload" "zero3_offload ds_zero3_offload"; do
  read -r mine peer <<< "$pair"
  t=$(best_step "$mine.w2")
  d=$(for round in $(seq "$rounds"); do cat "$out/$peer.$round.step"; done | sort -g | head -n 1)
  [ -n "$d" ] || { echo "no step time in DeepSpeed's output:"; cat "$out/$peer.1.log"; exit 1; }
  awk -v t="$t" -v d="$d" -v m="$mine" -v p="$peer" 'BEGIN {
    printf "%s %.3f s/step (%.1f tokens/s) against DeepSpeed %s %.3f s/step (%.1f tokens/s): %.2fx\n",
      m, t, 512 / t, p, d, 512 / d, d / t }'
done
