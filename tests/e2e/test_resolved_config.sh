#!/usr/bin/env bash
# Every key of a run, defaults included, is listed and kept.
# - `ztrain config RUN.toml` prints every host and plugin key of the run
#   with its value: given ones with where they came from (file:line:col,
#   --set, a preset), defaults as comments.
# - A run writes exactly that to out_dir/config.toml, and that file is a
#   run file: training from it (at world 2, zero2, with overrides and a
#   preset) logs the same losses and gradient norms bit for bit.
# - `ztrain config` refuses what the run would refuse.
# - configs/run.toml lists every key of its run (set, or as a comment).
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
expect "global_batch_size = 8  # $SRC/configs/run.toml:$(grep -n '^global_batch_size' "$SRC/configs/run.toml" | cut -d: -f1):1"
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

# configs/run.toml lists every key of its run, set or as a comment: the
# keys `ztrain config` resolves from the option declarations.
"$ZTRAIN" config "$SRC/configs/run.toml" > "$scratch/default_config.out" || fail "ztrain config failed"
missing=$(python3 - "$scratch/default_config.out" "$SRC/configs/run.toml" << 'PY'
import re, sys

def keys(path, commented):
    out, section = set(), None
    for line in open(path):
        m = re.match(r"^\[([a-z0-9_.]+)\]", line)
        if m:
            section = m.group(1)
            continue
        m = re.match(r"^(#\s*)?([a-z_0-9.]+)( =| is unset)", line)
        if m and section and (commented or not m.group(1)):
            out.add(section + "." + m.group(2))
    return out

resolved = keys(sys.argv[1], True)
listed = keys(sys.argv[2], True)
print(" ".join(sorted(resolved - listed)))
PY
)
[ -z "$missing" ] || fail "configs/run.toml does not list these keys of its run: $missing"
echo "configs/run.toml lists all $(grep -c ' = \| is unset' "$scratch/default_config.out") keys of its run"

# Refused as the run would refuse it.
status=0
"$ZTRAIN" config --set train.stpes=3 "$SRC/configs/run.toml" > "$scratch/bad.out" 2>&1 || status=$?
[ "$status" -eq 2 ] || fail "ztrain config accepted an unknown key (exit $status)"
grep -q "unknown key.*did you mean 'steps'" "$scratch/bad.out" || fail "unclear error: $(cat "$scratch/bad.out")"
echo "PASS"
