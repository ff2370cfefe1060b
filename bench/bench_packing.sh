#!/usr/bin/env bash
# Packed against padded fine-tuning rows ([data] packing), on this machine:
# the trained tokens a second of one epoch of LLaMA-Factory-style examples
# whose lengths spread as real instruction data does (log-normal, median
# about 250 tokens with the template's, a tail to the 1024-token cutoff),
# each example of one
# row (padded to seq_len) against the examples packed best-fit decreasing.
# Both train the same tokens (tests/e2e/test_sft.sh holds their losses
# equal); packing drops the padded places, and attention inside a packed
# row never computes scores across examples. Alternated twice, so a slow
# minute moves both sides; the ratio per round.
#
# usage: bench/bench_packing.sh [BUILD_DIR] [EXAMPLES]
#   defaults: build, 240
set -euo pipefail
build=${1:-build}
examples=${2:-240}
here=$(cd "$(dirname "$0")/.." && pwd)
ztrain=$(cd "$build" && pwd)/bin/ztrain
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# A small Llama (2 layers, 128 wide) saved as a model directory with the
# byte-level test tokenizer and Qwen2.5's chat template.
"$ztrain" --model llama-tiny --set model.n_layer=2 --set model.n_embd=128 --set model.n_head=4 \
  --set model.n_kv_head=4 --set model.vocab_size=2048 --set model.seq_len=1024 \
  --set train.steps=1 --set train.eval_every=0 --set train.out_dir="$out/base" \
  --set train.save_final=true "$here/configs/run.toml" > "$out/base.out" 2>&1 ||
  { tail -n 5 "$out/base.out"; exit 1; }
cp "$here/tests/data/tokenizers/byte_level.json" "$out/base/tokenizer.json"
cp "$here/tests/data/chat_templates/qwen2_5.jinja" "$out/base/chat_template.jinja"

python3 - "$out" "$examples" << 'PY'
import json, random, sys
out, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(52)
words = ("the model data train token row example answer question user write list explain "
         "how why what when code python function value number result sequence attention "
         "memory rank batch step loss learning rate layer weight gradient").split()
def text(k):
    return " ".join(rng.choice(words) for _ in range(k))
rows = []
for _ in range(n):
    total = min(400, max(8, int(rng.lognormvariate(3.9, 0.8))))  # words; about 3 tokens each
    prompt = max(4, int(total * rng.uniform(0.15, 0.5)))
    rows.append({"instruction": text(prompt), "input": "", "output": text(total - prompt)})
json.dump(rows, open(f"{out}/spread.json", "w"))
json.dump({"spread": {"file_name": "spread.json"}}, open(f"{out}/dataset_info.json", "w"))
PY

cat > "$out/sft.toml" << TOML
[model]
from = "$out/base"
[data]
plugin = "sft"
dataset_dir = "$out"
dataset = "spread"
cutoff_len = 1024
[train]
micro_batch_size = 4
grad_accum = 2
eval_every = 0
save_final = false
checkpoint_every = 0
log_every = 1
[device]
threads = 2
TOML

run() {  # run NAME PACKING: one epoch; prints "rows trained_tokens seconds"
  local name=$1 packing=$2 rows steps
  "$ztrain" --set data.packing="$packing" --set train.steps=1 --set train.out_dir="$out/$name.probe" \
    "$out/sft.toml" > "$out/$name.probe.out" 2>&1 || { tail -n 5 "$out/$name.probe.out"; exit 1; }
  if [ "$packing" = true ]; then
    rows=$(sed -n 's/.*packed into \([0-9]*\) rows.*/\1/p' "$out/$name.probe.out")
  else
    rows=$(sed -n 's/.*: \([0-9]*\) examples (0 held out).*/\1/p' "$out/$name.probe.out")
  fi
  steps=$(((rows + 7) / 8))
  "$ztrain" --set data.packing="$packing" --set train.steps="$steps" \
    --set train.out_dir="$out/$name" "$out/sft.toml" > "$out/$name.out" 2>&1 ||
    { tail -n 5 "$out/$name.out"; exit 1; }
  local trained seconds
  trained=$(sed -n 's/.* tokens, \([0-9]*\) trained;.*/\1/p' "$out/$name.out")
  seconds=$(python3 -c "
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if '\"train\"' in l]
print(sum(l['step_time_s'] for l in lines[1:]) * len(lines) / (len(lines) - 1))" "$out/$name/metrics.jsonl")
  # The epoch's trained tokens, scaled to the rows the steps read.
  echo "$rows $(echo "$trained * $steps * 8 / $rows" | bc -l) $seconds"
}

"$ztrain" sft-check --dataset-dir "$out" --dataset spread --cutoff-len 1024 "$out/base" | sed -n 2p
printf "%-6s %-8s %6s %14s %9s %14s\n" round layout rows "trained tok" seconds "trained tok/s"
for round in 1 2; do
  declare -A rate
  for packing in false true; do
    read -r rows trained seconds <<< "$(run "r${round}_$packing" "$packing")"
    rate[$packing]=$(echo "$trained / $seconds" | bc -l)
    printf "%-6s %-8s %6d %14.0f %9.2f %14.0f\n" "$round" \
      "$([ "$packing" = true ] && echo packed || echo padded)" "$rows" "$trained" "$seconds" \
      "${rate[$packing]}"
  done
  printf "round %s: packed / padded trained tokens a second: %.2f\n" "$round" \
    "$(echo "${rate[true]} / ${rate[false]}" | bc -l)"
done
