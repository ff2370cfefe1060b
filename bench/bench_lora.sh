#!/usr/bin/env bash
# LoRA against full fine-tuning in ztrain, and against PEFT's LoRA in
# PyTorch, on this machine: MODEL (default gpt2-124m) on the synthetic
# source (configs/run.toml's, so no model directory is needed), one rank,
# micro-batch BATCH x SEQ tokens (default 4 x 256), fp32, every core (both
# sides pinned to the same THREADS: ztrain's [device] threads, torch's
# set_num_threads), no evaluation, checkpoint or export. Three runs a
# round: ztrain with finetuning_type "full", ztrain with "lora" (rank 8,
# alpha 16, every projection of the blocks: GPT-2's c_attn, c_proj, c_fc),
# and bench/peft_lora_step.py (Hugging Face's model with PEFT's adapters
# at the same rank, alpha and targets, torch's AdamW over the adapters,
# the same batch). Rounds alternate the three, so a slow minute moves all
# of them; every ratio is taken inside its round.
#
# Per run: the median step over the steps after the first (the first pays
# for page faults and warm-up; ztrain's from metrics.jsonl's step_time_s,
# the peer's from its own timer around the same work: forward, backward,
# clip, AdamW), tokens/s at that median, peak RSS (/usr/bin/time; the
# peer's counts Python and torch's libraries too), and for ztrain the
# device tier's peak by category from the run's "peak memory per tier"
# line. Per round: LoRA / full tokens/s, ztrain LoRA / PEFT LoRA tokens/s,
# and LoRA / full peaks of grads + optimizer (what LoRA saves by design)
# and of the tier's total (what the frozen base and activations leave of
# it). Then the medians of the rounds.
#
# Run it on an idle machine: with another job on the cores, torch's OpenMP
# threads wait on each other (a tiny model at 2 threads stepped half as
# fast as at 1 here), and the ztrain / PEFT ratio measures that instead.
#
# The peer needs a Python with torch, transformers and peft: PEFT_PYTHON
# (default /tmp/lora-venv/bin/python). Without them the ztrain runs go on
# alone, saying why.
#
# usage: bench/bench_lora.sh [BUILD_DIR] [STEPS] [MODEL]
#   defaults: build, 6, gpt2-124m
#   env: BATCH (4), SEQ (256), THREADS (all cores), ROUNDS (2), LORA_RANK (8),
#        LORA_TARGET (all), PEFT_PYTHON, ZTRAIN_SET (more keys for both
#        sides, e.g. "model.n_layer=2 model.n_embd=64": the peer reads the
#        model's shape back from `ztrain config`), STRATEGY (ddp) and NPROC
#        (1): ztrain's strategy and ranks, THREADS shared among them (the
#        peer runs one process, so it is left out when NPROC > 1; BATCH is
#        a rank's micro-batch, tokens/s the world's)
#   e.g. a check in seconds: SEQ=64 bench/bench_lora.sh build 2 gpt2-tiny
#   a 1B Llama under zero3 on 2 ranks (Llama 3.2 1B's shape):
#     NPROC=2 STRATEGY=zero3 BATCH=1 ROUNDS=1 ZTRAIN_SET="model.n_layer=16
#     model.n_embd=2048 model.n_head=32 model.n_kv_head=8
#     model.intermediate_size=8192 model.vocab_size=128256
#     model.tie_embeddings=true" bench/bench_lora.sh build 4 llama-tiny
set -euo pipefail
build=${1:-build}
steps=${2:-6}
model=${3:-gpt2-124m}
batch=${BATCH:-4}
seq=${SEQ:-256}
threads=${THREADS:-$(nproc)}
rounds=${ROUNDS:-2}
rank=${LORA_RANK:-8}
alpha=$((2 * rank))  # LLaMA-Factory's default, written out so both sides get it
target=${LORA_TARGET:-all}
python=${PEFT_PYTHON:-/tmp/lora-venv/bin/python}
strategy=${STRATEGY:-ddp}
nproc=${NPROC:-1}
src=$(cd "$(dirname "$0")/.." && pwd)
ztrain=$(realpath "$build/bin/ztrain")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

common=(--model "$model" --set model.seq_len="$seq" --set train.micro_batch_size="$batch"
  --set train.grad_accum=1 --set train.steps="$steps" --set train.log_every=1
  --set 'train.precision="fp32"' --set train.eval_every=0 --set train.checkpoint_every=0
  --set train.save_final=false --set device.threads="$((threads / nproc > 0 ? threads / nproc : 1))"
  --strategy "$strategy")
for kv in ${ZTRAIN_SET:-}; do common+=(--set "$kv"); done
lora=(--set 'model.finetuning_type="lora"' --set model.lora_rank="$rank"
  --set model.lora_alpha="$alpha" --set "model.lora_target=\"$target\"")

# The peer's model, read back from the resolved run so that ZTRAIN_SET's
# overrides reach it too: "KEY = VALUE" lines of [model], set or default.
"$ztrain" config "${common[@]}" "$src/configs/run.toml" > "$out/config.toml"
key() {
  sed -n '/^\[model\]/,/^\[/p' "$out/config.toml" |
    sed -n "s/^#\{0,1\} *$1 = \([^ ]*\).*/\1/p" | tr -d '"' | head -n 1
}
arch=$(key arch)
peer_args=(--arch "$arch" --layers "$(key n_layer)" --heads "$(key n_head)" --embd "$(key n_embd)"
  --vocab "$(key vocab_size)" --kv-heads "$(key n_kv_head)" --intermediate "$(key intermediate_size)"
  --batch "$batch" --seq "$seq" --rank "$rank" --alpha "$alpha" --targets "$target"
  --threads "$threads" --steps "$steps")
[ "$(key tie_embeddings)" = true ] && peer_args+=(--tie)

peer=1
if [ "$nproc" -gt 1 ]; then
  echo "no PEFT peer: it runs one process, ztrain $nproc ranks here"
  peer=0
elif ! why=$("$python" -c 'import torch, transformers, peft' 2>&1); then
  echo "no PEFT peer: $python cannot import torch, transformers and peft ($(tail -n 1 <<< "$why"));" \
    "the ztrain runs only"
  peer=0
fi
run_ztrain() {  # run_ztrain NAME ARGS...: the run's figures in $out/NAME.res
  local name=$1 timer=()
  shift
  # Peak RSS where GNU time is installed; a dash otherwise.
  [ -x /usr/bin/time ] && timer=(/usr/bin/time -f %M -o "$out/$name.rss")
  "${timer[@]}" "$ztrain" --nproc "$nproc" "${common[@]}" "$@" \
    --set train.out_dir="$out/$name" "$src/configs/run.toml" > "$out/$name.log" 2>&1 ||
    { tail -n 20 "$out/$name.log"; exit 1; }
  # One line: median step (s), tokens/s, trained parameters, the device
  # tier's peaks in bytes (params grads optimizer activations total), peak
  # RSS (KiB). The peaks are the summary line's, printed in B, KiB, MiB or
  # GiB to two decimals (metrics.jsonl's peak_bytes holds the same exactly).
  python3 - "$out/$name" "$((batch * seq * nproc))" << 'PY' > "$out/$name.res"
import json, re, statistics, sys
run, tokens = sys.argv[1], int(sys.argv[2])
steps = [json.loads(l) for l in open(f"{run}/metrics.jsonl") if '"split": "train"' in l]
step = statistics.median([s["step_time_s"] for s in steps[1:]] or [steps[0]["step_time_s"]])
log = open(f"{run}.log").read()
units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
line = re.search(r"^  device: ([0-9.]+) (\w+) \((.*)\)$", log, re.M)
peak = dict((k, float(v) * units[u]) for k, v, u in re.findall(r"(\w+) ([0-9.]+) (\w+)", line[3]))
total = float(line[1]) * units[line[2]]
# Under LoRA the strategy's line names the trained parameters; a full run
# trains them all (the header's count, rounded: "124.44M params").
m = re.search(r"trains (\d+) parameters", log)
trained = m[1] if m else re.search(r"\(\w+, ([0-9.]+[kMGB]?) params\)", log)[1]
try:
    rss = open(f"{run}.rss").read().split()[-1]
except OSError:
    rss = "-"
print(step, tokens / step, trained, *(int(peak.get(k, 0)) for k in
      ("params", "grads", "optimizer", "activations")), int(total), rss)
PY
}
run_peer() {  # run_peer NAME: the peer's figures in $out/NAME.res, as run_ztrain's
  # torch allocates with transparent huge pages only when asked; ztrain
  # advises them, so the peer gets them too (../shared/peers/README.md).
  THP_MEM_ALLOC_ENABLE=1 "$python" "$src/bench/peft_lora_step.py" "${peer_args[@]}" \
    < /dev/null > "$out/$1.log" 2>&1 || { tail -n 20 "$out/$1.log"; exit 1; }
  sed -n 's/^RESULT //p' "$out/$1.log" | python3 -c '
import json, sys
r = json.load(sys.stdin)
print(r["median_step_s"], r["tokens_per_s"], r["trainable_params"], "- - - - -", r["peak_rss_kib"])' \
    > "$out/$1.res"
}

med() {  # the median of the numbers on stdin (the mean of the middle two when even)
  sort -g | awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
field() { awk -v i="$2" '{ print $i }' "$out/$1.res"; }  # field RUN N: column N of its .res
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.4f", a / b }'; }

echo "$model ($arch), $batch x $seq tokens a rank's step, $nproc rank(s) under $strategy, fp32," \
  "$threads threads, $steps steps a run, LoRA rank $rank alpha $alpha on $target; $rounds rounds"
runs="full lora"
[ "$peer" = 1 ] && runs+=" peft"
for round in $(seq "$rounds"); do
  run_ztrain "full.$round" --set 'model.finetuning_type="full"'
  run_ztrain "lora.$round" "${lora[@]}"
  [ "$peer" = 1 ] && run_peer "peft.$round"
  true
done

mib() {  # mib BYTES [UNIT]: in MiB, two decimals; a dash stays one
  if [ "$1" = - ]; then echo -; else awk -v b="$1" -v u="${2:-1}" 'BEGIN { printf "%.2f", b * u / 1048576 }'; fi
}
echo
echo "MiB: the device tier's peak by category and in all (ztrain's summary line), and peak RSS"
printf "%-5s %-12s %9s %9s %10s %9s %9s %9s %11s %9s %9s\n" round run "step (s)" tok/s trained \
  params grads optimizer activations total RSS
for round in $(seq "$rounds"); do
  for run in $runs; do
    read -r step tps trained params grads opt act total rss < "$out/$run.$round.res"
    printf "%-5s %-12s %9.4f %9.0f %10s %9s %9s %9s %11s %9s %9s\n" "$round" \
      "$([ "$run" = peft ] && echo "PEFT LoRA" || echo "ztrain $run")" "$step" "$tps" "$trained" \
      "$(mib "$params")" "$(mib "$grads")" "$(mib "$opt")" "$(mib "$act")" "$(mib "$total")" \
      "$(mib "$rss" 1024)"
  done
done
# The adapters must be the same on both sides, or the comparison is not.
if [ "$peer" = 1 ] && [ "$(field lora.1 3)" != "$(field peft.1 3)" ]; then
  echo "warning: ztrain trains $(field lora.1 3) adapter parameters, PEFT $(field peft.1 3)"
fi

echo
for round in $(seq "$rounds"); do
  speed=$(ratio "$(field "lora.$round" 2)" "$(field "full.$round" 2)")
  state=$(ratio "$(($(field "lora.$round" 5) + $(field "lora.$round" 6)))" \
    "$(($(field "full.$round" 5) + $(field "full.$round" 6)))")
  total=$(ratio "$(field "lora.$round" 8)" "$(field "full.$round" 8)")
  line="round $round: LoRA / full tokens/s $speed"
  if [ "$peer" = 1 ]; then
    peft=$(ratio "$(field "lora.$round" 2)" "$(field "peft.$round" 2)")
    line+=", ztrain LoRA / PEFT LoRA tokens/s $peft"
    echo "$peft" >> "$out/peft.ratios"
  fi
  echo "$line; LoRA / full peak grads+optimizer $state, device total $total"
  echo "$speed" >> "$out/speed.ratios"
  echo "$state" >> "$out/state.ratios"
  echo "$total" >> "$out/total.ratios"
done

echo
echo "median of $rounds rounds:"
for run in $runs; do
  printf "  %-12s step %.4f s, %.0f tokens/s\n" \
    "$([ "$run" = peft ] && echo "PEFT LoRA" || echo "ztrain $run")" \
    "$(for r in $(seq "$rounds"); do field "$run.$r" 1; done | med)" \
    "$(for r in $(seq "$rounds"); do field "$run.$r" 2; done | med)"
done
echo "  LoRA / full tokens/s:                    $(med < "$out/speed.ratios")"
[ "$peer" = 1 ] && echo "  ztrain LoRA / PEFT LoRA tokens/s:        $(med < "$out/peft.ratios")"
echo "  LoRA / full peak grads+optimizer memory: $(med < "$out/state.ratios")"
echo "  LoRA / full peak device memory (total):  $(med < "$out/total.ratios")"
