#!/usr/bin/env bash
# A torchrun-style launch: every rank started on its own with RANK,
# WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT and
# no MPI. The ranks meet at rank 0's store and run on gloo; they must log
# the losses and gradient norms of one process (ddp at world 2 and 4,
# zero3 at world 2 with accumulation, bf16), and count the bytes a ring
# sends (2 (N-1) x 4 bytes per gradient element and for the loss average
# and stop request, summed over ranks, as test_world_equivalence.sh); a
# rank 0 that starts late is waited for; a killed rank ends the others
# within the timeout with a message naming the peer, and a frozen one is
# named by the others' timeout messages (a frozen rank 0 within the timeout
# the others learnt from it); a missing MASTER_ADDR, and two processes
# claiming one rank, are clear errors.
#
# usage: test_env_launch.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

common=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set train.steps=20 --set train.log_every=1 --set train.eval_every=20
  --set train.warmup_steps=5 --set device.threads=1 --set train.save_final=false)

# ranks NAME N [ARGS...]: N ranks in the background; their pids in $pids
ranks() {
  local name=$1 n=$2 r
  shift 2
  reserve_port
  pids=()
  for ((r = 0; r < n; r++)); do
    RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port "$ZTRAIN" "${common[@]}" --set train.out_dir="$scratch/$name" "$@" \
      "$SRC/configs/run.toml" > "$scratch/$name.$r.out" 2>&1 &
    pids+=($!)
    spawned+=($!)
  done
}
losses() { curve "$1" 20; }
# training NAME: waits until rank 0 of NAME has logged step 2, so that what
# the test does next happens during training, not start-up
# (test_start_faults.sh covers that), however slowly a busy machine starts
# the ranks.
training() { until_step "$scratch/$1.0.out" 2; }
# run NAME N MICRO ACCUM [ARGS...]
run() {
  local name=$1 n=$2 micro=$3 accum=$4 r
  shift 4
  ranks "$name" "$n" --set train.micro_batch_size="$micro" --set train.grad_accum="$accum" "$@"
  for ((r = 0; r < n; r++)); do
    wait "${pids[$r]}" || { cat "$scratch/$name".*.out >&2; fail "$name: rank $r failed"; }
  done
  losses "$name"
}

"$ZTRAIN" "${common[@]}" --set train.micro_batch_size=8 --set train.out_dir="$scratch/w1" \
  "$SRC/configs/run.toml" > "$scratch/w1.out" 2>&1 || { cat "$scratch/w1.out" >&2; fail "world 1 failed"; }
losses w1
run gloo_w2 2 4 1
run gloo_w4 4 2 1
run gloo_zero3_w2 2 2 2 --strategy zero3 --set strategy.param_persistence_threshold=0
# On one host the collectives run through shared memory unless told not to;
# gloo's own TCP transport must train the same.
run gloo_tcp_w2 2 4 1 --set comm.shared_memory=false
grep -q "batch: 4 x 1 accum x 2 ranks" "$scratch/gloo_w2.0.out" || fail "rank 0 of gloo_w2 did not report 2 ranks"
[ ! -s "$scratch/gloo_w2.1.out" ] || fail "rank 1 printed: $(head -3 "$scratch/gloo_w2.1.out")"
grep -q "comm: every rank is on this host: collectives through shared memory" \
  "$scratch/gloo_w4.0.out" || fail "gloo_w4 did not say it runs through shared memory"
grep -q "comm: collectives through gloo (\[comm\] shared_memory = false)" \
  "$scratch/gloo_tcp_w2.0.out" || fail "gloo_tcp_w2 did not say it runs through gloo's transport"
for name in gloo_w2 gloo_w4 gloo_zero3_w2 gloo_tcp_w2; do same_training w1 "$name" 1e-6 2e-6; done
check_bytes gloo_w2 all_reduce $((2 * 1 * 4 * (118528 + 3)))
check_bytes gloo_w4 all_reduce $((2 * 3 * 4 * (118528 + 3)))
# bf16 buffers through gloo (summed in fp32, rounded per partial
# sum): zero3 agrees with ddp bit for bit without clipping, and both track
# fp32 as on mpi (test_mixed_precision.sh).
bf16=(--set train.precision=bf16 --set train.grad_clip=0)
"$ZTRAIN" "${common[@]}" --set train.micro_batch_size=8 --set train.grad_clip=0 \
  --set train.out_dir="$scratch/w1_noclip" "$SRC/configs/run.toml" > "$scratch/w1_noclip.out" 2>&1 ||
  { cat "$scratch/w1_noclip.out" >&2; fail "world 1 without clipping failed"; }
losses w1_noclip
run gloo_bf16_w2 2 4 1 "${bf16[@]}"
run gloo_bf16_zero3_w2 2 4 1 "${bf16[@]}" --strategy zero3 --set strategy.param_persistence_threshold=0
same_training gloo_bf16_w2 gloo_bf16_zero3_w2 0 2e-6
same_training w1_noclip gloo_bf16_w2 2e-3 2e-2

# A killed rank: the survivor stops with an error naming the lost peer,
# long before the 300 s collective timeout.
ranks killed 2 --set train.steps=100000 --set train.micro_batch_size=4
training killed
kill -9 "${pids[1]}"
exit_within "${pids[0]}" 60
[ "$status" -ne 0 ] || fail "rank 0 exited 0 after rank 1 was killed"
# Named by the failed collective's error or, where gloo did not notice the
# dead peer, by the guard that ends a collective it holds up.
grep -Eq "(\[rank 0\]|ztrain: rank 0:).*rank 1 closed its connection" "$scratch/killed.0.out" ||
  fail "rank 0's error does not name the lost peer: $(tail -2 "$scratch/killed.0.out")"

# A frozen rank (SIGSTOP) of 3: the survivors stop within the timeout and
# both name it, rank 0 from its heartbeats, rank 1 from rank 0's: in a
# timeout of its own, or in the error of the ring that rank 0 closed when
# its timeout came first.
ranks frozen 3 --set train.steps=100000 --set train.micro_batch_size=4 --set train.grad_accum=1 \
  --set comm.timeout=3s
training frozen
kill -STOP "${pids[2]}"
for r in 0 1; do
  exit_within "${pids[$r]}" 30
  [ "$status" -ne 0 ] || fail "rank $r exited 0 beside a frozen rank"
  grep -q "rank 2 has sent no heartbeat for" "$scratch/frozen.$r.out" ||
    fail "rank $r does not name the frozen rank: $(tail -2 "$scratch/frozen.$r.out")"
done
grep -q "rank [01]: .* did not finish within 3 s" "$scratch"/frozen.[01].out ||
  fail "no survivor timed out: $(cat "$scratch"/frozen.[01].out)"
echo "frozen: $(grep -h "rank 2 has sent" "$scratch"/frozen.[01].out | head -2)"
kill -9 "${pids[2]}"
wait "${pids[2]}" 2> /dev/null || true

# A frozen rank 0 of 2: rank 1 stops within the run's 3 s timeout, which
# it has from rank 0 (it meets with the default 300 s, not knowing the run).
ranks frozen0 2 --set train.steps=100000 --set train.micro_batch_size=4 --set comm.timeout=3s
training frozen0
kill -STOP "${pids[0]}"
exit_within "${pids[1]}" 30
[ "$status" -ne 0 ] || fail "rank 1 exited 0 beside a frozen rank 0"
grep -q "rank 1: .* did not finish within 3 s" "$scratch/frozen0.1.out" ||
  fail "rank 1 did not time out after the run's 3 s: $(tail -2 "$scratch/frozen0.1.out")"
kill -9 "${pids[0]}"
wait "${pids[0]}" 2> /dev/null || true

# Rank 0 arriving late: the others keep trying to reach it.
reserve_port
RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$ZTRAIN" "${common[@]}" \
  --set train.steps=3 --set train.micro_batch_size=4 --set train.out_dir="$scratch/late" \
  "$SRC/configs/run.toml" > "$scratch/late.1.out" 2>&1 &
early=$!
spawned+=("$early")
sleep 2
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$ZTRAIN" "${common[@]}" \
  --set train.steps=3 --set train.micro_batch_size=4 --set train.out_dir="$scratch/late" \
  "$SRC/configs/run.toml" > "$scratch/late.0.out" 2>&1 || { cat "$scratch/late.0.out" >&2; fail "late rank 0 failed"; }
wait "$early" || { cat "$scratch/late.1.out" >&2; fail "rank 1 gave up on a late rank 0"; }

# No MASTER_ADDR.
if RANK=0 WORLD_SIZE=2 MASTER_PORT=29999 "$ZTRAIN" "${common[@]}" "$SRC/configs/run.toml" \
  > "$scratch/nomaster.out" 2>&1; then fail "a launch without MASTER_ADDR succeeded"; fi
grep -q "needs MASTER_ADDR and MASTER_PORT" "$scratch/nomaster.out" ||
  fail "no clear error without MASTER_ADDR: $(cat "$scratch/nomaster.out")"

# Two processes claiming rank 1 of 3.
reserve_port
pids=()
for r in 0 1 1; do
  RANK=$r WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$ZTRAIN" "${common[@]}" \
    --set comm.timeout=20s --set train.out_dir="$scratch/dup" "$SRC/configs/run.toml" \
    > "$scratch/dup.$r.${#pids[@]}.out" 2>&1 &
  pids+=($!)
  spawned+=($!)
done
for p in "${pids[@]}"; do exit_within "$p" 60; done
grep -q "two processes claim RANK=1" "$scratch"/dup.0.*.out ||
  fail "no clear error for a duplicated rank: $(cat "$scratch"/dup.0.*.out)"
echo "PASS"
