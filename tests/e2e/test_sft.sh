#!/usr/bin/env bash
# Supervised fine-tuning: `[data] plugin = "sft"` on LLaMA-Factory's
# datasets (tests/data/llamafactory), rendered by the model directory's chat
# template (Qwen2.5's) and tokenized by its tokenizer (the byte-level test
# one), from a small Llama the script first trains and saves.
# - The run: the data line names the examples, held out and trained
#   tokens; the bad rows are printed by file:line; the loss falls; the out
#   directory ships the tokenizer and the chat template, and `ztrain sample
#   --chat` answers from it.
# - Equivalence: micro 2 x accumulation 2 at world 1 against micro 1 x
#   accumulation 4, world 2 under ddp, zero1, zero2, zero3, cpu_offload and
#   nvme_offload, world 4 under zero3: losses and gradient norms within 1e-6
#   and 4e-6 per step (fp32 sums over 4 to 8 rows, in other orders), val losses within 1e-6 (each row's trained tokens
#   differ: only a mean over the global batch's trained tokens agrees).
# - A checkpoint of world 2 resumes at world 1 with the same later steps.
# - [train] epochs: the steps they take are counted from the examples.
# - Packing: the examples cut to 100 tokens, in rows of 256, one epoch a
#   step: packed into 7 rows, they train what one example a row trains
#   (losses and gradient norms within 1e-6 for 3 steps, the sums only
#   grouped otherwise), at world 1 and at world 2 under zero3 (two epochs
#   a step: the same mean), in bf16 within 2e-4 and 4e-3, and resume
#   exactly from a checkpoint.
# - Refused before step 1, naming the key: a named template ztrain does not
#   build, a tools row under llama3 (its tools prompt is dated; named by
#   file:line), a cutoff_len
#   past seq_len + 1, a run with no model directory; packing on GPT-2
#   (learned positions) and with the sequence split over ranks; datasets
#   whose rows are all bad, naming the first.
#
# usage: test_sft.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

base_model="$scratch/base"
chat_model "$base_model"

cat > "$scratch/sft.toml" << TOML
[model]
from = "$base_model"

[data]
plugin = "sft"
dataset_dir = "$SRC/tests/data/llamafactory"
dataset = ["alpaca_en_demo", "glaive_toolcall_en_demo", "alpaca_history", "openai_messages", "bad_rows"]
val_size = 0.25

[train]
steps = 8
micro_batch_size = 2
grad_accum = 2
lr = 3e-3
warmup_steps = 2
eval_every = 4
eval_batches = 2
log_every = 1
checkpoint_every = 4
save_final = true

[device]
threads = 1
TOML

steps=8
run() { toml_run "$scratch/sft.toml" "$@"; }  # run NAME RANKS MICRO ACCUM [ARGS...]

run w1 1 2 2
cat "$scratch/w1.out"
grep -q "data sft alpaca_en_demo, glaive_toolcall_en_demo, alpaca_history, openai_messages, bad_rows: 14 examples (4 held out), [0-9]* tokens, [0-9]* trained; one example a row; template $base_model/chat_template.jinja" \
  "$scratch/w1.out" || fail "the run's data line does not describe the examples"
grep -q "^data: 5 bad rows are not trained on:$" "$scratch/w1.out" || fail "the bad rows are not counted"
grep -qF "bad_rows.json:26: the answer is empty" "$scratch/w1.out" || fail "a bad row is not named"
grep -q "^done: 8 steps in .* tok/s ([0-9.]*k trained) | " "$scratch/w1.out" ||
  fail "the summary does not give the trained tokens a second"
python3 - "$scratch/w1/metrics.jsonl" << 'PY' || fail "the metrics' trained tokens a second are wrong"
import json, sys
steps = [j for j in map(json.loads, open(sys.argv[1])) if j["split"] == "train"]
for j in steps:  # the answers' tokens: well under every position's
    assert 0 < j["trained_tokens_per_s"] < 0.9 * j["tokens_per_s"], j
PY
awk 'NR == 1 { first = $2 } END { exit !($2 < 0.9 * first) }' "$scratch/w1.curve" ||
  fail "the loss did not fall: $(cat "$scratch/w1.curve")"
for f in tokenizer.json chat_template.jinja model.safetensors; do
  [ -f "$scratch/w1/$f" ] || fail "the out directory has no $f"
done
cmp -s "$base_model/chat_template.jinja" "$scratch/w1/chat_template.jinja" ||
  fail "the out directory's chat template is not the one the examples were rendered with"
"$ZTRAIN" sample "$scratch/w1" --chat "Hello" --max-tokens 4 > "$scratch/sample.out" 2>&1 ||
  fail "sample --chat on the fine-tuned directory failed"

run accum 1 1 4
run w2 2 1 2
for strategy in zero1 zero2 zero3 cpu_offload; do
  run "w2_$strategy" 2 1 2 --strategy "$strategy"
done
disk_dir swap
run w2_nvme 2 1 2 --strategy zero3_nvme --set strategy.offload_optimizer.nvme_path="\"$swap\""
run w4_zero3 4 1 1 --strategy zero3
for name in accum w2 w2_zero1 w2_zero2 w2_zero3 w2_cpu_offload w2_nvme w4_zero3; do
  same_training w1 "$name" 1e-6 4e-6
done
a=$(metrics_fields "$scratch/w1/metrics.jsonl" val step loss)
for name in accum w2 w4_zero3; do
  b=$(metrics_fields "$scratch/$name/metrics.jsonl" val step loss)
  python3 - "$a" "$b" << 'PY' || fail "$name's val losses ($b) are not w1's ($a)"
import sys
a, b = ([l.split() for l in s.splitlines()] for s in sys.argv[1:])
assert len(a) == len(b) == 2, (a, b)
for (sa, la), (sb, lb) in zip(a, b):
    assert sa == sb and abs(float(la) - float(lb)) <= 1e-6 * abs(float(la)), (a, b)
PY
done

tail -n 4 "$scratch/w2.curve" > "$scratch/w2_last4.curve"
# The checkpoint's run is inherited but for the command line: micro 2 x
# accumulation 2 at world 1 keeps its global batch of 4.
on_ranks 1 "$ZTRAIN" --set train.out_dir="$scratch/resumed" --set train.micro_batch_size=2 --resume="$scratch/w2/step_4" \
  "$scratch/sft.toml" > "$scratch/resumed.out" 2>&1 ||
  { cat "$scratch/resumed.out" >&2; fail "resuming world 2's step 4 at world 1 failed"; }
curve resumed 4
same_training w2_last4 resumed 1e-6 2e-6

# [train] epochs: 2 passes over the 10 training examples at 4 a step are 5
# steps, in place of the file's steps = 8, said in the header.
steps=5
run epochs 1 2 2 --set train.epochs=2 --set train.checkpoint_every=0
grep -qF "steps: 5, for epochs = 2 (--set train.epochs=2) of 10 training sequences at 4 a step (in place of steps = 8, $scratch/sft.toml:" \
  "$scratch/epochs.out" || fail "the epochs run does not say how many steps they take"

pack=(--set model.seq_len=256 --set data.cutoff_len=100 --set data.val_size=0
  --set train.eval_every=0 --set train.checkpoint_every=0 --set train.save_final=false)
steps=3
run unpacked 1 2 7 "${pack[@]}" --set train.steps=3
run packed 1 1 7 "${pack[@]}" --set train.steps=3 --set data.packing=true
grep -q "14 examples (0 held out), [0-9]* tokens, [0-9]* trained; packed into 7 rows;" "$scratch/packed.out" ||
  fail "the packed run's data line does not say 7 rows"
run packed_w2 2 1 7 "${pack[@]}" --set train.steps=3 --set data.packing=true --strategy zero3
same_training unpacked packed 1e-6 1e-6
same_training unpacked packed_w2 1e-6 1e-6
# In bf16 (activations kept in bf16, rounded where the rows' sums differ)
# within test_masked_loss's bf16 tolerances.
run unpacked_bf16 1 2 7 "${pack[@]}" --set train.steps=3 --set train.precision=bf16
run packed_bf16 1 1 7 "${pack[@]}" --set train.steps=3 --set data.packing=true --set train.precision=bf16
same_training unpacked_bf16 packed_bf16 2e-4 4e-3
# Packed rows resume exactly: step 1's checkpoint, resumed as micro 7 x
# accumulation 1 (the same global batch), logs steps 2 and 3 again.
run packed_ck 1 1 7 "${pack[@]}" --set train.steps=3 --set data.packing=true --set train.checkpoint_every=1 \
  --set train.keep_last=3
tail -n 2 "$scratch/packed_ck.curve" > "$scratch/packed_last2.curve"
"$ZTRAIN" "${pack[@]}" --set train.steps=3 --set data.packing=true --set train.micro_batch_size=7 \
  --set train.grad_accum=1 --set train.out_dir="$scratch/packed_resumed" \
  --resume="$scratch/packed_ck/step_1" "$scratch/sft.toml" > "$scratch/packed_resumed.out" 2>&1 ||
  fail "resuming the packed run failed"
curve packed_resumed 2
same_training packed_last2 packed_resumed 1e-6 1e-6

refused() {  # refused WHAT TEXT ARGS...: the run refused before step 1, saying TEXT
  local what=$1 text=$2
  shift 2
  "$ZTRAIN" --set train.out_dir="$scratch/refused" "$@" "$scratch/sft.toml" > "$scratch/refused.out" 2>&1 &&
    fail "$what: the run was not refused"
  grep -qF -- "$text" "$scratch/refused.out" || fail "$what: the refusal does not say \"$text\""
  grep -q "^step 1/" "$scratch/refused.out" && fail "$what: refused only after training began"
  echo "$what: refused"
}
refused "a named template ztrain does not build" "[data] template \"mistral\" is not one of LLaMA-Factory's templates ztrain builds" \
  --set 'data.template="mistral"'
refused "dated tools under llama3" "glaive_toolcall_en_demo.json:2: the row describes tools, which LLaMA-Factory's 'llama3' writes into a prompt with the day's date" \
  --set 'data.template="llama3"'
refused "cutoff_len past the row" "[data] cutoff_len 200 needs rows of cutoff_len - 1 = 199 positions" \
  --set data.cutoff_len=200
grep -v "^from = " "$scratch/sft.toml" > "$scratch/no_model.toml"
"$ZTRAIN" --model llama-tiny --set model.vocab_size=2048 --set train.out_dir="$scratch/refused" \
  "$scratch/no_model.toml" > "$scratch/refused.out" 2>&1 && fail "a run with no model directory was not refused"
grep -qF "no_model.toml:6:1: the sft source renders and tokenizes with a model directory's tokenizer and chat template, and the run has none; set [model] init_from" \
  "$scratch/refused.out" || fail "a run with no model directory: the refusal does not name the key"
"$ZTRAIN" --model gpt2-tiny --set model.n_layer=1 --set model.n_embd=32 --set model.vocab_size=2048 \
  --set model.seq_len=128 --set train.steps=1 --set train.eval_every=0 --set device.threads=1 \
  --set train.out_dir="$scratch/gpt2" --set train.save_final=true "$SRC/configs/run.toml" > "$scratch/gpt2.out" 2>&1 ||
  fail "training the GPT-2 base model failed"
cp "$base_model/tokenizer.json" "$base_model/chat_template.jinja" "$scratch/gpt2/"
refused "packing on GPT-2" "GPT-2's learned position embeddings (wpe) are read by row position" \
  --set "model.from=\"$scratch/gpt2\"" --set data.packing=true
on_ranks 2 "$ZTRAIN" --set parallel.sequence=2 --set data.packing=true --set train.out_dir="$scratch/refused" \
  "$scratch/sft.toml" > "$scratch/refused.out" 2>&1 && fail "packing with the sequence split was not refused"
grep -qF "[parallel] sequence = 2: the data packs several examples a row" "$scratch/refused.out" ||
  fail "packing with the sequence split: the refusal does not name the key"
python3 -c "
import json
json.dump({'broken': {'file_name': 'broken.jsonl'}}, open('$scratch/dataset_info.json', 'w'))
open('$scratch/broken.jsonl', 'w').write(json.dumps({'instruction': 'q', 'output': ''}) + '\n')"
refused "every row bad" "no example of 1 rows is left to train on (the first: $scratch/broken.jsonl:1: the answer is empty)" \
  --set "data.dataset_dir=\"$scratch\"" --set 'data.dataset="broken"'
echo "PASS test_sft"
