#!/usr/bin/env bash
# Checkpoints: stop anywhere, resume exactly, on any world size and strategy.
# - Exact resume: a 20-step run checkpointed at step 10 and resumed from
#   there logs the uninterrupted run's losses and gradient norms for steps
#   11-20 bit for bit, for ddp, zero1, zero2, zero3 and the offload
#   strategies, in fp32 and bf16, with accumulation, at world 1 and 2; in
#   fp16 with an overflow before the checkpoint (the loss scaler's state
#   travels too). The step-10 checkpoint is written from a host copy while
#   steps 11 and on run (its copy shows in the memory summary); written
#   within the step (checkpoint_write = "in_step"), it resumes the same;
#   "auto" writes in the background when the run leaves a core free.
# - The edges of a resume: from the checkpoint of step 1 it logs the
#   uninterrupted run's steps 2-20 bit for bit; from the last step's, at
#   the same train.steps it is refused naming train.steps, and with one
#   step more it trains exactly that step.
# - Resharding: saved at world 4 under zero3 and resumed at world 2 under
#   zero1, at world 1 under ddp and at world 2 under zero3_offload, it
#   logs the world-4 run's losses within the cross-world tolerances.
# - Crash safety: killed (SIGKILL) at every 5th point of a checkpoint
#   written while training goes on and at each of its last points (the
#   commit, steps later), `latest` names a whole checkpoint that verifies,
#   and resuming from it gives the uninterrupted losses.
# - Damage named: a flipped byte (file and byte range), a missing rank
#   file, a truncated one, a manifest missing a piece, another model, a
#   changed training key; an allowed change is printed. A disk that fills
#   or fails (ENOSPC, EIO at world 2) during a checkpoint stops the run
#   naming it, leaving no partial files. Rank 1 of 2 killed while its
#   checkpoint is written in the background ends the job naming rank 1,
#   with the last checkpoint whole.
# - Stopping: SIGTERM to both ranks of a 2-rank run (or to one of them: the
#   other learns of it through the step agreement, or to the `ztrain
#   --nproc` launcher, which passes it on; a launcher killed outright takes
#   its ranks with it) writes a checkpoint and exits 0, and resuming it (`resume = true`, out_dir's latest) logs the
#   uninterrupted run's losses; SIGTERM during a checkpoint's write stops at
#   that checkpoint (no second one), the summary names no weights, and the
#   resumed run's metrics hold each step once; a resume with --resume alone
#   keeps the settings the checkpoint's run was given, and one naming a
#   directory that is not there says so; a second SIGINT ends a run at once
#   without touching `latest`.
# - Export: a checkpoint's weights are the live model's (byte for byte in
#   fp32, and in bf16 for a bf16 run), and a run started from them
#   evaluates to the same validation loss.
#
# usage: test_checkpoint.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

disk_dir swap

steps=20
base=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set train.steps="$steps" --set train.log_every=1 --set train.eval_every=0
  --set train.warmup_steps=5 --set device.threads=1 --set train.save_final=false)
nvme=(--set strategy.offload_optimizer.nvme_path="$swap" --set strategy.sub_group_size=3000)

# tail_curve NAME FROM: the curve of $scratch/NAME from step FROM+1 on, into NAME.tail.curve.
tail_curve() {
  awk -v from="$2" '$1 > from' "$scratch/$1.curve" > "$scratch/$1.tail.curve"
}

# resumed NAME FROM RANKS MICRO ACCUM ARGS...: a run resuming
# $scratch/FROM/step_10 (copied alone into $scratch/NAME) on RANKS ranks
# with that micro-batch and accumulation and ARGS; its curve must hold 10 steps.
resumed() {
  local name=$1 from=$2 np=$3 micro=$4 accum=$5
  shift 5
  mkdir -p "$scratch/$name"
  cp -r "$scratch/$from/step_10" "$scratch/$name/"
  on_ranks "$np" "$ZTRAIN" "${base[@]}" --set train.out_dir="$scratch/$name" \
    --set train.micro_batch_size="$micro" --set train.grad_accum="$accum" \
    --resume "$scratch/$name/step_10" "$@" "$SRC/configs/run.toml" > "$scratch/$name.out" 2>&1 ||
    { cat "$scratch/$name.out" >&2; fail "resumed run $name failed"; }
  grep -q "resuming $scratch/$name/step_10 at step 10 of 20" "$scratch/$name.out" ||
    fail "$name does not say it resumes step 10"
  curve "$name" 10
}

echo "== exact resume"
for spec in "ddp 2" "zero1 2" "zero2 2" "zero3 1" "zero3 2" "zero2_offload 1" "zero3_offload 2" \
  "zero3_nvme 1" "zero3_nvme 2"; do
  set -- $spec
  for precision in fp32 bf16; do
    name="$1_w$2_$precision"
    extra=(--strategy "$1" --set train.precision="$precision" --set train.checkpoint_every=10
      --set train.checkpoint_write=background)
    [ "$1" = zero3_nvme ] && extra+=("${nvme[@]}")
    train_run "$name" "$2" 2 2 "${extra[@]}"
    [ "$(cat "$scratch/$name/latest")" = step_20 ] || fail "$name: latest is not step_20"
    [ -f "$scratch/$name/step_10/manifest.json" ] || fail "$name: no step_10 checkpoint"
    resumed "${name}_resumed" "$name" "$2" 2 2 "${extra[@]}"
    tail_curve "$name" 10
    same_training "$name.tail" "${name}_resumed" 0 0
  done
done
[ -z "$(ls -A "$swap")" ] || fail "swap files left in $swap"
# checkpoint_line NAME STEP: the metrics line of NAME's checkpoint of STEP.
checkpoint_line() {
  grep "\"step\": $2, \"split\": \"checkpoint\"" "$scratch/$1/metrics.jsonl" ||
    fail "$1: no checkpoint line for step $2"
}
checkpoint_line zero3_w2_fp32 10 | grep -q '"overlapped": true' ||
  fail "the step-10 checkpoint was not written while training went on"
grep -Eq "host: .*checkpoint [0-9.]+ KiB" "$scratch/zero3_w2_fp32.out" ||
  fail "the checkpoint's host copy is not in the memory summary"

echo "== exact resume, written within the step"
inline=(--strategy zero2 --set train.checkpoint_every=10 --set train.checkpoint_write=in_step)
train_run inline 2 2 2 "${inline[@]}"
checkpoint_line inline 10 | grep -q '"overlapped": false' || fail "inline: overlapped anyway"
grep -q "checkpoint [0-9.]* KiB" "$scratch/inline.out" && fail "inline: a host copy was made"
resumed inline_resumed inline 2 2 2 "${inline[@]}"
tail_curve inline 10
same_training inline.tail inline_resumed 0 0

echo "== resume at the edges: after the first step, and at the last"
# A checkpoint of step 1 resumes to the uninterrupted run's steps 2-20 (the
# first step is inside warmup, so its lr does not depend on train.steps).
edge=(--strategy ddp --set train.checkpoint_every=1)
on_ranks 2 "$ZTRAIN" "${base[@]}" "${edge[@]}" --set train.steps=1 --set train.micro_batch_size=2 \
  --set train.grad_accum=2 --set train.out_dir="$scratch/first" "$SRC/configs/run.toml" \
  > "$scratch/first.out" 2>&1 || fail "the one-step run failed"
on_ranks 2 "$ZTRAIN" "${base[@]}" "${edge[@]}" --set train.micro_batch_size=2 --set train.grad_accum=2 \
  --set train.out_dir="$scratch/first" --resume "$SRC/configs/run.toml" > "$scratch/from_first.out" 2>&1 ||
  fail "the resume from step 1 failed"
grep -q "resuming $scratch/first/step_1 at step 1 of 20" "$scratch/from_first.out" ||
  fail "the resume does not say it resumes step 1"
train_curve "$scratch/first/metrics.jsonl" | awk '$1 > 1' > "$scratch/from_first.curve"
tail_curve ddp_w2_fp32 1
same_training ddp_w2_fp32.tail from_first 0 0
# The last step's checkpoint: nothing is left to train at the same
# train.steps (refused, saying what to raise); one more step trains one.
status=0
on_ranks 2 "$ZTRAIN" "${base[@]}" --strategy ddp --set train.micro_batch_size=2 --set train.grad_accum=2 \
  --set train.out_dir="$scratch/at_end" --resume "$scratch/ddp_w2_fp32/step_20" "$SRC/configs/run.toml" \
  > "$scratch/at_end.out" 2>&1 || status=$?
[ "$status" -eq 2 ] && grep -q "step_20 is at step 20, which train.steps = 20 does not pass; raise train.steps" \
  "$scratch/at_end.out" || fail "a resume at the last step was not refused as such (exit $status)"
on_ranks 2 "$ZTRAIN" "${base[@]}" --strategy ddp --set train.steps=21 --set train.micro_batch_size=2 \
  --set train.grad_accum=2 --set train.out_dir="$scratch/past_end" --resume "$scratch/ddp_w2_fp32/step_20" \
  "$SRC/configs/run.toml" > "$scratch/past_end.out" 2>&1 || fail "the resume for one more step failed"
[ "$(grep -c '^step ' "$scratch/past_end.out")" -eq 1 ] && grep -q '^step 21/21 ' "$scratch/past_end.out" ||
  fail "one more step did not train exactly step 21: $(grep '^step ' "$scratch/past_end.out" | head -3)"

echo "== fp16: the loss scaler continues"
fp16=(--strategy zero2 --set train.precision=fp16 --set train.fp16.initial_scale_power=12
  --set train.fp16.loss_scale_window=4 --set train.checkpoint_every=10)
ZTRAIN_TEST_INJECT_OVERFLOW=7:0 train_run fp16 1 2 2 "${fp16[@]}"
grep -q "overflow: skipping step 7" "$scratch/fp16.out" || fail "fp16: no overflow at step 7"
resumed fp16_resumed fp16 1 2 2 "${fp16[@]}"
tail_curve fp16 10
same_training fp16.tail fp16_resumed 0 0
grep -q '"applied_steps": 9' "$scratch/fp16/step_10/manifest.json" ||
  fail "fp16: the manifest does not count 9 applied steps"
# checkpoint_write = "auto" (this run's): 1 rank x 1 thread leaves a core
# free on a machine of 2 or more, so it writes in the background there.
want=$([ "$(nproc)" -gt 1 ] && echo true || echo false)
checkpoint_line fp16 10 | grep -q "\"overlapped\": $want" ||
  fail "auto: 1 rank x 1 thread on $(nproc) cores did not give overlapped = $want"

echo "== resharding: world 4 zero3 to other worlds and strategies"
train_run w4 4 1 2 --strategy zero3 --set train.checkpoint_every=10
tail_curve w4 10
resumed w4_to_zero1_w2 w4 2 1 4 --strategy zero1
resumed w4_to_ddp_w1 w4 1 1 8 --strategy ddp
resumed w4_to_offload_w2 w4 2 1 4 --strategy zero3_offload
for name in w4_to_zero1_w2 w4_to_ddp_w1 w4_to_offload_w2; do
  same_training w4.tail "$name" 1e-6 2e-6
done
grep -q "changed: ranks: 4 -> 1" "$scratch/w4_to_ddp_w1.out" || fail "the new world size is not said"
grep -q 'changed: strategy.plugin: "zero3" -> "ddp"' "$scratch/w4_to_ddp_w1.out" ||
  fail "the new strategy is not said"

echo "== crash safety: killed at points of a checkpoint write"
crash=(--strategy zero1 --set train.steps=15 --set train.checkpoint_every=5 --set train.keep_last=1
  --set train.micro_batch_size=2 --set train.grad_accum=1 --set train.checkpoint_write=background)
steps=15 train_run nocrash 1 2 1 "${crash[@]}"
# kill_at K: a run killed at point K of its step-10 checkpoint (written in
# the background during steps 11 and on, committed at a later step);
# $status is its exit status (0: the write has fewer points). After a
# kill, latest must name a whole checkpoint that verifies and resumes to
# the same losses.
kill_at() {
  local k=$1 latest
  rm -rf "$scratch/crash"
  status=0
  ZTRAIN_TEST_KILL_IN_CHECKPOINT=10:$k "$ZTRAIN" "${base[@]}" "${crash[@]}" \
    --set train.out_dir="$scratch/crash" "$SRC/configs/run.toml" > "$scratch/crash.out" 2>&1 ||
    status=$?
  [ "$status" -eq 0 ] && return
  [ "$status" -eq 137 ] || { cat "$scratch/crash.out" >&2; fail "kill point $k: exit $status, not 137"; }
  latest=$(cat "$scratch/crash/latest")
  case "$latest" in step_5 | step_10) ;; *) fail "kill point $k: latest names '$latest'" ;; esac
  "$ZTRAIN" checkpoint info "$scratch/crash" > "$scratch/info.out" 2>&1 ||
    { cat "$scratch/info.out" >&2; fail "kill point $k: $latest does not verify"; }
  grep -q "checksums   all verified" "$scratch/info.out" || fail "kill point $k: not verified"
  [ "$latest" = step_5 ] || return 0
  "$ZTRAIN" "${base[@]}" "${crash[@]}" --set train.out_dir="$scratch/crash" --resume \
    "$SRC/configs/run.toml" > "$scratch/crash_resumed.out" 2>&1 ||
    { cat "$scratch/crash_resumed.out" >&2; fail "kill point $k: resume failed"; }
  train_curve "$scratch/crash/metrics.jsonl" | awk '$1 > 5' | tail -n 10 > "$scratch/crash.tail.curve"
  awk '$1 > 5' "$scratch/nocrash.curve" > "$scratch/nocrash.tail.curve"
  same_training nocrash.tail crash.tail 0 0 > /dev/null
}
# Every 5th point until the write completes, then every one of the last
# points (the commit: manifest, rename, latest, pruning).
tried=0
for ((k = 1; k < 2000; k += 5)); do
  kill_at "$k"
  [ "$status" -eq 0 ] && break
  tried=$((tried + 1))
done
[ "$status" -eq 0 ] || fail "the checkpoint write never completed"
end=$k
last=0
for ((k = end - 1; k > end - 10; k--)); do
  kill_at "$k"
  [ "$status" -eq 0 ] || { tried=$((tried + 1)) && last=$((last + 1)); }
done
[ "$last" -ge 5 ] || fail "only $last of the last points were tried"
[ "$tried" -ge 20 ] || fail "only $tried kill points were tried"
echo "killed at $tried points of the write (every 5th, then each of the last); each left a whole latest"

echo "== damage is named"
good="$scratch/zero3_w2_fp32/step_10"
check_refused() {  # WHAT EXPECTED-TEXT DIR: info and a resume both fail naming it
  local status=0
  "$ZTRAIN" checkpoint info "$3" > "$scratch/damaged.out" 2>&1 || status=$?
  [ "$status" -ne 0 ] || fail "$1: checkpoint info passed"
  grep -qF -- "$2" "$scratch/damaged.out" || { cat "$scratch/damaged.out" >&2; fail "$1: '$2' not said"; }
  status=0
  "$ZTRAIN" "${base[@]}" --set train.out_dir="$scratch/damaged_run" --resume "$3" \
    "$SRC/configs/run.toml" > "$scratch/damaged.out" 2>&1 || status=$?
  [ "$status" -ne 0 ] || fail "$1: resumed anyway"
  grep -qF -- "$2" "$scratch/damaged.out" || { cat "$scratch/damaged.out" >&2; fail "$1: '$2' not said on resume"; }
  echo "$1: refused, naming it"
}
cp -r "$good" "$scratch/flipped"
printf '\x55' | dd of="$scratch/flipped/rank_1.bin" bs=1 seek=1000 conv=notrunc status=none
check_refused "a flipped byte" "bytes [0, " "$scratch/flipped"
grep -q "rank_1.bin' (.*fail their checksum" "$scratch/damaged.out" || fail "the corrupt file is not named"
cp -r "$good" "$scratch/missing" && rm "$scratch/missing/rank_1.bin"
check_refused "a missing rank file" "rank_1.bin' is missing" "$scratch/missing"
cp -r "$good" "$scratch/truncated" && truncate -s 1000 "$scratch/truncated/rank_0.bin"
check_refused "a truncated rank file" "rank_0.bin' has 1000 bytes, the manifest says" "$scratch/truncated"
cp -r "$good" "$scratch/unpieced"
python3 - "$scratch/unpieced/manifest.json" << 'PY'
import json, sys
m = json.load(open(sys.argv[1]))
del m["params"][3]["pieces"][0]
json.dump(m, open(sys.argv[1], "w"))
PY
check_refused "a manifest without a piece" "has no piece for elements" "$scratch/unpieced"
status=0
"$ZTRAIN" "${base[@]}" --set model.n_embd=128 --set train.out_dir="$scratch/other_model" \
  --resume "$good" "$SRC/configs/run.toml" > "$scratch/other.out" 2>&1 || status=$?
[ "$status" -ne 0 ] && grep -q "in this run's model; it was written by another model" "$scratch/other.out" ||
  { cat "$scratch/other.out" >&2; fail "another model was not refused"; }
status=0
"$ZTRAIN" "${base[@]}" --set train.lr=1e-2 --set train.out_dir="$scratch/other_lr" \
  --resume "$good" "$SRC/configs/run.toml" > "$scratch/other.out" 2>&1 || status=$?
[ "$status" -ne 0 ] && grep -q "train.lr is 0.003 in the checkpoint and 0.01 in this run" "$scratch/other.out" ||
  { cat "$scratch/other.out" >&2; fail "a changed lr was not refused naming it"; }
grep -q "changed: train.steps: 20 -> 30" < <("$ZTRAIN" "${base[@]}" --set train.steps=30 \
  --set train.out_dir="$scratch/more_steps" --resume "$good" "$SRC/configs/run.toml" 2>&1) ||
  fail "a longer run is not said"

echo "== a disk that fills during a checkpoint"
status=0
ZTRAIN_TEST_INJECT_WRITE_ERROR=ENOSPC "$ZTRAIN" "${base[@]}" --set train.checkpoint_every=5 \
  --set train.out_dir="$scratch/full_disk" "$SRC/configs/run.toml" > "$scratch/full_disk.out" 2>&1 ||
  status=$?
[ "$status" -eq 1 ] || { cat "$scratch/full_disk.out" >&2; fail "a full disk: exit $status, not 1"; }
grep -q "checkpoint of step 5: cannot write '.*rank_0.bin': No space left on device; the disk is full" \
  "$scratch/full_disk.out" || { cat "$scratch/full_disk.out" >&2; fail "a full disk is not named"; }
[ -z "$(ls -d "$scratch/full_disk"/step_* 2> /dev/null)" ] || fail "a full disk left $(ls -d "$scratch/full_disk"/step_*)"
echo "a full disk during a checkpoint: exit 1, named, no partial checkpoint left"

echo "== a disk that fails (EIO) during a checkpoint of a 2-rank run"
status=0
# (n_embd 256: every rank's file passes the first MiB the injection spares)
ZTRAIN_TEST_INJECT_WRITE_ERROR=EIO on_ranks 2 "$ZTRAIN" "${base[@]}" --set model.n_embd=256 \
  --set train.checkpoint_every=5 --set train.out_dir="$scratch/eio" "$SRC/configs/run.toml" > "$scratch/eio.out" 2>&1 || status=$?
[ "$status" -ne 0 ] || fail "EIO: exit 0"
grep -q "checkpoint of step 5: cannot write '.*rank_[01].bin': Input/output error" "$scratch/eio.out" ||
  { cat "$scratch/eio.out" >&2; fail "EIO is not named"; }
[ -z "$(ls -d "$scratch/eio"/step_* 2> /dev/null)" ] || fail "EIO left $(ls -d "$scratch/eio"/step_*)"
echo "EIO during a checkpoint: exit $status, named, no partial checkpoint left"

echo "== rank 1 killed while its checkpoint is written in the background"
status=0
start=$(date +%s%N)
ZTRAIN_TEST_KILL_IN_CHECKPOINT=10:3:1 on_ranks 2 "$ZTRAIN" "${base[@]}" "${crash[@]}" \
  --set train.out_dir="$scratch/killed_rank" "$SRC/configs/run.toml" > "$scratch/killed_rank.out" 2>&1 ||
  status=$?
took=$((($(date +%s%N) - start) / 1000000))
[ "$status" -ne 0 ] || fail "a killed rank: exit 0"
grep -q "rank 1" "$scratch/killed_rank.out" || { cat "$scratch/killed_rank.out" >&2; fail "rank 1 is not named"; }
[ "$(cat "$scratch/killed_rank/latest")" = step_5 ] || fail "latest is not step_5 after the kill"
"$ZTRAIN" checkpoint info "$scratch/killed_rank" > "$scratch/info.out" 2>&1 &&
  grep -q "checksums   all verified" "$scratch/info.out" || fail "step_5 does not verify after the kill"
echo "rank 1 killed in the step-10 write: exit $status in $took ms (whole run), rank 1 named, step_5 intact"

# until_trained OUT: waits (up to 60 s) until the run writing OUT has
# logged three training steps, so that a signal comes during training.
until_trained() {
  local i
  for ((i = 0; i < 600; i++)); do
    [ -f "$1/metrics.jsonl" ] && [ "$(grep -c '"split": "train"' "$1/metrics.jsonl")" -ge 3 ] && return
    sleep 0.1
  done
}

echo "== stopping: SIGTERM to a 2-rank run"
slow=(--strategy zero2 --set train.schedule=constant --set train.warmup_steps=0
  --set train.steps=100000 --set model.n_embd=128 --set train.keep_last=0)
out="$scratch/sigterm"
on_ranks 2 "$ZTRAIN" "${base[@]}" "${slow[@]}" --set train.out_dir="$out" \
  "$SRC/configs/run.toml" > "$scratch/sigterm.out" 2>&1 &
spawned+=($!)
launcher=$!
until_trained "$out"
# The ranks, as a scheduler signals every task (not mpirun, which would end the job).
pkill -TERM -f -- "^$ZTRAIN .*train.out_dir=$out" || fail "no rank to signal"
exit_within "$launcher" 60
[ "$status" -eq 0 ] || { cat "$scratch/sigterm.out" >&2; fail "SIGTERM: exit $status, not 0"; }
grep -q "stopped at step [0-9]* by SIGTERM" "$scratch/sigterm.out" ||
  { cat "$scratch/sigterm.out" >&2; fail "SIGTERM: no stop line"; }
stop=$(sed -n 's/.*stopped at step \([0-9]*\) by SIGTERM.*/\1/p' "$scratch/sigterm.out" | head -n 1)
[ "$(cat "$out/latest")" = "step_$stop" ] || fail "SIGTERM: latest is not step_$stop"
echo "stopped by SIGTERM at step $stop"
more=$((stop + 4))
on_ranks 2 "$ZTRAIN" "${base[@]}" "${slow[@]}" --set train.steps="$more" \
  --set train.out_dir="$scratch/sigterm_ref" "$SRC/configs/run.toml" > "$scratch/ref.out" 2>&1 ||
  fail "the reference run failed"
on_ranks 2 "$ZTRAIN" "${base[@]}" "${slow[@]}" --set train.steps="$more" \
  --set train.out_dir="$out" --set train.resume=true "$SRC/configs/run.toml" > "$scratch/sigterm_resumed.out" 2>&1 ||
  { cat "$scratch/sigterm_resumed.out" >&2; fail "resuming after SIGTERM failed"; }
curve sigterm_ref "$more"
train_curve "$out/metrics.jsonl" | awk -v s="$stop" '$1 > s' | tail -n 4 > "$scratch/sigterm_tail.curve"
awk -v s="$stop" '$1 > s' "$scratch/sigterm_ref.curve" > "$scratch/sigterm_ref_tail.curve"
same_training sigterm_ref_tail sigterm_tail 0 0

# launched NAME: `ztrain --nproc 2` of the slow run into $scratch/NAME, in
# the background ($launcher), once it trains; sets $out.
launched() {
  out="$scratch/$1"
  "$ZTRAIN" --nproc 2 "${base[@]}" "${slow[@]}" --set train.out_dir="$out" \
    "$SRC/configs/run.toml" > "$scratch/$1.out" 2>&1 &
  spawned+=($!)
  launcher=$!
  until_trained "$out"
}

echo "== stopping: SIGTERM to the launcher (ztrain --nproc 2): every rank stops, exit 0"
launched sigterm_launcher
kill -TERM "$launcher"
exit_within "$launcher" 60
[ "$status" -eq 0 ] || { cat "$scratch/sigterm_launcher.out" >&2; fail "SIGTERM to the launcher: exit $status, not 0"; }
stop=$(sed -n 's/.*stopped at step \([0-9]*\) by the launcher.*/\1/p' "$scratch/sigterm_launcher.out" | head -n 1)
[ -n "$stop" ] || { cat "$scratch/sigterm_launcher.out" >&2; fail "SIGTERM to the launcher: no stop line"; }
[ "$(cat "$out/latest")" = "step_$stop" ] || fail "SIGTERM to the launcher: latest is not step_$stop"
echo "SIGTERM to the launcher: stopped at step $stop, exit 0, its checkpoint latest"
# The launcher killed outright (SIGKILL): the job does not outlive it.
launched killed_launcher
kill -KILL "$launcher"
for ((i = 0; i < 300; i++)); do
  pgrep -f -- "train.out_dir=$out" > /dev/null || break
  sleep 0.1
done
if pgrep -f -- "train.out_dir=$out" > /dev/null; then
  pkill -9 -f -- "train.out_dir=$out" || true
  fail "the ranks outlived their killed launcher by 30 s"
fi
echo "the launcher killed: its ranks ended within $((i / 10)) s"

echo "== stopping: SIGTERM to one rank of two stops both, at the same step"
out="$scratch/sigterm_one"
on_ranks 2 "$ZTRAIN" "${base[@]}" "${slow[@]}" --set train.out_dir="$out" \
  "$SRC/configs/run.toml" > "$scratch/sigterm_one.out" 2>&1 &
spawned+=($!)
launcher=$!
until_trained "$out"
# One of the two ranks (the last pgrep lists): the other learns of the stop
# through the step agreement.
one=$(pgrep -f -- "^$ZTRAIN .*train.out_dir=$out" | tail -n 1)
[ -n "$one" ] || fail "no rank to signal"
kill -TERM "$one"
exit_within "$launcher" 60
[ "$status" -eq 0 ] || { cat "$scratch/sigterm_one.out" >&2; fail "SIGTERM to one rank: exit $status, not 0"; }
stop=$(sed -n 's/.*stopped at step \([0-9]*\) by SIGTERM.*/\1/p' "$scratch/sigterm_one.out" | head -n 1)
[ -n "$stop" ] || { cat "$scratch/sigterm_one.out" >&2; fail "SIGTERM to one rank: no stop line"; }
[ "$(cat "$out/latest")" = "step_$stop" ] || fail "SIGTERM to one rank: latest is not step_$stop"
"$ZTRAIN" checkpoint info "$out/step_$stop" > "$scratch/sigterm_one.info" 2>&1 ||
  { cat "$scratch/sigterm_one.info" >&2; fail "SIGTERM to one rank: step_$stop does not verify"; }
echo "SIGTERM to one rank of two: both stopped at step $stop, its checkpoint whole"

echo "== SIGTERM while a checkpoint is written: the run stops at that checkpoint"
# Steps of 8 tokens on a 6.5M-parameter model take ~10 ms, the 74 MiB
# checkpoint ~0.2 s in the background: the signal comes during the write.
# The run used to train one more step and write a second whole checkpoint.
out="$scratch/in_write"
in_write=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=512 --set model.seq_len=8
  --set model.vocab_size=256 --set train.global_batch_size=1 --set train.micro_batch_size=1
  --set train.log_every=1 --set train.eval_every=0 --set device.threads=1 --set train.checkpoint_every=20
  --set train.out_dir="$out")
"$ZTRAIN" "${in_write[@]}" --set train.steps=100000 "$SRC/configs/run.toml" > "$scratch/in_write.out" 2>&1 &
spawned+=($!)
pid=$!
for ((i = 0; i < 3000; i++)); do
  compgen -G "$out/step_*.tmp" > /dev/null && break
  sleep 0.01
done
writing=$(compgen -G "$out/step_*.tmp" | head -n 1)
[ -n "$writing" ] || fail "no checkpoint was being written within 30 s"
kill -TERM "$pid"
exit_within "$pid" 60
[ "$status" -eq 0 ] || fail "SIGTERM during a write: exit $status, not 0"
written=$(basename "$writing" .tmp)
grep -q "the checkpoint of step ${written#step_}, being written when the signal came, is where it stops" \
  "$scratch/in_write.out" || fail "SIGTERM during a write: no stop at the checkpoint in flight"
[ "$(cat "$out/latest")" = "$written" ] || fail "SIGTERM during a write: latest is $(cat "$out/latest"), not $written"
[ "$(ls -d "$out"/step_* | wc -l)" -eq 1 ] || fail "SIGTERM during a write: more checkpoints: $(ls "$out")"
! grep -q "weights: " "$scratch/in_write.out" || fail "the stopped run's summary names weights it did not write"
[ ! -e "$out/model.safetensors" ] || fail "the stopped run wrote final weights"
echo "SIGTERM during the write of $written: stopped there"
# Resumed, metrics.jsonl holds each step once: the stopped attempt's steps
# past the checkpoint are dropped, saying so.
"$ZTRAIN" "${in_write[@]}" --set train.steps=$((${written#step_} + 3)) --resume "$SRC/configs/run.toml" \
  > "$scratch/in_write_resumed.out" 2>&1 || fail "resuming after the stop failed"
grep -q "metrics.jsonl: dropped [0-9]* lines\? after step ${written#step_}" "$scratch/in_write_resumed.out" ||
  fail "the resumed run did not say it dropped the later lines"
steps_logged=$(train_curve "$out/metrics.jsonl" | awk '{print $1}')
[ "$(sort -n <<< "$steps_logged" | uniq -d)" = "" ] || fail "metrics.jsonl logs a step twice after the resume"
[ "$(tail -n 1 <<< "$steps_logged")" -eq $((${written#step_} + 3)) ] || fail "the resumed run did not finish"

echo "== a resume continues the run as it was set"
# Started with --set train.checkpoint_every=2, resumed with --resume and a
# new step count only: it keeps checkpointing (it used to stop silently),
# saying which settings came from the checkpoint's run.
out="$scratch/inherit"
"$ZTRAIN" "${base[@]}" --set train.steps=4 --set train.checkpoint_every=2 --set train.out_dir="$out" \
  "$SRC/configs/run.toml" > "$scratch/inherit.out" 2>&1 || fail "the run to resume failed"
"$ZTRAIN" "${base[@]}" --set train.steps=8 --set train.out_dir="$out" --resume "$SRC/configs/run.toml" \
  > "$scratch/inherit_resumed.out" 2>&1 || fail "the resume failed: $(tail -2 "$scratch/inherit_resumed.out")"
grep -A3 "resume: continuing the run that wrote $out/step_4:" "$scratch/inherit_resumed.out" |
  grep -q "train.checkpoint_every = 2" || fail "the resume does not say it kept checkpoint_every"
grep -q "changed: train.steps: 4 -> 8" "$scratch/inherit_resumed.out" || fail "the resume does not say steps changed"
[ -d "$out/step_6" ] && [ "$(cat "$out/latest")" = step_8 ] || fail "the resumed run stopped checkpointing: $(ls "$out")"
# --resume with a directory that is not there says so.
status=0
"$ZTRAIN" "${base[@]}" --resume "$scratch/no_such_run" "$SRC/configs/run.toml" > "$scratch/missing.out" 2>&1 ||
  status=$?
[ "$status" -eq 2 ] && grep -q "no checkpoint at '$scratch/no_such_run': no such directory" "$scratch/missing.out" ||
  fail "--resume with a missing directory: $(tail -1 "$scratch/missing.out")"

echo "== a second SIGINT ends the run at once"
out="$scratch/sigint"
"$ZTRAIN" "${base[@]}" "${slow[@]}" --set model.n_embd=512 --set train.checkpoint_every=2 --set train.keep_last=2 \
  --set train.out_dir="$out" "$SRC/configs/run.toml" > "$scratch/sigint.out" 2>&1 &
spawned+=($!)
pid=$!
for ((i = 0; i < 600; i++)); do
  [ -f "$out/latest" ] && break
  sleep 0.1
done
kill -INT "$pid"
sleep 0.01 # two signals sent at once would arrive as one
kill -INT "$pid"
exit_within "$pid" 30
[ "$status" -eq 130 ] || { cat "$scratch/sigint.out" >&2; fail "two SIGINTs: exit $status, not 130"; }
! grep -q "stopped at step" "$scratch/sigint.out" || fail "two SIGINTs: the run went on to stop normally"
latest=$(cat "$out/latest")
"$ZTRAIN" checkpoint info "$out" > /dev/null || fail "after two SIGINTs latest does not verify"
echo "two SIGINTs: exit 130 at once, latest ($latest) whole"

echo "== export: a checkpoint's weights are the live model's"
# same_tensors A B: the two safetensors files hold the same tensors, byte for byte.
same_tensors() {
  python3 - "$1" "$2" << 'PY'
import json, struct, sys
def tensors(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items()}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
sys.exit(0 if a == b and a else 1)
PY
}
for precision in fp32 bf16; do
  name=export_$precision
  train_run "$name" 2 2 1 --strategy zero3 --set train.precision="$precision" \
    --set train.checkpoint_every=20 --set train.save_final=true --set train.eval_every=20
  "$ZTRAIN" export "$scratch/$name/step_20" "$scratch/$name.ckpt.safetensors" --dtype "$precision" > /dev/null
  "$ZTRAIN" export "$scratch/$name" "$scratch/$name.live.safetensors" --dtype "$precision" > /dev/null
  same_tensors "$scratch/$name.ckpt.safetensors" "$scratch/$name.live.safetensors" ||
    fail "$name: the checkpoint's weights differ from the live model's"
  echo "$name: checkpoint export = live weights ($precision, byte for byte)"
done
val=$(metrics_fields "$scratch/export_fp32/metrics.jsonl" val loss)
"$ZTRAIN" "${base[@]}" --set train.steps=1 --set train.lr=0 --set train.min_lr=0 \
  --set train.micro_batch_size=2 --set train.grad_accum=2 \
  --set train.eval_every=1 --set model.init_from="$scratch/export_fp32.ckpt.safetensors" \
  --set train.out_dir="$scratch/imported" "$SRC/configs/run.toml" > "$scratch/imported.out" 2>&1 ||
  { cat "$scratch/imported.out" >&2; fail "training from the exported checkpoint failed"; }
val2=$(metrics_fields "$scratch/imported/metrics.jsonl" val loss)
[ "$val" = "$val2" ] || fail "val loss $val2 from the exported checkpoint, $val in the run"
echo "val loss from the exported checkpoint: $val2 (the run's: $val)"
