#!/usr/bin/env bash
# Every key of a run, defaults included, is listed and kept.
# - `ztrain config RUN.toml` prints every host and plugin key of the run
#   with its value: given ones with where they came from (file:line:col,
#   --set, a preset), defaults as comments.
# - A run writes exactly that to out_dir/config.toml, and that file is a
#   run file: training from it (at world 2, zero2, with overrides and a
#   preset) logs the same losses and gradient norms bit for bit.
# - `ztrain config` refuses what the run would refuse.
#
# usage: test_resolved_config.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

steps=4
args=(--model gpt2-tiny --strategy zero2 --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set train.steps=$steps --set train.log_every=1 --set train.eval_every=0
  --set device.threads=1 --set train.save_final=false --set train.lr=0.002)

"$ZTRAIN" config "${args[@]}" --set train.out_dir="$scratch/a" "$SRC/configs/run.toml" > "$scratch/config.out" ||
  fail "ztrain config failed: $(cat "$scratch/config.out")"
expect() {
  grep -qxF -- "$1" "$scratch/config.out" || fail "ztrain config does not list '$1': $(cat "$scratch/config.out")"
}
expect '[strategy]'
expect 'plugin = "zero2"'
expect '# eval_batches = 8  (default)'
expect '# init_from is unset'
expect 'lr = 0.002  # --set train.lr=0.002'
expect "n_head = 4  # $SRC/configs/models/gpt2-tiny.toml:7:1"
expect 'global_batch_size = 8  # '"$SRC"'/configs/run.toml:24:1'
grep -q '^# reduce_bucket_size = \|^reduce_bucket_size = ' "$scratch/config.out" ||
  fail "the strategy's options are not listed"
echo "ztrain config: $(grep -c ' = ' "$scratch/config.out") keys listed"

# The run keeps the same text, and it reproduces the run.
on_ranks 2 "$ZTRAIN" "${args[@]}" --set train.out_dir="$scratch/a" "$SRC/configs/run.toml" > "$scratch/a.out" 2>&1 ||
  fail "run a failed: $(cat "$scratch/a.out")"
cmp -s "$scratch/config.out" "$scratch/a/config.toml" ||
  fail "the run's config.toml differs from ztrain config: $(diff "$scratch/config.out" "$scratch/a/config.toml")"
on_ranks 2 "$ZTRAIN" --set train.out_dir="$scratch/b" "$scratch/a/config.toml" > "$scratch/b.out" 2>&1 ||
  fail "run b (from a's config.toml) failed: $(cat "$scratch/b.out")"
curve a "$steps"
curve b "$steps"
same_training a b 0 0

# Refused as the run would refuse it.
status=0
"$ZTRAIN" config --set train.stpes=3 "$SRC/configs/run.toml" > "$scratch/bad.out" 2>&1 || status=$?
[ "$status" -eq 2 ] || fail "ztrain config accepted an unknown key (exit $status)"
grep -q "unknown key.*did you mean 'steps'" "$scratch/bad.out" || fail "unclear error: $(cat "$scratch/bad.out")"
echo "PASS"
