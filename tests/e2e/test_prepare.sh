#!/usr/bin/env bash
# From text to a trained model: `ztrain prepare` and the tokens it writes.
# - JSON lines and a text file, tokenized with a tokenizer.json from
#   tests/data/tokenizers (Llama 3's shape) into llm.c shards of 1500
#   tokens and a held-out split; the manifest counts documents and tokens;
#   every document starts with the tokenizer's BOS; a second prepare
#   writes the same bytes.
# - A run trains gpt2-tiny across the shards, is checkpointed mid-shard
#   and resumed with the uninterrupted run's losses.
# - The final weights are exported with the tokenizer beside them and a
#   config.json that says their dtype (float32, and bfloat16 after `ztrain
#   export --dtype bf16`) with token ids in the vocabulary or null; the
#   exported directory is a model again (`--model DIR`) and evaluates to
#   the run's last validation loss.
# - Refused: a vocab_size below the tokenizer's (the manifest says so), an
#   output directory holding shards (unless --overwrite), a JSON line
#   without the field (file:line), a separator the tokenizer lacks, an
#   empty input (no shard left behind), a binary input (file and byte),
#   a glob into a directory that does not exist (named), a tokenizer.json
#   whose BPE model has no merges, and a run whose model directory ships
#   another tokenizer than the one the shards were made with (both named).
# - Document masking (document_mask): at world 1 and 2, GPT-2 refused.
#
# usage: test_prepare.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

tok=$SRC/tests/data/tokenizers/split_regex.json
python3 - "$scratch" "$SRC/tests/data/tokenizers/corpus.txt" << 'PY'
import json, sys
scratch, corpus = sys.argv[1], sys.argv[2]
lines = open(corpus, encoding="utf-8").read().splitlines()
with open(f"{scratch}/docs.jsonl", "w", encoding="utf-8") as f:
    for i in range(120):
        f.write(json.dumps({"id": i, "text": "\n".join(lines[(i * 5 + j) % len(lines)] for j in range(4))},
                           ensure_ascii=False) + "\n")
PY
prep() {  # prep OUT ARGS...
  local out=$1
  shift
  "$ZTRAIN" prepare --tokenizer "$tok" --out "$scratch/$out" --shard-tokens 1500 --val-tokens 600 \
    --separator '<|begin_of_text|>' "$@" "$scratch/docs.jsonl" "$SRC/tests/data/tokenizers/corpus.txt"
}
prep data > "$scratch/prep.out" 2>&1 || fail "prepare failed: $(cat "$scratch/prep.out")"
cat "$scratch/prep.out"
python3 - "$scratch/data" << 'PY' || fail "the shards are not what the manifest says"
import json, struct, sys, glob, os
d = sys.argv[1]
m = json.load(open(f"{d}/manifest.json"))
assert m["format"] == "ztrain-prepare 1" and m["token_bytes"] == 2, m
assert m["tokenizer"]["vocab_size"] == 3000, m["tokenizer"]
assert m["train"]["documents"] + m["val"]["documents"] == 121, m
assert len(m["train"]["shards"]) >= 3, m["train"]
for split in ("train", "val"):
    total = 0
    for s in m[split]["shards"]:
        raw = open(f"{d}/{s['file']}", "rb").read()
        head = struct.unpack("<256i", raw[:1024])
        assert head[:3] == (20240520, 1, s["tokens"]), head[:3]
        ids = struct.unpack(f"<{s['tokens']}H", raw[1024:])
        assert max(ids) < 3000
        total += len(ids)
    assert total == m[split]["tokens"], (split, total)
first = struct.unpack("<2H", open(f"{d}/val_000000.bin", "rb").read()[1024:1028])
assert first[0] == 0, first  # <|begin_of_text|> starts the first document
assert not glob.glob(f"{d}/*.partial")
print("manifest:", m["train"]["documents"], "train documents,", m["train"]["tokens"], "tokens in",
      len(m["train"]["shards"]), "shards;", m["val"]["tokens"], "val tokens")
PY
prep again > /dev/null 2>&1 || fail "the second prepare failed"
for f in "$scratch"/data/*.bin; do
  cmp -s "$f" "$scratch/again/$(basename "$f")" || fail "$(basename "$f") differs between two prepares"
done

steps=12
base=(--model gpt2-tiny --set model.n_layer=1 --set model.n_embd=32 --set model.seq_len=32
  --set model.vocab_size=3000 --set train.steps=$steps --set train.log_every=1 --set train.eval_every=6
  --set train.eval_batches=1 --set train.warmup_steps=2 --set train.global_batch_size=4
  --set device.threads=1 --set train.save_final=false --set data.plugin=tokens
  --set "data.path=\"$scratch/data/train_*.bin\"" --set "data.val_path=\"$scratch/data/val_*.bin\"")
"$ZTRAIN" "${base[@]}" --set train.checkpoint_every=6 --set train.out_dir="$scratch/full" \
  "$SRC/configs/run.toml" > "$scratch/full.out" 2>&1 || fail "training on the shards failed: $(cat "$scratch/full.out")"
curve full "$steps"
mkdir -p "$scratch/resumed"
cp -r "$scratch/full/step_6" "$scratch/resumed/"
"$ZTRAIN" "${base[@]}" --set train.checkpoint_every=6 --set train.out_dir="$scratch/resumed" \
  --resume "$scratch/resumed/step_6" "$SRC/configs/run.toml" > "$scratch/resumed.out" 2>&1 ||
  fail "the resumed run failed: $(cat "$scratch/resumed.out")"
curve resumed 6
awk '$1 > 6' "$scratch/full.curve" > "$scratch/full_tail.curve"
same_training full_tail resumed 0 0

# The run's weights out, with the tokenizer; then in again as a model.
"$ZTRAIN" "${base[@]}" --set train.save_final=true --set train.out_dir="$scratch/final" \
  "$SRC/configs/run.toml" > "$scratch/final.out" 2>&1 || fail "the exporting run failed: $(cat "$scratch/final.out")"
"$ZTRAIN" export "$scratch/final" "$scratch/bf16" --dtype bf16 > /dev/null 2>&1 || fail "export --dtype bf16 failed"
python3 - "$scratch" "$tok" << 'PY' || fail "the exported directories are not what transformers loads"
import json, sys
scratch, tok = sys.argv[1], sys.argv[2]
for d, dtype in (("final", "float32"), ("bf16", "bfloat16")):
    c = json.load(open(f"{scratch}/{d}/config.json"))
    assert c["torch_dtype"] == dtype, (d, c["torch_dtype"])
    assert c["bos_token_id"] is None and c["eos_token_id"] is None, c  # no tokenizer_config beside it
    assert open(f"{scratch}/{d}/tokenizer.json", "rb").read() == open(tok, "rb").read(), d
print("exported: config.json torch_dtype float32 / bfloat16, tokenizer.json beside the weights")
PY
last_val=$(metrics_fields "$scratch/final/metrics.jsonl" val loss | tail -1)
"$ZTRAIN" --model "$scratch/final" --set train.steps=1 --set train.lr=0 --set train.min_lr=0 \
  --set train.warmup_steps=0 --set train.eval_every=1 --set train.eval_batches=1 \
  --set train.global_batch_size=4 --set device.threads=1 --set train.save_final=false \
  --set data.plugin=tokens --set "data.path=\"$scratch/data/train_*.bin\"" \
  --set "data.val_path=\"$scratch/data/val_*.bin\"" --set train.out_dir="$scratch/reloaded" \
  "$SRC/configs/run.toml" > "$scratch/reloaded.out" 2>&1 || fail "--model of the export failed: $(cat "$scratch/reloaded.out")"
reloaded_val=$(metrics_fields "$scratch/reloaded/metrics.jsonl" val loss | tail -1)
[ "$reloaded_val" = "$last_val" ] || fail "the exported model evaluates to $reloaded_val, the run ended at $last_val"
echo "the export, loaded with --model, evaluates to the run's last val loss $last_val"

must_refuse() {  # must_refuse WHAT PATTERN COMMAND...
  local what=$1 pattern=$2
  shift 2
  if "$@" > "$scratch/refused.out" 2>&1; then fail "$what: not refused"; fi
  grep -qF -- "$pattern" "$scratch/refused.out" || fail "$what: '$pattern' not said: $(cat "$scratch/refused.out")"
  echo "$what: refused"
}
must_refuse "vocab_size below the tokenizer's" "with 3000 tokens, more than the model's vocab_size 256" \
  "$ZTRAIN" "${base[@]}" --set model.vocab_size=256 --set train.out_dir="$scratch/small" "$SRC/configs/run.toml"
must_refuse "an output directory with shards" "holds the output of an earlier prepare" prep data
prep data --overwrite > /dev/null 2>&1 || fail "--overwrite did not replace the shards"
printf '{"id": 1, "body": "no text field"}\n' > "$scratch/bad.jsonl"
must_refuse "a line without the field" "bad.jsonl:1: no \"text\" field" \
  "$ZTRAIN" prepare --tokenizer "$tok" --out "$scratch/bad" --separator none "$scratch/bad.jsonl"
must_refuse "a separator the tokenizer lacks" "--separator '<s>' is not a token of" \
  "$ZTRAIN" prepare --tokenizer "$tok" --out "$scratch/bad" --separator '<s>' "$scratch/docs.jsonl"
: > "$scratch/empty.txt"
must_refuse "an empty input" "prepare's inputs hold no text to train on: $scratch/empty.txt" \
  "$ZTRAIN" prepare --tokenizer "$tok" --out "$scratch/empty" --separator none "$scratch/empty.txt"
[ -z "$(ls -A "$scratch/empty")" ] || fail "an empty input left $(ls "$scratch/empty")"
must_refuse "a binary input" "$ZTRAIN: byte " \
  "$ZTRAIN" prepare --tokenizer "$tok" --out "$scratch/binary" --separator none "$ZTRAIN"
must_refuse "a glob into a missing directory" "cannot read the directory '$scratch/nowhere'" \
  "$ZTRAIN" prepare --tokenizer "$tok" --out "$scratch/nowhere_out" --separator none "$scratch/nowhere/*.txt"
python3 -c "import json, sys; j = json.load(open(sys.argv[1])); del j['model']['merges']; json.dump(j, open(sys.argv[2], 'w'))" \
  "$tok" "$scratch/no_merges.json"
must_refuse "a BPE tokenizer without merges" "model.merges is missing" \
  "$ZTRAIN" prepare --tokenizer "$scratch/no_merges.json" --out "$scratch/no_merges" --separator none "$scratch/docs.jsonl"
cp -r "$scratch/final" "$scratch/other_tokenizer"
cp "$SRC/tests/data/tokenizers/byte_level.json" "$scratch/other_tokenizer/tokenizer.json"
must_refuse "a model directory with another tokenizer" \
  "the model directory's tokenizer $scratch/other_tokenizer/tokenizer.json (identity" \
  "$ZTRAIN" --model "$scratch/other_tokenizer" --set train.steps=1 --set device.threads=1 \
  --set train.save_final=false --set data.plugin=tokens --set "data.path=\"$scratch/data/train_*.bin\"" \
  --set train.out_dir="$scratch/mismatch" "$SRC/configs/run.toml"
grep -qF "made with, $tok (identity" "$scratch/refused.out" || fail "the shards' tokenizer is not named"
# Document masking: the prepared shards on a Llama with [data]
# document_mask, attention kept inside each document (positions restart at
# every <|begin_of_text|>): the data line says so, world 2 under zero2 logs
# world 1's losses and norms, and the losses are not the unmasked run's;
# GPT-2, whose positions are a learned table, is refused naming why.
dm=(--set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2
  --set model.seq_len=64 --set model.vocab_size=3000 --set train.steps=6
  --set train.eval_every=0 --set train.log_every=1 --set device.threads=1
  --set train.save_final=false --set train.global_batch_size=4 --set data.plugin=tokens
  --set "data.path=\"$scratch/data/train_*.bin\"")
for name in dm_w1 dm_w2 dm_off; do
  np=1 extra=(--set data.document_mask=true)
  [ "$name" = dm_w2 ] && np=2 extra+=(--strategy zero2)
  [ "$name" = dm_off ] && extra=()
  on_ranks "$np" "$ZTRAIN" --model llama-tiny --set model.n_kv_head=2 "${dm[@]}" "${extra[@]}" \
    --set train.out_dir="$scratch/$name" \
    "$SRC/configs/run.toml" > "$scratch/$name.out" 2>&1 || fail "the $name run failed"
  curve "$name" 6
done
grep -q "; documents masked)" "$scratch/dm_w1.out" || fail "the run's data line does not say documents are masked"
same_training dm_w1 dm_w2 1e-6 4e-6
cmp -s <(cut -d' ' -f2 "$scratch/dm_w1.curve") <(cut -d' ' -f2 "$scratch/dm_off.curve") &&
  fail "masking the documents did not change the losses"
"$ZTRAIN" --model gpt2-tiny "${dm[@]}" --set data.document_mask=true \
  --set train.out_dir="$scratch/dm_gpt2" "$SRC/configs/run.toml" > "$scratch/dm_gpt2.out" 2>&1 &&
  fail "document masking on GPT-2 was not refused"
grep -qF "GPT-2's learned position embeddings (wpe) are read by row position" "$scratch/dm_gpt2.out" ||
  fail "document masking on GPT-2: the refusal does not say why: $(cat "$scratch/dm_gpt2.out")"
echo "PASS"
