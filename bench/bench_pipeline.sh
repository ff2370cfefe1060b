#!/usr/bin/env bash
# Pipeline parallelism, measured: memory per rank beside the formulas, the
# bytes between stages, and the time each stage idles in a step.
#
# Memory: gpt2-124m (seq_len 256, 2 sequences a micro-batch, 4
# micro-batches, ddp, fp32, one data rank) trained STEPS steps at
# pipeline 1, 2 and 4 (the `parameters` partition); the worst rank's
# measured peak of parameters and optimizer state, and the parameters of
# its stage by the formula both Megatron-LM and DeepSpeed's PipelineModule
# use for the same cut: the stage's blocks (12 C^2 + 13 C each), the
# embedding on the first stage (V C + P C), the final norm (2 C) and a copy
# of the tied embedding (V C) on the last; and the worst rank's measured
# activations (1F1B's first stage holds P micro-batches of its L / P
# blocks: about one whole model's micro-batch, as Megatron's formula has
# it, plus the buffers between stages). The broadcast bytes between
# stages a step: 2 (P - 1) M N C 4 (each micro-batch's activation forward
# and gradient back across each boundary).
#
# Idle time: a model whose stages cost alike (Llama, 8 blocks of 256,
# vocabulary 64, seq_len 256, the `uniform` partition: the embedding and
# 4 blocks, 4 blocks and the head; the head's share of the last stage's
# work is under 1 %, as the formula assumes none; at vocabulary 512 it is
# about 3 %, and the first stage idles that much more) at pipeline 2 and 4, 1F1B and GPipe
# over 4 and 8 micro-batches: each stage's share of the step's schedule
# (the longest stage's span) spent not computing (metrics.jsonl's
# pipeline_idle), the median over the steps after the first, beside
# (P - 1) / (M + P - 1), and the last stage's computing time over the
# first's (from the same shares: (1 - idle) each). Each rank runs one thread: pipeline 4 needs 4
# free cores, and where the machine has fewer its figures measure the
# operating system's scheduler, not the pipeline, and are printed marked.
#
# usage: bench/bench_pipeline.sh [BUILD_DIR] [STEPS] [PARTS]
#   defaults: build, 6, "memory idle" (either part alone: memory, idle)
set -euo pipefail
build=${1:-build}
steps=${2:-6}
parts=${3:-memory idle}
here=$(cd "$(dirname "$0")/.." && pwd)
ztrain=$(cd "$build" && pwd)/bin/ztrain
config=$here/configs/run.toml
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# peak NAME CATEGORY: the worst rank's measured device peak of CATEGORY
peak() {
  grep '"split": "train"' "$out/$1/metrics.jsonl" | tail -n 1 |
    sed -n "s/.*\"device\": {[^}]*\"$2\": \([0-9]*\).*/\1/p"
}
# run NAME RANKS ARGS...
# (by mpirun, or where there is none, as on the GPU check's machine, by
# ztrain --nproc)
run() {
  local name=$1 np=$2 launch
  shift 2
  launch=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" "$ztrain")
  command -v mpirun > /dev/null || launch=("$ztrain" --nproc "$np")
  "${launch[@]}" "$@" --set train.out_dir="$out/$name" "$config" > "$out/$name.out" 2>&1 ||
    { cat "$out/$name.out" >&2; exit 1; }
}
mb() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1e6 }'; }

if [[ " $parts " == *" memory "* ]]; then
L=12 C=768 V=50257 P=256 M=4 N=512
gpt=(--model gpt2-124m --set model.seq_len=$P --set train.micro_batch_size=2
  --set train.grad_accum=$M --set train.steps=2 --set train.log_every=1 --set train.eval_every=0
  --set train.save_final=false)
echo "gpt2-124m, seq 256, 2 sequences x $M micro-batches, ddp, fp32: the worst rank's bytes"
printf "%-9s %-46s %10s %12s %20s %15s %16s\n" pipeline "stages (the run header's cut)" "params MB" \
  "optimizer MB" "formula, worst stage" "activations MB" "broadcast MB"
# stage_formula CUT: the worst stage's parameter bytes by the formula, for
# the run header's cut ("embed-block.5 | block.6-head").
stage_formula() {
  python3 - "$1" "$L" "$C" "$V" "$P" << 'PY'
import re, sys
cut, L, C, V, P = sys.argv[1], *map(int, sys.argv[2:])
block = 12 * C * C + 13 * C
def index(name):
    return -1 if name == "embed" else L if name == "head" else int(name.split(".")[1])
worst = 0
for stage in cut.split(" | "):
    first, _, last = stage.partition("-")
    a, b = index(first), index(last or first)
    n = sum(block for l in range(max(a, 0), min(b, L - 1) + 1))
    n += (V * C + P * C) if a < 0 else 0          # the embedding and positions
    n += (2 * C + V * C) if b == L else 0          # the final norm, the tied copy
    worst = max(worst, n)
print(4 * worst)
PY
}
for stages in 1 2 4; do
  run "gpt_p$stages" "$stages" "${gpt[@]}" --set parallel.pipeline=$stages
  cut=$(sed -n 's/.*stages (parameters: \([^;]*\);.*/\1/p' "$out/gpt_p$stages.out")
  [ "$stages" = 1 ] && cut="embed-head"
  sent=$(python3 - "$out/gpt_p$stages/metrics.jsonl" << 'PY'
import json, sys
last = [json.loads(l) for l in open(sys.argv[1]) if '"split": "train"' in l][-1]
print(last.get("comm", {}).get("broadcast", {}).get("bytes", 0))
PY
)
  formula=$(stage_formula "$cut")
  [ "$stages" = 1 ] && formula=$((formula - V * C * 4))  # one model: the head is the embedding
  printf "%-9s %-46s %10s %12s %20s %15s %9s (theory %s)\n" "$stages" "$cut" \
    "$(mb "$(peak "gpt_p$stages" params)")" "$(mb "$(peak "gpt_p$stages" optimizer)")" \
    "$(mb "$formula")" "$(mb "$(peak "gpt_p$stages" activations)")" "$(mb "$sent")" \
    "$(mb $((2 * (stages - 1) * M * N * C * 4)))"
done
fi

if [[ " $parts " == *" idle "* ]]; then
echo
echo "idle share of the schedule per stage (Llama 8 x 256, vocab 64, seq 256, uniform stages), median of steps 2-$steps"
llama=(--model llama-tiny --set model.n_layer=8 --set model.n_embd=256 --set model.n_head=4
  --set model.n_kv_head=4 --set model.vocab_size=64 --set model.seq_len=256
  --set train.micro_batch_size=1 --set train.steps="$steps" --set train.log_every=1
  --set train.eval_every=0 --set train.save_final=false --set device.threads=1
  --set parallel.pipeline_partition=uniform)
printf "%-9s %-7s %3s %28s %14s %12s\n" stages schedule M "measured per stage" "(P-1)/(M+P-1)" \
  "last/first"
for stages in 2 4; do
  for schedule in 1f1b gpipe; do
    for m in 4 8; do
      name="idle_p${stages}_${schedule}_$m"
      run "$name" "$stages" "${llama[@]}" --set train.grad_accum=$m --set parallel.pipeline=$stages \
        --set parallel.pipeline_schedule=$schedule
      measured=$(python3 - "$out/$name/metrics.jsonl" << 'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"split": "train"' in l][1:]
shares = [statistics.median(s) for s in zip(*[r["pipeline_idle"] for r in rows])]
print(" ".join("%.1f%%" % (100 * s) for s in shares), "%.3f" % ((1 - shares[-1]) / (1 - shares[0])))
PY
)
      theory=$(awk -v p="$stages" -v m="$m" 'BEGIN { printf "%.1f%%", 100 * (p - 1) / (m + p - 1) }')
      note=$([ "$stages" -gt "$(nproc)" ] && echo " ($stages ranks on $(nproc) cores)" || true)
      printf "%-9s %-7s %3s %28s %14s %12s%s\n" "$stages" "$schedule" "$m" "${measured% *}" \
        "$theory" "${measured##* }" "$note"
    done
  done
done
fi
