#!/usr/bin/env bash
# A rank killed at each moment of the ranks' start-up (the test hook
# ZTRAIN_TEST_KILL_AT_START, framework/src/comm/start_faults.h) ends every
# other rank within 2 s of its death, non-zero, each naming the lost rank
# and the stage the start had reached:
# - torchrun-style ranks (gloo), 3 of them: rank 1 at every phase (joined
#   the store, opened its heartbeat link, met, published its gloo address,
#   connected), rank 0 at every phase after the meeting (before it, a rank
#   that has not reached rank 0 yet cannot tell a dead rank 0 from a late
#   one, and keeps trying until its timeout, as it should);
# - ranks under mpirun: after MPI_Init and once connected, rank 1 and rank 0.
# The survivors of a gloo job start first and are in touch with rank 0's
# store before the victim starts, so that each has had its first contact.
#
# usage: test_start_faults.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

job=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set train.steps=3 --set train.global_batch_size=12
  --set device.threads=1 --set train.save_final=false)
# What a survivor's message says of the stage, whichever rank's view it is.
stages="heartbeat link|the ranks met|the meeting|gloo address|gloo cannot connect|gloo connected|sent the run"

# accepted PORT: the connections rank 0's store has accepted on PORT (the
# established sockets whose local port it is).
accepted() {
  awk -v p="$(printf '%04X' "$1")" \
    'NR > 1 && $4 == "01" { split($2, a, ":"); if (a[2] == p) n++ } END { print n + 0 }' /proc/net/tcp
}

# rank NAME R PHASE VICTIM: torchrun-style rank R of 3 in the background,
# with the hook set for VICTIM at PHASE; its pid in pid[R].
rank() {
  ZTRAIN_TEST_KILL_AT_START="$3:$4" RANK=$2 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$ZTRAIN" "${job[@]}" --set train.out_dir="$scratch/$1" "$SRC/configs/run.toml" \
    > "$scratch/$1.$2.out" 2>&1 &
  pid[$2]=$!
  spawned+=($!)
}

# survivors_end NAME VICTIM RANKS...: each of RANKS exits non-zero within 2 s
# (the victim has just been reaped), naming the victim and the stage.
survivors_end() {
  local name=$1 victim=$2 r
  shift 2
  for r in "$@"; do
    exit_within "${pid[$r]}" 2
    [ "$status" -ne 0 ] || fail "$name: rank $r exited 0 after rank $victim died"
    grep -q "rank $victim closed its connection" "$scratch/$name.$r.out" ||
      fail "$name: rank $r does not name rank $victim as lost"
    grep -Eq "$stages" "$scratch/$name.$r.out" || fail "$name: rank $r does not say the stage"
  done
  echo "$name: rank $1: $(tail -n 1 "$scratch/$name.$1.out" | cut -c1-240)"
}

# gloo_case PHASE VICTIM
gloo_case() {
  local phase=$1 victim=$2 name="gloo_$1_$2" r others=()
  reserve_port
  pid=()
  for r in 0 1 2; do [ "$r" -eq "$victim" ] || others+=("$r"); done
  if [ "$victim" -eq 0 ]; then
    for r in 0 1 2; do rank "$name" "$r" "$phase" "$victim"; done
  else
    for r in "${others[@]}"; do rank "$name" "$r" "$phase" "$victim"; done
    # Rank 0's own store link and the other survivor's two.
    for _ in $(seq 600); do
      [ "$(accepted "$port")" -ge 3 ] && break
      sleep 0.05
    done
    [ "$(accepted "$port")" -ge 3 ] || fail "$name: the survivors never reached rank 0's store"
    rank "$name" "$victim" "$phase" "$victim"
  fi
  local victim_status=0
  wait "${pid[$victim]}" 2> /dev/null || victim_status=$?
  [ "$victim_status" -eq 137 ] || fail "$name: the hook did not kill rank $victim (exit $victim_status)"
  survivors_end "$name" "$victim" "${others[@]}"
}

for phase in store beats met published connected; do gloo_case "$phase" 1; done
for phase in met published connected; do gloo_case "$phase" 0; done

# mpi_case PHASE VICTIM: mpirun must end, non-zero, within 2 s of the
# victim's death (found by its rank variable, watched until it is gone),
# and its output name the lost rank.
mpi_case() {
  local phase=$1 victim=$2 name="mpi_$1_$2" lead found="" p start
  mpirun=$(command -v mpirun) || fail "mpirun not found (install openmpi-bin)"
  ZTRAIN_TEST_KILL_AT_START="$phase:$victim" "$mpirun" --allow-run-as-root --oversubscribe \
    --bind-to none -x ZTRAIN_TEST_KILL_AT_START -np 3 "$ZTRAIN" "${job[@]}" \
    --set train.out_dir="$scratch/$name" "$SRC/configs/run.toml" > "$scratch/$name.out" 2>&1 &
  lead=$!
  spawned+=("$lead")
  for _ in $(seq 3000); do
    for p in $(pgrep -f "train.out_dir=$scratch/$name " || true); do
      tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$victim" && found=$p
    done
    [ -z "$found" ] && kill -0 "$lead" 2> /dev/null || break
    sleep 0.02
  done
  [ -n "$found" ] || fail "$name: rank $victim was never seen running"
  while kill -0 "$found" 2> /dev/null; do sleep 0.02; done
  exit_within "$lead" 2
  [ "$status" -ne 0 ] || fail "$name: mpirun exited 0 after rank $victim died"
  grep -q "rank $victim" "$scratch/$name.out" || fail "$name: nothing names rank $victim"
  echo "$name: $(grep -m1 "rank $victim" "$scratch/$name.out")"
}

for phase in mpi_init connected; do
  mpi_case "$phase" 1
  mpi_case "$phase" 0
done

# A hook that names no phase is an error, not a run without it.
reserve_port
if ZTRAIN_TEST_KILL_AT_START=meeting RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
  "$ZTRAIN" "${job[@]}" --set comm.backend=gloo --set train.out_dir="$scratch/badhook" \
  "$SRC/configs/run.toml" > "$scratch/badhook.out" 2>&1; then
  fail "a hook naming no phase was ignored"
fi
grep -q "ZTRAIN_TEST_KILL_AT_START=meeting: expected PHASE" "$scratch/badhook.out" ||
  fail "no clear error for a bad hook"
echo "PASS"
