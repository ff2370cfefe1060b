#!/usr/bin/env bash
# Several hosts on one machine: network namespaces joined by a bridge, each
# with its own address in a private test range, stand for machines. ztrain
# runs across them and logs the losses of one host:
# - torchrun-style (gloo): rank r started inside host r with MASTER_ADDR
#   naming host 0's address; and ranks 0 and 1 on host 0, rank 1 reaching
#   rank 0 over loopback, with rank 2 on host 1 (rank 1 must then tell
#   gloo an address host 1 can reach);
# - `ztrain --hostfile` naming the hosts' addresses, launched from the root
#   namespace through mpirun, whose rsh agent enters each host's namespace
#   (what ssh would do between machines); the agent's log shows every host
#   was entered; with --include's slot ids, each rank gets its slot;
# - an Accelerate file of two machines: ztrain on each host with its own
#   machine_rank starts that machine's two ranks, meeting at host 0.
# Everything made here is removed at exit. Where namespaces cannot be made
# (no root, no iproute2), the test says so and is skipped.
#
# usage: test_multihost.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

tag=$$
# 198.18.0.0/15 is set aside for benchmarking networks, so nothing real
# routes there; and it sorts above 127.0.0.1, which makes gloo's pairs with
# a rank bound to loopback wait for the remote rank to connect to it (the
# direction in which a loopback address fails).
net=198.18.$((tag % 250))
bridge=ztb$tag
hosts=(zt${tag}a zt${tag}b zt${tag}c)
cleanup() {
  for h in "${hosts[@]}"; do ip netns del "$h" 2> /dev/null || true; done
  ip link del "$bridge" 2> /dev/null || true
}
trap 'cleanup; for p in "${spawned[@]}"; do kill -9 "$p" 2> /dev/null || true; done; rm -rf "$scratch"' EXIT

make_hosts() {
  command -v ip > /dev/null && [ "$(id -u)" -eq 0 ] || return 1
  ip link add "$bridge" type bridge 2> /dev/null || return 1
  ip addr add "$net.1/24" dev "$bridge" && ip link set "$bridge" up || return 1
  local i=0 h
  for h in "${hosts[@]}"; do
    ip netns add "$h" || return 1
    ip link add "v$h" type veth peer name "e$h" || return 1
    ip link set "e$h" netns "$h" && ip link set "v$h" master "$bridge" && ip link set "v$h" up || return 1
    ip -n "$h" addr add "$net.$((11 + i))/24" dev "e$h" || return 1
    ip -n "$h" link set "e$h" up && ip -n "$h" link set lo up || return 1
    i=$((i + 1))
  done
}
if ! make_hosts; then
  echo "skipped: cannot make network namespaces here (needs root and iproute2's ip netns)"
  exit 0
fi
addr() { echo "$net.$((11 + $1))"; }

steps=6
base=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set train.steps=$steps --set train.log_every=1 --set train.eval_every=0
  --set device.threads=1 --set train.save_final=false --set train.global_batch_size=6
  --set comm.timeout=60s)

"$ZTRAIN" "${base[@]}" --set train.out_dir="$scratch/one" "$SRC/configs/run.toml" > "$scratch/one.out" 2>&1 ||
  fail "one host failed: $(cat "$scratch/one.out")"
curve one "$steps"

# env_job NAME HOST0 ADDR0 HOST1 ADDR1 HOST2 ADDR2: rank r started inside
# HOSTr with MASTER_ADDR=ADDRr; it must train as one host does.
env_job() {
  local name=$1 r
  shift
  local where=("$@")
  pids=()
  for r in 0 1 2; do
    ip netns exec "${where[$((2 * r))]}" env RANK=$r WORLD_SIZE=3 MASTER_ADDR="${where[$((2 * r + 1))]}" \
      MASTER_PORT=29500 "$ZTRAIN" "${base[@]}" --set train.out_dir="$scratch/$name" \
      "$SRC/configs/run.toml" > "$scratch/$name.$r.out" 2>&1 &
    pids+=($!)
    spawned+=($!)
  done
  for r in 0 1 2; do
    wait "${pids[$r]}" || fail "$name: rank $r failed: $(cat "$scratch/$name.$r.out")"
  done
  grep -q "x 3 ranks" "$scratch/$name.0.out" || fail "$name: not 3 ranks"
  curve "$name" "$steps"
  same_training one "$name" 1e-6 2e-6
}
env_job gloo "${hosts[0]}" "$(addr 0)" "${hosts[1]}" "$(addr 0)" "${hosts[2]}" "$(addr 0)"
env_job gloo_loopback "${hosts[0]}" "$(addr 0)" "${hosts[0]}" 127.0.0.1 "${hosts[1]}" "$(addr 0)"

# mpirun from the root namespace through an rsh agent that enters the host.
agent="$scratch/netns-rsh"
cat > "$agent" << AGENT
#!/bin/sh
# mpirun's rsh agent: "HOST COMMAND..." runs COMMAND inside HOST's namespace.
host=\$1; shift
case "\$host" in
  $(addr 0)) ns=${hosts[0]} ;;
  $(addr 1)) ns=${hosts[1]} ;;
  $(addr 2)) ns=${hosts[2]} ;;
  *) echo "netns-rsh: unknown host \$host" >&2; exit 1 ;;
esac
echo "\$ns" >> "$scratch/agent.log"
echo "\$*" >> "$scratch/agent.cmd"
# Each host its own /tmp, as real hosts have: the hosts here share one
# hostname and one /tmp, where the orteds raced to create the same Open MPI
# session directory (mkdir: File exists) now and then.
mkdir -p "$scratch/tmp.\$ns"
exec ip netns exec "\$ns" env TMPDIR="$scratch/tmp.\$ns" /bin/sh -c "\$*"
AGENT
chmod +x "$agent"
# across_hosts CMD...: CMD with mpirun's settings for the namespace hosts.
# - No orte_tmpdir_base (lib.sh's): mpirun passes it on to every orted's
#   command line, which would put the hosts back in one session tree, the
#   race their own TMPDIRs avoid (it failed CI once so); mpirun keeps its
#   session under a TMPDIR of the script's own instead.
# - rtc_hwloc_vmhole=none: Open MPI 4.1's orted otherwise maps a shared copy
#   of the hwloc topology at an address it guesses from its own memory map;
#   inside `ip netns exec` that write now and then crashed orted (SIGSEGV in
#   hwloc_shmem_topology_write; twice in about twenty runs, once in CI).
#   Ranks then read the topology themselves, which is all the shared copy
#   saves.
across_hosts() {
  mkdir -p "$scratch/tmp.mpirun"
  env -u OMPI_MCA_orte_tmpdir_base TMPDIR="$scratch/tmp.mpirun" OMPI_MCA_rtc_hwloc_vmhole=none \
    OMPI_MCA_plm_rsh_agent="$agent" OMPI_MCA_oob_tcp_if_include="$net.0/24" \
    OMPI_MCA_btl_tcp_if_include="$net.0/24" OMPI_MCA_btl=self,tcp "$@"
}
printf '%s slots=1\n' "$(addr 0)" "$(addr 1)" "$(addr 2)" > "$scratch/hostfile"
across_hosts timeout 120 "$ZTRAIN" --hostfile "$scratch/hostfile" "${base[@]}" --set train.out_dir="$scratch/mpi" \
  "$SRC/configs/run.toml" > "$scratch/mpi.out" 2>&1 || fail "mpi across hosts failed: $(cat "$scratch/mpi.out")"
grep -q "x 3 ranks" "$scratch/mpi.out" || fail "mpi: not 3 ranks: $(head -3 "$scratch/mpi.out")"
for h in "${hosts[@]}"; do
  grep -qx "$h" "$scratch/agent.log" || fail "mpi: host $h was never entered: $(cat "$scratch/agent.log")"
done
if grep -q orte_tmpdir_base "$scratch/agent.cmd"; then
  fail "mpi: the orteds were given one session base: $(grep -o 'orte_tmpdir_base [^ ]*' "$scratch/agent.cmd" | head -1)"
fi
curve mpi "$steps"
same_training one mpi 1e-6 2e-6

# DeepSpeed's --include with slot ids across the hosts: slot 1 of host 0 and
# slot 0 of host 1, two ranks, each given the GPU of its slot.
printf '%s slots=2\n' "$(addr 0)" "$(addr 1)" > "$scratch/gpu_hostfile"
: > "$scratch/agent.log"
across_hosts timeout 120 "$ZTRAIN" --hostfile "$scratch/gpu_hostfile" --include "$(addr 0):1@$(addr 1):0" \
  "${base[@]}" --set train.global_batch_size=4 --set train.out_dir="$scratch/slots" \
  "$SRC/configs/run.toml" > "$scratch/slots.out" 2>&1 ||
  fail "--include across hosts failed: $(cat "$scratch/slots.out")"
for h in "${hosts[0]}" "${hosts[1]}"; do
  grep -qx "$h" "$scratch/agent.log" || fail "--include: host $h was never entered"
done
grep -q "^placement: ranks 0-1 on host .*: cpu (GPU slots 1, 0 given, unused)$" "$scratch/slots.out" ||
  fail "--include $(addr 0):1@$(addr 1):0 did not give rank 0 slot 1 and rank 1 slot 0: $(grep -E 'placement|batch' "$scratch/slots.out")"
echo "--include across hosts: $(grep '^placement' "$scratch/slots.out")"
# Two machines of an Accelerate file (MULTI_CPU, 4 processes), ztrain run
# on each with its machine_rank, as accelerate launch is.
"$ZTRAIN" "${base[@]}" --set train.global_batch_size=4 --set train.out_dir="$scratch/one4" \
  "$SRC/configs/run.toml" > "$scratch/one4.out" 2>&1 || fail "one host, batch 4: $(cat "$scratch/one4.out")"
curve one4 "$steps"
pids=()
for m in 0 1; do
  printf '%s\n' "compute_environment: LOCAL_MACHINE" "distributed_type: MULTI_CPU" \
    "machine_rank: $m" "main_process_ip: $(addr 0)" "main_process_port: 29511" \
    "mixed_precision: 'no'" "num_machines: 2" "num_processes: 4" "rdzv_backend: static" \
    "same_network: true" "use_cpu: true" > "$scratch/machine$m.yaml"
  ip netns exec "${hosts[$m]}" "$ZTRAIN" --accelerate-config "$scratch/machine$m.yaml" "${base[@]}" \
    --set train.global_batch_size=4 --set train.out_dir="$scratch/acc" "$SRC/configs/run.toml" \
    > "$scratch/acc.$m.out" 2>&1 &
  pids+=($!)
  spawned+=($!)
done
for m in 0 1; do
  wait "${pids[$m]}" || fail "accelerate machine $m failed: $(cat "$scratch/acc.$m.out")"
done
grep -q "x 4 ranks .* collectives on gloo" "$scratch/acc.0.out" ||
  fail "accelerate: not 4 ranks over gloo: $(head -3 "$scratch/acc.0.out")"
curve acc "$steps"
same_training one4 acc 1e-6 2e-6
echo "accelerate, two machines: $(grep '^placement' "$scratch/acc.0.out")"

echo "hosts: ${hosts[*]} on $net.0/24"
echo "PASS"
