#!/usr/bin/env bash
# Rank 0's meeting port lets in the job's ranks and nobody else:
# - it listens at the address MASTER_ADDR names (127.0.0.1 here), not on
#   every interface, unless ZTRAIN_STORE_LISTEN=all asks for that;
# - bytes from something that is not a ztrain rank are dropped and logged,
#   and the job meets and trains anyway (they used to end the meeting);
# - with ZTRAIN_JOB_TOKEN set, a process without the token cannot take a
#   rank's place: it is refused, saying why, and the job goes on with the
#   real rank;
# - a second job started on the port of a job whose ranks have just met
#   (held there by a test hold point) is refused on both its ranks, saying
#   why, and the first job trains on;
# - a loopback address as MASTER_ADDR for a job that spans hosts
#   (WORLD_SIZE above LOCAL_WORLD_SIZE) is refused, saying what to set.
#
# usage: test_meeting_port.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

job=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set train.steps=3 --set train.log_every=1 --set device.threads=1
  --set train.save_final=false)

# rank NAME R [VAR=VALUE...]: torchrun-style rank R of 2 in the background
# (pid in $last), with the variables given.
rank() {
  local name=$1 r=$2
  shift 2
  env "$@" RANK="$r" WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" "$ZTRAIN" "${job[@]}" \
    --set train.out_dir="$scratch/$name" "$SRC/configs/run.toml" > "$scratch/$name.$r.out" 2>&1 &
  last=$!
  spawned+=($!)
}

# listening_at PORT: the local addresses (hex, as /proc/net/tcp writes
# them) of the sockets listening on PORT.
listening_at() {
  awk -v p="$(printf '%04X' "$1")" \
    'NR > 1 && $4 == "0A" { split($2, a, ":"); if (a[2] == p) print a[1] }' /proc/net/tcp
}
# wait_listening PORT: until something listens on PORT (up to 60 s).
wait_listening() {
  for _ in $(seq 600); do
    [ -n "$(listening_at "$1")" ] && return
    sleep 0.1
  done
  fail "nothing listens on port $1 after 60 s"
}
# finish NAME PID...: every PID exits 0 and NAME trained 3 steps.
finish() {
  local name=$1 p
  shift
  for p in "$@"; do wait "$p" || fail "$name: a rank failed"; done
  curve "$name" 3
}

# Listening where MASTER_ADDR points; and a stranger's bytes, dropped.
reserve_port
rank local 0
zero=$last
wait_listening "$port"
[ "$(listening_at "$port")" = 0100007F ] ||
  fail "rank 0 listens at $(listening_at "$port") (hex), not only at 127.0.0.1"
exec 3<> "/dev/tcp/127.0.0.1/$port"
printf 'GET / HTTP/1.0\r\n\r\n' >&3
exec 3<&-
rank local 1
finish local "$zero" "$last"
grep -q "rank 0: dropped a connection to the meeting port from 127.0.0.1 that is not a ztrain rank" \
  "$scratch/local.0.out" || fail "the stranger's connection was not logged"

reserve_port
rank all 0 ZTRAIN_STORE_LISTEN=all
zero=$last
wait_listening "$port"
[ "$(listening_at "$port")" = 00000000 ] ||
  fail "ZTRAIN_STORE_LISTEN=all listens at $(listening_at "$port") (hex), not every interface"
rank all 1
finish all "$zero" "$last"

# A job token: a process without it is refused, the real rank 1 joins.
reserve_port
rank token 0 ZTRAIN_JOB_TOKEN=s3cret-job
zero=$last
wait_listening "$port"
rank stranger 1
stranger=$last
exit_within "$stranger" 60
[ "$status" -ne 0 ] || fail "a rank without the job's token was let in"
grep -q "rank 0 refused this rank: its ZTRAIN_JOB_TOKEN is not the job's" "$scratch/stranger.1.out" ||
  fail "the refused rank was not told why"
rank token 1 ZTRAIN_JOB_TOKEN=s3cret-job
finish token "$zero" "$last"
grep -q "without this job's ZTRAIN_JOB_TOKEN" "$scratch/token.0.out" ||
  fail "rank 0 did not log the refused process"

# A second job on the port of one whose ranks have just met, held there
# (ZTRAIN_TEST_HOLD=meeting_met: gloo not yet connected): its rank 0
# cannot listen and its rank 1 is refused by the first job's rank 0, each
# saying why, and the first job trains on.
reserve_port
rank first 0 ZTRAIN_TEST_HOLD=meeting_met:4
zero=$last
rank first 1 ZTRAIN_TEST_HOLD=meeting_met:4
one=$last
until_printed "$scratch/first.0.out" "test: holding at meeting_met"
rank second 0
second_zero=$last
rank second 1
second_one=$last
exit_within "$second_zero" 60
[ "$status" -ne 0 ] || fail "a second job's rank 0 started on a port in use"
grep -q "cannot listen at 127.0.0.1, port $port: Address already in use" "$scratch/second.0.out" ||
  fail "the second job's rank 0 did not say its port is in use"
exit_within "$second_one" 60
[ "$status" -ne 0 ] || fail "the second job's rank 1 joined the first job"
grep -q "rank 0 refused this rank: two processes claim RANK=1" "$scratch/second.1.out" ||
  fail "the second job's rank 1 was not told why it was refused"
finish first "$zero" "$one"

# Loopback MASTER_ADDR across hosts.
reserve_port
if RANK=0 WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$ZTRAIN" \
  "${job[@]}" --set train.out_dir="$scratch/hosts" "$SRC/configs/run.toml" > "$scratch/hosts.out" 2>&1; then
  fail "a loopback MASTER_ADDR across hosts was accepted"
fi
grep -q "MASTER_ADDR=127.0.0.1 is a loopback address, which ranks on other hosts cannot reach" \
  "$scratch/hosts.out" ||
  fail "no clear error for a loopback MASTER_ADDR across hosts"
echo "PASS"
