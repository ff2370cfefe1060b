#!/usr/bin/env bash
# `ztrain prepare` against Hugging Face tokenizers' Rust encode_batch, the
# same corpus, tokenizer and thread count, in one script: tokens per second
# of each and their ratio (goal: ztrain >= 1.0x). The corpus is ~12 MB of
# JSON lines mixing English, Chinese, code and numbers (the generator of
# tests/data/tokenizers); the tokenizer a byte-level BPE of 16k tokens
# trained on it here (GPT-2's shape; the committed ones are small). ztrain's
# time is the whole command (reading the JSON, tokenizing, writing shards);
# Hugging Face's only its encode_batch calls over documents already in
# memory. Threads are limited by CPU affinity (taskset) for both; each pair
# of runs alternates, twice, and each side takes its better round. Every
# id ztrain writes is checked against tokenizers' first.
# Needs a Python with `tokenizers` (pip install tokenizers) as PYTHON.
#
#   PYTHON=/tmp/tokvenv/bin/python bench/bench_prepare.sh [BUILD_DIR] [THREADS...]
set -euo pipefail
build=${1:-build}
shift || true
threads=("$@")
[ ${#threads[@]} -gt 0 ] || threads=(1 2)
py=${PYTHON:-python3}
src=$(cd "$(dirname "$0")/.." && pwd)
ztrain=$(realpath "$build/bin/ztrain")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" - "$src" "$work" << 'PY'
import importlib.util, json, random, sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
src, work = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location("mg", f"{src}/tools/make_tokenizer_golden.py")
mg = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mg)
lines = mg.training_text()
rng = random.Random(1)
docs, size = [], 0
while size < 12_000_000:
    docs.append("\n".join(rng.choice(lines) for _ in range(rng.randint(5, 40))))
    size += len(docs[-1].encode())
with open(f"{work}/docs.jsonl", "w", encoding="utf-8") as f:
    for d in docs:
        f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(docs, trainers.BpeTrainer(
    vocab_size=16000, special_tokens=["<|endoftext|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
tok.save(f"{work}/tokenizer.json")
print(f"corpus: {len(docs)} documents, {size / 1e6:.1f} MB; tokenizer: {tok.get_vocab_size()} tokens")
PY
cat > "$work/hf.py" << 'PY'
import array, json, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
docs = [json.loads(l)["text"] for l in open(sys.argv[2], encoding="utf-8")]
t = time.perf_counter()
encoded = []
for i in range(0, len(docs), 1024):
    encoded += tok.encode_batch(docs[i:i + 1024], add_special_tokens=False)
dt = time.perf_counter() - t
ids = array.array("H")
for e in encoded:
    ids.append(tok.token_to_id("<|endoftext|>"))
    ids.extend(e.ids)
open(sys.argv[3], "wb").write(ids.tobytes())
print(len(ids), dt)
PY
cpus() { seq -s, 0 $(($1 - 1)); }
for t in "${threads[@]}"; do
  best_hf=0 best_z=0 tokens=0
  for round in 1 2; do
    read -r n s < <(RAYON_NUM_THREADS=$t taskset -c "$(cpus "$t")" "$py" "$work/hf.py" "$work/tokenizer.json" "$work/docs.jsonl" "$work/hf_ids.bin")
    hf=$(awk -v n="$n" -v s="$s" 'BEGIN { print n / s }')
    rm -rf "$work/out"
    start=$(date +%s.%N)
    taskset -c "$(cpus "$t")" "$ztrain" prepare --tokenizer "$work/tokenizer.json" --separator '<|endoftext|>' \
      --out "$work/out" "$work/docs.jsonl" 2> "$work/prepare.log"
    end=$(date +%s.%N)
    tokens=$(python3 -c "import json; m = json.load(open('$work/out/manifest.json')); print(m['train']['tokens'] + m['val']['tokens'])")
    # Every id the same as tokenizers', in order.
    cat "$work"/out/train_*.bin | python3 -c "
import sys
raw, want = sys.stdin.buffer.read(), open('$work/hf_ids.bin', 'rb').read()
ids = b''
at = 0
while at < len(raw):
    n = int.from_bytes(raw[at + 8:at + 12], 'little')
    ids += raw[at + 1024:at + 1024 + 2 * n]
    at += 1024 + 2 * n
sys.exit(0 if ids == want else 1)" || { echo "ztrain's ids differ from tokenizers'" >&2; exit 1; }
    z=$(awk -v n="$tokens" -v a="$start" -v b="$end" 'BEGIN { print n / (b - a) }')
    best_hf=$(awk -v a="$best_hf" -v b="$hf" 'BEGIN { print (b > a ? b : a) }')
    best_z=$(awk -v a="$best_z" -v b="$z" 'BEGIN { print (b > a ? b : a) }')
  done
  awk -v t="$t" -v n="$tokens" -v h="$best_hf" -v z="$best_z" 'BEGIN {
    printf "%d thread(s), %d tokens: tokenizers encode_batch %.2f M tokens/s, ztrain prepare %.2f M tokens/s: %.2fx\n",
      t, n, h / 1e6, z / 1e6, z / h }'
done
