#!/usr/bin/env bash
# --strategy NAME loads the preset NAME.toml from the strategies/ directory
# beside the run file (else the shipped presets, else the plugin NAME):
# `--strategy ddp` runs, both on the shipped configs and on a copy; a preset
# that exists only beside a copied run file is found there; a preset's own
# errors name the preset file; `--strategy nonexistent` fails naming it.
#
# usage: test_strategy_preset.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail

source "$(dirname "$0")/lib.sh"

[[ -f "$SRC/configs/strategies/ddp.toml" ]] || fail "$SRC/configs/strategies/ddp.toml is missing"

TINY=(--set train.steps=10 --set train.warmup_steps=2 --set train.log_every=1 --set train.eval_every=5
  --set model.n_layer=2 --set model.n_head=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=64 --set train.micro_batch_size=4)

# ok_run NAME ARGS...: a run that must succeed, into $scratch/NAME; its
# "step loss" pairs go to $scratch/NAME.losses.
ok_run() {
  local name=$1
  shift
  local rc=0
  "$ZTRAIN" "${TINY[@]}" --set train.out_dir="\"$scratch/$name\"" "$@" >"$scratch/$name.stdout" 2>&1 || rc=$?
  if [[ $rc -ne 0 ]]; then
    cat "$scratch/$name.stdout" >&2
    fail "run '$name' ($*) exited with status $rc"
  fi
  [[ -s "$scratch/$name/metrics.jsonl" ]] || fail "run '$name' wrote no metrics"
  grep -q '^done: 10 steps' "$scratch/$name.stdout" || fail "run '$name' printed no summary"
  grep -q 'strategy ddp' "$scratch/$name.stdout" || fail "run '$name' does not report strategy ddp"
  metrics_fields "$scratch/$name/metrics.jsonl" any step loss >"$scratch/$name.losses"
  [[ -s "$scratch/$name.losses" ]] || fail "run '$name' logged no losses"
}

# The shipped run file and presets, output redirected to the scratch dir.
ok_run source_ddp --strategy ddp "$SRC/configs/run.toml"
ok_run source_plain "$SRC/configs/run.toml"
# [strategy] of run.toml is ddp already: the preset changes nothing.
cmp -s "$scratch/source_ddp.losses" "$scratch/source_plain.losses" ||
  fail "--strategy ddp and run.toml's own [strategy] (ddp) give different losses"

# A copy of the configs: presets are looked up beside the run file.
mkdir -p "$scratch/cfg/strategies"
cp "$SRC/configs/run.toml" "$scratch/cfg/run.toml"
cp "$SRC/configs/strategies/"*.toml "$scratch/cfg/strategies/"
ok_run copy_ddp --strategy ddp "$scratch/cfg/run.toml"
cmp -s "$scratch/source_ddp.losses" "$scratch/copy_ddp.losses" ||
  fail "--strategy ddp on a copy of the configs gives other losses than on the originals"
grep -q '^\[strategy\]' "$scratch/copy_ddp/config.toml" || fail "the merged config has no [strategy]"

# A preset that exists only beside the copied run file (there is no plugin
# of that name), so it can only have come from there.
cat >"$scratch/cfg/strategies/my_ddp.toml" <<'EOF'
# test preset
[strategy]
plugin = "ddp"
EOF
ok_run copy_mine --strategy my_ddp "$scratch/cfg/run.toml"
cmp -s "$scratch/source_ddp.losses" "$scratch/copy_mine.losses" ||
  fail "a preset naming ddp gives other losses than the ddp preset"

# The preset's contents are used: a bad key in it is reported at its line.
cat >"$scratch/cfg/strategies/broken.toml" <<'EOF'
[strategy]
plugin = "ddp"
bogus_option = 1
EOF
rc=0
"$ZTRAIN" "${TINY[@]}" --strategy broken "$scratch/cfg/run.toml" >"$scratch/out" 2>"$scratch/err" || rc=$?
[[ $rc -eq 1 || $rc -eq 2 ]] || fail "--strategy broken: exit status $rc, expected 1 or 2"
grep -qF "$scratch/cfg/strategies/broken.toml:3:" "$scratch/err" ||
  fail "--strategy broken: the error does not name broken.toml:3: $(cat "$scratch/err")"
grep -qF "bogus_option" "$scratch/err" || fail "--strategy broken: the error does not name the key"

# Neither a preset nor a plugin.
for cfg in "$SRC/configs/run.toml" "$scratch/cfg/run.toml"; do
  rc=0
  "$ZTRAIN" "${TINY[@]}" --strategy nonexistent --set train.out_dir="\"$scratch/none\"" "$cfg" \
    >"$scratch/out" 2>"$scratch/err" || rc=$?
  [[ $rc -ne 0 ]] || fail "--strategy nonexistent ($cfg) exited 0"
  [[ $rc -eq 1 || $rc -eq 2 ]] || fail "--strategy nonexistent: exit status $rc (a crash?)"
  grep -qF "'nonexistent'" "$scratch/err" || fail "--strategy nonexistent: the message does not name it: $(cat "$scratch/err")"
  grep -q "strategy" "$scratch/err" || fail "--strategy nonexistent: the message does not say it is a strategy"
  [[ ! -e "$scratch/none/metrics.jsonl" ]] || fail "--strategy nonexistent started training"
done

echo "test_strategy_preset: ok"
