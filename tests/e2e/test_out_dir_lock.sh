#!/usr/bin/env bash
# A live run's directory is its own:
# - while a run trains, a second job into its out_dir is refused, with
#   --overwrite and with --resume alike, naming the holder's host and pid,
#   and the live run goes on untouched (it used to die with "No such file
#   or directory" once --overwrite had removed its files);
# - once the holder is killed (its lock file stays behind), the next run
#   takes the lock over, saying whose it was and that it no longer runs;
# - a finished run leaves no lock file;
# - the hand-off: a run started while the last one releases its lock holds
#   the directory (a third job is refused), with the release held at its
#   dangerous moment by a test fault point;
# - a start that failed before its first step (out of memory) leaves no
#   run: the next command into that directory needs no --overwrite.
#
# usage: test_out_dir_lock.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

base=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set train.eval_every=0 --set train.log_every=1 --set device.threads=1)
out="$scratch/run"

"$ZTRAIN" "${base[@]}" --set train.steps=100000 --set train.checkpoint_every=2 \
  --set train.out_dir="$out" "$SRC/configs/run.toml" > "$scratch/live.out" 2>&1 &
live=$!
spawned+=("$live")
until_exists "$out/latest"

# expect_held NAME ARGS...: refused (exit 2) naming this host and the live pid.
expect_held() {
  local name=$1 status=0
  shift
  "$ZTRAIN" "${base[@]}" --set train.steps=3 --set train.out_dir="$out" "$@" "$SRC/configs/run.toml" \
    > "$scratch/$name.out" 2>&1 || status=$?
  [ "$status" -eq 2 ] || fail "$name: exit $status, not 2, beside a live run"
  grep -q "out_dir '$out' is in use by a running job (host $(hostname), pid $live, since " \
    "$scratch/$name.out" || fail "$name: the refusal does not name the live run's host and pid"
  echo "$name: $(grep -m1 "in use" "$scratch/$name.out" | cut -c1-200)"
}
expect_held overwrite --overwrite
expect_held resume --resume latest --set train.steps=100000
expect_held plain
kill -0 "$live" 2> /dev/null || fail "the live run died beside the refused jobs"
grep -q "error" "$scratch/live.out" && fail "the live run reported an error: $(grep error "$scratch/live.out")"
steps_before=$(grep -c '"split": "train"' "$out/metrics.jsonl")
sleep 1
[ "$(grep -c '"split": "train"' "$out/metrics.jsonl")" -gt "$steps_before" ] ||
  fail "the live run stopped training"

# Killed, it leaves its lock file; the next run takes it over.
kill -9 "$live"
wait "$live" 2> /dev/null || true
[ -e "$out/.ztrain.lock" ] || fail "the killed run left no lock file (was it ever written?)"
"$ZTRAIN" "${base[@]}" --set train.steps=3 --set train.out_dir="$out" --overwrite \
  "$SRC/configs/run.toml" > "$scratch/after.out" 2>&1 || fail "the run after the killed one failed"
grep -q "took over the lock of an earlier run that ended without releasing it (host $(hostname), pid $live, since .*, no longer running)" \
  "$scratch/after.out" || fail "no note on the lock taken over: $(head -3 "$scratch/after.out")"
[ ! -e "$out/.ztrain.lock" ] || fail "a finished run left its lock file"

# The hand-off, made deterministic: run A, ending, holds between removing
# its lock file and releasing the lock (ZTRAIN_TEST_HOLD=lock_release:4); run
# B starts into the directory then (--overwrite: A's run is done) and
# trains; C, once A is gone, is refused by B's lock. Released the other way
# round, B would lock A's old file, which A then removes, and C would take
# a new lock file and overwrite B's live run.
handoff="$scratch/handoff"
ZTRAIN_TEST_HOLD=lock_release:4 "$ZTRAIN" "${base[@]}" --set train.steps=2 --set train.out_dir="$handoff" \
  "$SRC/configs/run.toml" > "$scratch/handoff_a.out" 2>&1 &
a=$!
spawned+=("$a")
until_printed "$scratch/handoff_a.out" "test: holding at lock_release"
"$ZTRAIN" "${base[@]}" --set train.steps=100000 --set train.out_dir="$handoff" --overwrite \
  "$SRC/configs/run.toml" > "$scratch/handoff_b.out" 2>&1 &
b=$!
spawned+=("$b")
exit_within "$a" 60
[ "$status" -eq 0 ] || fail "run A failed: $(tail -2 "$scratch/handoff_a.out")"
for _ in $(seq 600); do
  [ -f "$handoff/metrics.jsonl" ] && grep -q '"split": "train"' "$handoff/metrics.jsonl" && break
  sleep 0.1
done
kill -0 "$b" 2> /dev/null || fail "run B did not start beside A's release: $(tail -3 "$scratch/handoff_b.out")"
status=0
"$ZTRAIN" "${base[@]}" --set train.steps=3 --set train.out_dir="$handoff" --overwrite \
  "$SRC/configs/run.toml" > "$scratch/handoff_c.out" 2>&1 || status=$?
[ "$status" -eq 2 ] && grep -q "is in use by a running job (host $(hostname), pid $b," "$scratch/handoff_c.out" ||
  fail "run C was not refused beside B, which took over A's directory (exit $status): $(tail -3 "$scratch/handoff_c.out")"
kill -9 "$b"
wait "$b" 2> /dev/null || true
echo "hand-off: B took the directory while A released it; C was refused, naming B"

# A start that fails before its first step leaves no run behind.
failed="$scratch/failed"
if "$ZTRAIN" --strategy ddp --set train.steps=2 --set train.out_dir="$failed" \
  "$SRC/configs/examples/offload.toml" > "$scratch/oom.out" 2>&1; then
  fail "the out-of-memory start trained"
fi
grep -q "out of memory" "$scratch/oom.out" || fail "the start failed otherwise: $(tail -2 "$scratch/oom.out")"
"$ZTRAIN" "${base[@]}" --set train.steps=2 --set train.out_dir="$failed" "$SRC/configs/run.toml" \
  > "$scratch/retry.out" 2>&1 || fail "the directory of a failed start was refused: $(tail -2 "$scratch/retry.out")"
curve failed 2
echo "PASS"
