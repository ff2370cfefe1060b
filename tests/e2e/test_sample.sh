#!/usr/bin/env bash
# `ztrain sample`: a model trained on one repeated pair of sentences
# (prepared with a tokenizer of tests/data) continues a prompt with them.
# - Greedy: "the cat sat on" continues " the mat. the dog ate the bone".
# - Drawn (--temperature, --top-k): the same seed gives the same text.
# - --chat: the question rendered by the directory's chat template.
# - Refused: no tokenizer, --max-tokens 0, a negative temperature.
# - During training ([train] sample_every): greedy samples at steps 75 and
#   150 in the log and in metrics.jsonl, the last one the sentences; at two
#   ranks under zero3 (parameters gathered for every forward) drawn samples
#   come out once per sample step and the run ends; with data that names no
#   tokenizer sample_every is refused naming the key.
#
# usage: test_sample.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

python3 -c "
import json
with open('$scratch/docs.jsonl', 'w') as f:
    for i in range(400):
        f.write(json.dumps({'text': 'the cat sat on the mat. the dog ate the bone. ' * 3}) + '\n')
"
"$ZTRAIN" prepare --tokenizer "$SRC/tests/data/tokenizers/byte_level.json" --separator '<|endoftext|>' \
  --out "$scratch/data" "$scratch/docs.jsonl" > "$scratch/prep.out" 2>&1 || fail "prepare failed: $(cat "$scratch/prep.out")"
"$ZTRAIN" --model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32 \
  --set model.vocab_size=2000 --set train.steps=150 --set train.eval_every=0 --set train.lr=3e-3 \
  --set train.warmup_steps=10 --set device.threads=1 --set data.plugin=tokens \
  --set "data.path=\"$scratch/data/train_*.bin\"" --set train.out_dir="$scratch/run" \
  --set train.sample_every=75 --set train.sample_temperature=0 --set train.sample_tokens=14 \
  --set 'train.sample_prompt="the cat sat on"' \
  "$SRC/configs/run.toml" > "$scratch/train.out" 2>&1 || fail "training failed: $(cat "$scratch/train.out")"
grep "final train loss" "$scratch/train.out"
grep "^sample step" "$scratch/train.out" || fail "no sample lines in the log: $(cat "$scratch/train.out")"
[ "$(grep -c '^sample step' "$scratch/train.out")" = 2 ] || fail "not two sample lines"
grep -q "^sample step 150 | the cat sat on the mat. the dog ate the bone" "$scratch/train.out" ||
  fail "the step-150 sample did not continue the sentences"
python3 - "$scratch/run/metrics.jsonl" <<'PY' || fail "metrics.jsonl's sample lines are wrong"
import json, sys
samples = [j for j in map(json.loads, open(sys.argv[1])) if j["split"] == "sample"]
assert [j["step"] for j in samples] == [75, 150], samples
assert samples[1]["text"].startswith("the cat sat on the mat. the dog ate the bone"), samples[1]
print("metrics.jsonl samples:", [j["text"] for j in samples])
PY

greedy=$("$ZTRAIN" sample "$scratch/run" --prompt "the cat sat on" --max-tokens 14) ||
  fail "sample failed: $greedy"
echo "greedy: $greedy"
case "$greedy" in
  "the cat sat on the mat. the dog ate the bone"*) ;;
  *) fail "greedy sampling did not continue the sentences: '$greedy'" ;;
esac
# --chat renders the run directory's chat template with the generation
# prompt: this one starts a document and ends the user's words with " the
# mat.", which the model continues with the second sentence; only the
# answer is printed.
printf '%s' '<|endoftext|>{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %} the mat.{% endif %}' \
  > "$scratch/run/chat_template.jinja"
answer=$("$ZTRAIN" sample "$scratch/run" --chat "the cat sat on" --max-tokens 10) || fail "sample --chat failed: $answer"
echo "chat: $answer"
case "$answer" in
  " the dog ate the bone"*) ;;
  *) fail "--chat did not answer through the template: '$answer'" ;;
esac
both=$("$ZTRAIN" sample "$scratch/run" --chat "a" --prompt "b" 2>&1) && fail "--chat with --prompt: not refused"
grep -qF "give --prompt TEXT or --chat TEXT, not both" <<< "$both" || fail "--chat with --prompt: $both"
rm "$scratch/run/chat_template.jinja"
none=$("$ZTRAIN" sample "$scratch/run" --chat "a" 2>&1) && fail "--chat without a template: not refused"
grep -qF "has no chat_template, and there is no chat_template.jinja beside it" <<< "$none" ||
  fail "--chat without a template: $none"
drawn() { "$ZTRAIN" sample "$scratch/run" --prompt "the dog" --max-tokens 12 --temperature 0.8 --top-k 5 --seed "$1"; }
a=$(drawn 7) && b=$(drawn 7) || fail "drawn sampling failed"
[ "$a" = "$b" ] || fail "the same seed drew '$a' and '$b'"
echo "drawn (seed 7, twice): $a"

"$ZTRAIN" --nproc 2 --strategy zero3 --model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 \
  --set model.seq_len=32 --set model.vocab_size=2000 --set train.steps=8 --set train.eval_every=0 \
  --set device.threads=1 --set data.plugin=tokens --set "data.path=\"$scratch/data/train_*.bin\"" \
  --set train.out_dir="$scratch/run2" --set train.sample_every=4 --set train.sample_tokens=6 \
  --set train.sample_top_k=5 "$SRC/configs/run.toml" > "$scratch/train2.out" 2>&1 ||
  fail "two-rank zero3 training with samples failed: $(cat "$scratch/train2.out")"
[ "$(grep -c '^sample step [48] | ' "$scratch/train2.out")" = 2 ] ||
  fail "two ranks did not print one sample per sample step: $(cat "$scratch/train2.out")"
grep '^sample step' "$scratch/train2.out"
if "$ZTRAIN" --model gpt2-tiny --set train.steps=2 --set train.sample_every=1 \
  --set train.out_dir="$scratch/run3" "$SRC/configs/run.toml" > "$scratch/train3.out" 2>&1; then
  fail "sample_every without a tokenizer: not refused"
fi
grep -qF "[train] sample_every needs the data's tokenizer" "$scratch/train3.out" ||
  fail "sample_every without a tokenizer: not said: $(cat "$scratch/train3.out")"
echo "sample_every without a tokenizer: refused"

refused() {  # refused WHAT PATTERN ARGS...
  local what=$1 pattern=$2
  shift 2
  if "$ZTRAIN" sample "$@" > "$scratch/refused.out" 2>&1; then fail "$what: not refused"; fi
  grep -qF -- "$pattern" "$scratch/refused.out" || fail "$what: '$pattern' not said: $(cat "$scratch/refused.out")"
  echo "$what: refused"
}
mv "$scratch/run/tokenizer.json" "$scratch/tokenizer.json"
refused "no tokenizer" "give one with --tokenizer" "$scratch/run" --prompt "the cat"
refused "--max-tokens 0" "--max-tokens 0: give 1 or more" "$scratch/run" --tokenizer "$scratch/tokenizer.json" \
  --prompt "the cat" --max-tokens 0
refused "a negative temperature" "--temperature must be 0" "$scratch/run" \
  --tokenizer "$scratch/tokenizer.json" --prompt "the cat" --temperature -1
echo "PASS"
