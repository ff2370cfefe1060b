#!/usr/bin/env bash
# `ztrain sft-check`: LLaMA-Factory datasets (tests/data/llamafactory) seen
# through a model directory's tokenizer and chat template (Qwen2.5's, with
# the byte-level test tokenizer), as a fine-tuning run would train them.
# - The counts: examples read, bad rows named by file:line, tokens in all
#   and trained, the truncated ones at a small cutoff_len.
# - The first example's text: its answer marked as trained, its prompt not;
#   with --train-on-prompt all of it.
# - Refused: a directory with no tokenizer, or no chat template; a hub
#   dataset; datasets with no row left to train on.
#
# usage: test_sft_check.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

data="$SRC/tests/data/llamafactory"
model="$scratch/model"
mkdir -p "$model"
cp "$SRC/tests/data/tokenizers/byte_level.json" "$model/tokenizer.json"
cp "$SRC/tests/data/chat_templates/qwen2_5.jinja" "$model/chat_template.jinja"

"$ZTRAIN" sft-check --dataset-dir "$data" --dataset alpaca_en_demo,bad_rows --cutoff-len 200 "$model" \
  > "$scratch/check.out" 2>&1 || fail "sft-check failed: $(cat "$scratch/check.out")"
cat "$scratch/check.out"
grep -q "^sft-check: 6 examples read, 5 bad rows (not trained on)$" "$scratch/check.out" ||
  fail "the counts of examples and bad rows are wrong"
grep -qF "bad_rows.json:26: the answer is empty" "$scratch/check.out" || fail "a bad row is not named"
grep -q "^tokens (cutoff_len 200): [0-9]* in all, [0-9]* trained ([0-9.]* %), longest example 200, 3 cut at cutoff_len$" \
  "$scratch/check.out" || fail "the token counts line is wrong"
grep -qF "[[Making crepes is an easy" "$scratch/check.out" || fail "the answer is not marked trained"
grep -qF "[[<|im_start|>" "$scratch/check.out" && fail "the prompt is marked trained"

"$ZTRAIN" sft-check --dataset-dir "$data" --dataset alpaca_en_demo --train-on-prompt "$model" \
  > "$scratch/prompt.out" 2>&1 || fail "sft-check --train-on-prompt failed: $(cat "$scratch/prompt.out")"
grep -qF "[[<|im_start|>system" "$scratch/prompt.out" || fail "--train-on-prompt does not train the prompt"

refused() {  # refused WHAT TEXT ARGS...
  local what=$1 text=$2
  shift 2
  "$ZTRAIN" sft-check "$@" > "$scratch/refused.out" 2>&1 && fail "$what: not refused"
  grep -qF -- "$text" "$scratch/refused.out" || fail "$what: '$text' not said: $(cat "$scratch/refused.out")"
  echo "$what: refused"
}
mkdir -p "$scratch/empty"
refused "no tokenizer" "no tokenizer.json or tokenizer.model in" --dataset-dir "$data" --dataset alpaca_en_demo "$scratch/empty"
cp "$SRC/tests/data/tokenizers/byte_level.json" "$scratch/empty/tokenizer.json"
refused "no chat template" "has no chat_template" --dataset-dir "$data" --dataset alpaca_en_demo "$scratch/empty"
refused "a hub dataset" "hf_hub_url needs the network" --dataset-dir "$data" --dataset alpaca_gpt4_hub "$model"
python3 -c "
import json
json.dump({'broken': {'file_name': 'broken.jsonl'}}, open('$scratch/dataset_info.json', 'w'))
open('$scratch/broken.jsonl', 'w').write(json.dumps({'instruction': 'q', 'output': ''}) + '\n')"
refused "no row to train on" "no example of 1 rows is left to train on" --dataset-dir "$scratch" --dataset broken "$model"
echo "PASS test_sft_check"
