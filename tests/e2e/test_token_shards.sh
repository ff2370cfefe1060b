#!/usr/bin/env bash
# Token files in shards, as llm.c publishes FineWeb (fineweb_train_*.bin).
# - Three llm.c shards named by a glob, a val shard by a list: the run
#   trains across the shards (its header counts them), says how many
#   epochs it makes of them, and evaluates on the val shard.
# - Checkpointed at step 10 (mid-epoch, mid-shard) and resumed: the
#   resumed steps are the uninterrupted run's, loss for loss.
# - Two ranks started in their own directories (hosts without a shared
#   file system), the same relative glob: the same shards train; a shard
#   that differs on one host, or is missing there, stops both ranks naming
#   it.
#
# usage: test_token_shards.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

mkdir -p "$scratch/host0"
python3 - "$scratch/host0" << 'PY' || fail "could not write the shards"
import random, struct, sys
def shard(path, n, seed):
    rng = random.Random(seed)
    tokens, t = [], 0
    for _ in range(n):  # a walk, so there is something to learn
        t = (t + rng.choice((1, 1, 2, 3))) % 256
        tokens.append(t)
    header = [20240520, 1, n] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header) + struct.pack(f"<{n}H", *tokens))
for i, n in enumerate((600, 900, 700)):
    shard(f"{sys.argv[1]}/train_{i + 1:06d}.bin", n, i + 1)
shard(f"{sys.argv[1]}/val_000000.bin", 400, 99)
PY
cp -r "$scratch/host0" "$scratch/host1"

steps=20
base=(--model gpt2-tiny --set model.n_layer=1 --set model.n_embd=32 --set model.seq_len=32
  --set model.vocab_size=256 --set train.steps=$steps --set train.log_every=1
  --set train.eval_every=10 --set train.eval_batches=1 --set train.warmup_steps=2
  --set train.global_batch_size=4 --set device.threads=1 --set train.save_final=false
  --set data.plugin=tokens --set 'data.path="train_*.bin"' --set 'data.val_path=["val_000000.bin"]')

# 18 + 28 + 21 = 67 windows of 33 tokens; 20 steps of 4 read 80 of them.
(cd "$scratch/host0" && "$ZTRAIN" "${base[@]}" --set train.checkpoint_every=10 \
  --set train.out_dir="$scratch/full" "$SRC/configs/run.toml") > "$scratch/full.out" 2>&1 ||
  fail "the sharded run failed: $(cat "$scratch/full.out")"
grep -q "data tokens 4 files (2600 tokens, uint16)" "$scratch/full.out" ||
  fail "the header does not count the shards: $(head -2 "$scratch/full.out")"
grep -q "data: 67 training sequences; 20 steps of 4 read them 1.19 times (epochs)" "$scratch/full.out" ||
  fail "the run does not say it repeats its data: $(grep -i 'data' "$scratch/full.out")"
curve full "$steps"
[ "$(metrics_fields "$scratch/full/metrics.jsonl" val loss | wc -l)" -eq 2 ] ||
  fail "not evaluated twice on the val shard"
echo "trained across 3 shards: $(grep -m1 '^data:' "$scratch/full.out")"

mkdir -p "$scratch/resumed"
cp -r "$scratch/full/step_10" "$scratch/resumed/"
(cd "$scratch/host0" && "$ZTRAIN" "${base[@]}" --set train.checkpoint_every=10 \
  --set train.out_dir="$scratch/resumed" --resume "$scratch/resumed/step_10" \
  "$SRC/configs/run.toml") > "$scratch/resumed.out" 2>&1 ||
  fail "the resumed run failed: $(cat "$scratch/resumed.out")"
curve resumed 10
awk '$1 > 10' "$scratch/full.curve" > "$scratch/full_tail.curve"
same_training full_tail resumed 0 0

# pair NAME: ranks 0 and 1 in host0 and host1, torchrun-style; statuses in s0, s1.
pair() {
  local p0 p1
  reserve_port
  for r in 0 1; do
    (cd "$scratch/host$r" && RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$ZTRAIN" "${base[@]}" --set train.steps=2 --set train.eval_every=0 \
      --set train.out_dir="$scratch/$1" "$SRC/configs/run.toml") > "$scratch/$1.$r.out" 2>&1 &
    spawned+=($!)
    [ "$r" = 0 ] && p0=$! || p1=$!
  done
  exit_within "$p0" 60
  s0=$status
  exit_within "$p1" 60
  s1=$status
}
pair same_shards
[ "$s0" -eq 0 ] && [ "$s1" -eq 0 ] || fail "same shards on two hosts: exits $s0, $s1: $(cat "$scratch"/same_shards.*.out)"
printf '\x01' | dd of="$scratch/host1/train_000002.bin" bs=1 seek=2000 conv=notrunc 2> /dev/null
pair shard_changed
for r in 0 1; do
  grep -q "the ranks read different files: data file train_000002.bin is 'train_000002.bin' .* on rank 0 (host .*) but 'train_000002.bin' .* on rank 1" \
    "$scratch/shard_changed.$r.out" || fail "rank $r did not name the changed shard: $(cat "$scratch/shard_changed.$r.out")"
done
cp "$scratch/host0/train_000002.bin" "$scratch/host1/"
rm "$scratch/host1/train_000003.bin"
pair shard_missing
[ "$s0" -ne 0 ] && [ "$s1" -ne 0 ] || fail "a missing shard did not stop both ranks"
grep -q "data file train_000003.bin is 'train_000003.bin' .* on rank 0 .* but absent on rank 1" "$scratch/shard_missing.0.out" ||
  fail "rank 0 did not name the missing shard: $(cat "$scratch/shard_missing.0.out")"
echo "a shard changed or missing on one host stops both ranks, naming it"
echo "PASS"
