#!/usr/bin/env bash
# Starts N copies of a command as the ranks of a torchrun-style job (RANK,
# WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT on a
# free port of 127.0.0.1, held for the job by ztrain_test_hold_port beside
# the command), waits for all, prints each rank's output and fails when any
# rank fails.
#
# usage: run_ranks.sh N COMMAND [ARGS...]
set -uo pipefail
n=$1
shift
source "$(dirname "$0")/../support/ports.sh"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
hold_port "$(dirname "$1")/ztrain_test_hold_port" "$out/port"
[ -n "$port" ] || { echo "no port to reserve"; exit 1; }
pids=()
for ((r = 0; r < n; r++)); do
  RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$@" > "$out/rank$r.log" 2>&1 &
  pids+=($!)
done
status=0
for ((r = 0; r < n; r++)); do
  wait "${pids[$r]}" || { echo "rank $r failed (exit $?)"; status=1; }
done
for ((r = 0; r < n; r++)); do
  echo "---- rank $r"
  cat "$out/rank$r.log"
done
exit $status
