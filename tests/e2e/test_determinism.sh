#!/usr/bin/env bash
# Determinism: the same config run twice logs exactly the same losses (every
# train and val "loss" field, compared as text); another [train] seed (the
# initialisation) or another [data] seed (the sequences) gives other losses.
#
# usage: test_determinism.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail

source "$(dirname "$0")/lib.sh"

# run NAME [--set ...]: a tiny run into $scratch/NAME; its losses, one
# "step loss" pair a line in log order, go to $scratch/NAME.losses.
run() {
  local name=$1
  shift
  local rc=0
  "$ZTRAIN" \
    --set train.steps=20 \
    --set train.warmup_steps=5 \
    --set train.log_every=1 \
    --set train.eval_every=10 \
    --set train.micro_batch_size=4 \
    --set train.grad_accum=2 \
    --set model.n_layer=2 \
    --set model.n_head=2 \
    --set model.n_embd=64 \
    --set model.seq_len=32 \
    --set model.vocab_size=64 \
    --set train.out_dir="\"$scratch/$name\"" \
    "$@" "$SRC/configs/run.toml" >"$scratch/$name.stdout" 2>&1 || rc=$?
  if [[ $rc -ne 0 ]]; then
    cat "$scratch/$name.stdout" >&2
    fail "run '$name' exited with status $rc"
  fi
  local metrics="$scratch/$name/metrics.jsonl"
  [[ -s "$metrics" ]] || fail "run '$name' wrote no $metrics"
  metrics_fields "$metrics" any step loss >"$scratch/$name.losses"
  # 20 train lines (log_every 1) and 2 val lines (steps 10 and 20).
  [[ $(wc -l <"$scratch/$name.losses") -eq 22 ]] ||
    fail "run '$name': expected 22 loss values in $metrics, found $(wc -l <"$scratch/$name.losses")"
  if grep -qv ' [0-9]' "$scratch/$name.losses"; then
    fail "run '$name' logged a non-numeric loss: $(grep -v ' [0-9]' "$scratch/$name.losses" | head -n 1)"
  fi
}

run a
run b
if ! cmp -s "$scratch/a.losses" "$scratch/b.losses"; then
  diff "$scratch/a.losses" "$scratch/b.losses" >&2 || true
  fail "the same config gave different losses in two runs (step, loss: left first run, right second)"
fi

run train_seed --set train.seed=1
if cmp -s "$scratch/a.losses" "$scratch/train_seed.losses"; then
  fail "[train] seed = 1 gave exactly the losses of seed = 0: the seed does not reach the initialisation"
fi
# Step 1's loss already depends on the initialisation.
[[ $(head -n 1 "$scratch/a.losses") != $(head -n 1 "$scratch/train_seed.losses") ]] ||
  fail "[train] seed 0 and 1 give the same step-1 loss"

run data_seed --set data.seed=99
if cmp -s "$scratch/a.losses" "$scratch/data_seed.losses"; then
  fail "[data] seed = 99 gave exactly the losses of seed = 1234: the seed does not reach the data"
fi

echo "test_determinism: ok ($(wc -l <"$scratch/a.losses") losses identical across runs; seeds matter)"
