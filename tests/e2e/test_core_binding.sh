#!/usr/bin/env bash
# Ranks sharing this machine on cores of their own ([device] bind_cores):
# `ztrain --nproc 2` binds every thread of each rank to its share, as the
# header's cores line says, read from the running ranks' /proc; "off"
# leaves them on every CPU; more ranks than CPUs (taskset) are left to the
# scheduler and said so; a bad value is refused naming the key.
#
# usage: test_core_binding.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
command -v mpirun > /dev/null || fail "mpirun not found (install openmpi-bin)"
command -v taskset > /dev/null || fail "taskset not found (install util-linux)"

tiny=(--set model.n_layer=1 --set model.n_embd=32 --set model.seq_len=16
  --set train.micro_batch_size=2 --set train.log_every=1 --set train.save_final=false)
cd "$scratch"
cpus=$(sed -n "s/^Cpus_allowed_list:\s*//p" /proc/self/status)
ncpus=$(nproc)

# rank_cpus OUT: "RANK CPULIST" of each running rank of the job writing
# into OUT, one line each, after checking every thread of the rank has the
# same CPU list.
rank_cpus() {
  local pid rank lists
  for pid in $(pgrep -f -- "train.out_dir=$1( |$)"); do
    rank=$(tr '\0' '\n' < "/proc/$pid/environ" 2> /dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    [ -n "$rank" ] || continue # the launcher or mpirun
    lists=$(cat /proc/"$pid"/task/*/status | sed -n 's/^Cpus_allowed_list:\s*//p' | sort -u)
    [ "$(echo "$lists" | wc -l)" -eq 1 ] || fail "rank $rank's threads are on different CPUs: $lists"
    echo "$rank $lists"
  done | sort -n
}

# live NAME ARGS...: `ztrain --nproc 2` training into NAME in the
# background ($launcher) until it has logged step 2.
live() {
  local name=$1
  shift
  "$ZTRAIN" --nproc 2 "${tiny[@]}" --set train.steps=100000 "$@" --set train.out_dir="$name" \
    "$SRC/configs/run.toml" > "$name.out" 2>&1 &
  spawned+=($!)
  launcher=$!
  until_step "$name.out" 2
}
stop() {
  kill -TERM "$launcher"
  exit_within "$launcher" 60
}

echo "== the default: each rank its own cores, every thread of it there"
live bound
ranks=$(rank_cpus bound)
stop
if [ "$ncpus" -ge 2 ]; then
  grep -q "^cores: host .*: 2 ranks bound to [0-9]* of [0-9]* cores* each (CPUs " bound.out ||
    fail "no binding said: $(grep '^cores' bound.out)"
  said=$(sed -n 's/^cores: .*(CPUs \(.*\))$/\1/p' bound.out)
  [ "$(echo "$ranks" | wc -l)" -eq 2 ] || fail "expected 2 running ranks, found: $ranks"
  r0=$(echo "$ranks" | sed -n 's/^0 //p')
  r1=$(echo "$ranks" | sed -n 's/^1 //p')
  [ "$said" = "$r0 | $r1" ] || fail "the header said CPUs $said, the ranks run on $r0 and $r1"
  [ "$r0" != "$r1" ] || fail "both ranks on CPUs $r0"
  echo "ranks on CPUs $r0 and $r1, as the header says"
else
  grep -q "^cores: .* not bound (1 core)" bound.out || fail "one CPU: $(grep '^cores' bound.out)"
fi

echo "== bind_cores = \"off\": every rank on every CPU this script may use"
live off --set device.bind_cores=off
ranks=$(rank_cpus off)
stop
grep -q '^cores: .* not bound (\[device\] bind_cores = "off")' off.out ||
  fail "off: $(grep '^cores' off.out)"
[ "$ranks" = "$(printf '0 %s\n1 %s' "$cpus" "$cpus")" ] || fail "off: ranks on $ranks, not all of $cpus"

echo "== two ranks on one CPU: left to the scheduler, and said so"
one=$(echo "$cpus" | sed 's/[-,].*//')
taskset -c "$one" "$ZTRAIN" --nproc 2 "${tiny[@]}" --set train.steps=2 --set train.out_dir=one \
  "$SRC/configs/run.toml" > one.out 2>&1 || fail "two ranks on CPU $one: $(tail -5 one.out)"
grep -q "^cores: .*: 2 ranks not bound (1 core)" one.out || fail "one CPU: $(grep '^cores' one.out)"
grep -q "cpu (1 threads)" one.out || fail "one CPU, two ranks: not one thread each: $(head -1 one.out)"

echo "== a value it does not know: refused naming the key"
if "$ZTRAIN" "${tiny[@]}" --set train.steps=1 --set device.bind_cores=yes --set train.out_dir=bad \
  "$SRC/configs/run.toml" > bad.out 2>&1; then
  fail "bind_cores = yes ran"
fi
grep -q "device.bind_cores" bad.out || fail "the refusal does not name device.bind_cores: $(cat bad.out)"
echo "PASS"
