#!/usr/bin/env bash
# Training on one GPU, the issue's figures, as rows of gpu_check.sh's table:
#   - model FLOP/s utilisation (MFU) of gpt2-124m and a GPT-2 350M shape
#     (24 layers, width 1024, 16 heads) in bf16 under ddp at world 1,
#     against the card's dense bf16 peak (median of steps 3 to 10);
#   - tokens/s of zero3_offload against zero3 on gpt2-124m in bf16;
#   - the largest Llama-shaped model (the 7B's width, n_layer searched)
#     that zero3 and zero3_offload fit on this card and this machine's RAM,
#     by `ztrain estimate` (device tier under 90 % of the card, host tier
#     under 70 % of RAM, activation checkpointing on), then one training
#     step at each size to show it holds (peak device bytes measured).
#
# usage: bench/bench_gpu_train.sh BIN_DIR [PEAK_BF16_TFLOPS]
#   BIN_DIR holds bin/ztrain (a build or an unpacked gpu bundle).
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
bin=$1/bin
peak=${2:-989}
scratch=$(mktemp -d "${TMPDIR:-/tmp}/ztrain-gpu-train.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
row() { echo "| $1 | $2 | $3 |"; }
gpu_bytes=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2> /dev/null | head -1)
gpu_bytes=$(( ${gpu_bytes:-0} * 1024 * 1024 ))
ram_bytes=$(awk '/MemTotal/ { print $2 * 1024 }' /proc/meminfo)

# median FIELD METRICS: the median of FIELD over training steps 3 and on.
median() {
  grep '"split": "train"' "$2" | sed -n "s/.*\"step\": \([0-9]*\),.*\"$1\": \([^,]*\),.*/\1 \2/p" |
    awk '$1 >= 3 { print $2 }' | sort -g | awk '{ v[NR] = $1 } END { print (NR ? v[int((NR + 1) / 2)] : 0) }'
}
# train NAME ARGS...: 10 bf16 steps on the GPU; its metrics in $scratch/NAME.
train() {
  local name=$1
  shift
  "$bin/ztrain" --set device.kind=cuda --set train.precision=bf16 --set train.steps=10 \
    --set train.eval_every=0 --set train.save_final=false --set train.log_every=1 \
    --set train.out_dir="$scratch/$name" "$@" "$src/configs/run.toml" > "$scratch/$name.out" 2>&1
}

gpt350=(--model gpt2-124m --set model.n_layer=24 --set model.n_embd=1024 --set model.n_head=16)
for m in "gpt2-124m:--model gpt2-124m" "gpt2-350m:${gpt350[*]}"; do
  name=${m%%:*}
  read -r -a args <<< "${m#*:}"
  if train "mfu-$name" "${args[@]}" --set model.seq_len=1024 --set train.micro_batch_size=16 \
    --set train.global_batch_size=16 --strategy ddp; then
    flops=$(median flops_per_s "$scratch/mfu-$name/metrics.jsonl")
    row "MFU $name bf16 (B=16, T=1024, ddp)" \
      "$(awk -v f="$flops" -v p="$peak" 'BEGIN { printf "%.1f %%", 100 * f / (p * 1e12) }')" \
      "$(awk -v f="$flops" 'BEGIN { printf "%.1f", f / 1e12 }') TFLOP/s of $peak (goal >= 50 %)"
  else
    row "MFU $name bf16" "FAILED" "$(grep -m1 -i error "$scratch/mfu-$name.out" | cut -c1-150)"
  fi
done

declare -A rate
for s in zero3 zero3_offload; do
  if train "rate-$s" --model gpt2-124m --set model.seq_len=1024 --set train.micro_batch_size=8 \
    --set train.global_batch_size=8 --strategy "$s"; then
    rate[$s]=$(median tokens_per_s "$scratch/rate-$s/metrics.jsonl")
  else
    rate[$s]=0
    row "$s gpt2-124m bf16" "FAILED" "$(grep -m1 -i error "$scratch/rate-$s.out" | cut -c1-150)"
  fi
done
row "zero3_offload vs zero3, gpt2-124m bf16" \
  "$(awk -v a="${rate[zero3_offload]}" -v b="${rate[zero3]}" 'BEGIN { printf "%.2f", b ? a / b : 0 }')" \
  "${rate[zero3_offload]} vs ${rate[zero3]} tokens/s"

# The largest n_layer of the 7B's width each strategy fits, by estimate.
llama=(--model llama-7b --set model.seq_len=1024 --set train.micro_batch_size=1
  --set train.global_batch_size=1 --set train.precision=bf16 --set model.activation_checkpointing=true)
fits() {  # fits STRATEGY N_LAYER
  "$bin/ztrain" estimate "${llama[@]}" --set model.n_layer="$2" --strategy "$1" \
    "$src/configs/run.toml" > "$scratch/est" 2>&1 || return 1
  awk -v g="$gpu_bytes" -v r="$ram_bytes" '
    $1 == "device" && $2 == "total" { d = $3 } $1 == "host" && $2 == "total" { h = $3 }
    END { exit !(d <= 0.9 * g && h <= 0.7 * r) }' "$scratch/est"
}
for s in zero3 zero3_offload; do
  best=0
  for n in 1 2 4 8 12 16 24 32 40 48 64 80 96 128; do fits "$s" "$n" && best=$n || break; done
  if [ "$best" -eq 0 ]; then
    row "largest llama ($s)" "none" "not even one layer of the 7B's width fits"
    continue
  fi
  "$bin/ztrain" estimate "${llama[@]}" --set model.n_layer="$best" --strategy "$s" \
    "$src/configs/run.toml" > "$scratch/est" 2>&1
  params=$(sed -n 's/.*(llama, \([0-9]*\) params).*/\1/p' "$scratch/est" | head -1)
  if timeout 150 "$bin/ztrain" --set device.kind=cuda "${llama[@]}" --set model.n_layer="$best" \
    --strategy "$s" --set train.steps=1 --set train.eval_every=0 --set train.save_final=false \
    --set train.out_dir="$scratch/big-$s" "$src/configs/run.toml" > "$scratch/big-$s.out" 2>&1; then
    peak_dev=$(grep -o '"device": {[^}]*"total": [0-9]*' "$scratch/big-$s/metrics.jsonl" | tail -1 |
      grep -o '[0-9]*$')
    row "largest llama ($s)" "$best layers, $(awk -v p="$params" 'BEGIN { printf "%.2fB", p / 1e9 }') params" \
      "trained a step; device peak $(awk -v b="$peak_dev" 'BEGIN { printf "%.1f GiB", b / 2^30 }')"
  else
    row "largest llama ($s)" "FAILED at $best layers" "$(grep -m1 -i -E "error|memory" "$scratch/big-$s.out" | cut -c1-150)"
  fi
done
