#!/usr/bin/env bash
# A checkpoint another process reads is not pruned under it: `ztrain
# export` and `checkpoint info` on the directory of a run still training,
# with that run writing a checkpoint every step and keeping one
# (keep_last = 1), each at the dangerous moment held by a test hold point:
# - held after reading `latest` and before opening the checkpoint
#   (checkpoint_located): the run prunes it meanwhile; the reader says so
#   and reads the one `latest` names now, every checksum verified;
# - held with the checkpoint open (checkpoint_opened): the run keeps
#   training and writing, but leaves that checkpoint for a later prune; the
#   export reads it whole, and once it is done the run prunes it.
# Without the read lock the export failed ("cannot open ... rank file").
#
# usage: test_checkpoint_readers.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

base=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set train.eval_every=0 --set train.log_every=1000
  --set device.threads=1 --set train.save_final=false)
out="$scratch/run"
"$ZTRAIN" "${base[@]}" --set train.steps=1000000 --set train.checkpoint_every=1 \
  --set train.keep_last=1 --set train.out_dir="$out" "$SRC/configs/run.toml" > "$scratch/live.out" 2>&1 &
live=$!
spawned+=("$live")
until_exists "$out/latest"

# steps: the step_N directories there now.
steps() { (cd "$out" && ls -d step_* 2> /dev/null | grep -v '\.' || true); }

ZTRAIN_TEST_HOLD=checkpoint_located:2 "$ZTRAIN" checkpoint info "$out" > "$scratch/info.out" 2>&1 ||
  fail "checkpoint info failed on a live run's directory"
grep -q "test: holding at checkpoint_located" "$scratch/info.out" || fail "info did not hold"
grep -q "is gone (pruned or replaced); reading the one \`latest\` names now\|was pruned or replaced while being opened; reading" \
  "$scratch/info.out" || fail "the checkpoint info located was not pruned while it held (did the run train on?)"
grep -q "checksums   all verified" "$scratch/info.out" || fail "info did not verify the checkpoint it read"
echo "located, then pruned: info read the next one, $(grep -o 'checkpoint .*step_[0-9]*' "$scratch/info.out" | head -1)"

ZTRAIN_TEST_HOLD=checkpoint_opened:3 "$ZTRAIN" export "$out" "$scratch/hf" > "$scratch/export.out" 2>&1 &
reader=$!
spawned+=("$reader")
until_printed "$scratch/export.out" "test: holding at checkpoint_opened"
sleep 1.5
# Five listings a tenth of a second apart: the run renames a directory
# every few milliseconds, and one readdir across a rename may miss it.
during=$(for _ in 1 2 3 4 5; do
  steps
  sleep 0.1
done | sort -u)
exit_within "$reader" 60
[ "$status" -eq 0 ] || fail "export failed while the run trained on (exit $status)"
read_dir=$(sed -n 's/^wrote .* from \(.*\)$/\1/p' "$scratch/export.out")
held=$(basename "$read_dir")
[ -n "$held" ] && [ -f "$scratch/hf/model.safetensors" ] || fail "export wrote no weights"
echo "$during" | grep -qx "$held" || fail "the exported $held was not there during the hold: $during"
[ "$(echo "$during" | wc -l)" -ge 2 ] ||
  fail "no newer checkpoint was written during the hold (keep_last 1 kept only $during)"
for _ in $(seq 300); do
  [ -d "$out/$held" ] || break
  sleep 0.1
done
[ ! -d "$out/$held" ] || fail "$held was never pruned after the export released it"
kill -0 "$live" 2> /dev/null || fail "the training run stopped"
echo "opened and held: the run kept $held through the hold ($(echo $during)), pruned it after"
