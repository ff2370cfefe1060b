#!/usr/bin/env bash
# ztrain estimate --all: a sizing table across every strategy preset.
# - Llama-7B at world 8 on nodes of 8 devices of 80 GiB: a row per preset
#   (ddp and the ZeRO stages first); in fp32, ddp's 16 bytes per parameter
#   (108 GB) do not fit and zero3's 16/8 do; the offload presets put the
#   optimizer state on the host (per node: 8 devices' worth) and
#   zero3_nvme on NVMe.
# - Every row's params, grads and optimizer bytes are those `ztrain
#   estimate --strategy S` prints for the same run, and activation
#   checkpointing lowers the activations of gpt2-tiny.
# - For a GPU (device.kind = cuda) an offloaded optimizer's estimate adds
#   the host copy of its working slice (2 bytes a parameter in bf16) and one
#   bucket's receive buffer that its copy to the host still holds.
# - --device-memory without --all, and --all with --strategy, are refused.
#
# usage: test_estimate_all.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

"$ZTRAIN" estimate --all --model llama-7b --world 8 --gpus-per-node 8 --device-memory 80GiB \
  "$SRC/configs/run.toml" > "$scratch/7b.out" 2>&1 || { cat "$scratch/7b.out" >&2; fail "estimate --all failed"; }
cat "$scratch/7b.out"
rows=$(awk 'NR > 2 && /^[a-z0-9_]+ /' "$scratch/7b.out" | awk '{ print $1 }' | paste -sd' ')
[ "$rows" = "ddp zero1 zero2 zero3 zero2_offload zero3_nvme zero3_offload" ] ||
  fail "rows are '$rows'"
grep -q "^estimate --all: llama, 67[0-9]* parameters, 8 ranks, 8 per node" "$scratch/7b.out" ||
  fail "no header naming the 7B model"
grep -E "^ddp " "$scratch/7b.out" | grep -q "does not fit (" || fail "ddp fits 80 GiB"
grep -E "^zero3 " "$scratch/7b.out" | grep -q " fits (" || fail "zero3 does not fit 80 GiB"
# Every byte column is "VALUE UNIT": params $2, grads $4, optimizer $6,
# buffers $8, act $10, act ckpt $12, device $14, dev ckpt $16, host per
# node $18, NVMe per node $20.
bytes_of() {  # bytes_of VALUE UNIT
  awk -v v="$1" -v u="$2" 'BEGIN { m["B"] = 1; m["KiB"] = 2^10; m["MiB"] = 2^20; m["GiB"] = 2^30;
    m["TiB"] = 2^40; printf "%.0f", v * m[u] }'
}
host_of() { grep -E "^$1 " "${2:-$scratch/7b.out}" | awk '{ print $18, $19 }'; }  # host_of ROW [TABLE]
nvme_of() { grep -E "^$1 " "$scratch/7b.out" | awk '{ print $20, $21 }'; }
[ "$(host_of ddp)" = "0 B" ] || fail "ddp puts '$(host_of ddp)' on the host"
[ "$(host_of zero3_offload)" != "0 B" ] || fail "zero3_offload puts nothing on the host"
[ "$(nvme_of zero3_nvme)" != "0 B" ] || fail "zero3_nvme puts nothing on NVMe"
[ "$(nvme_of zero3_offload)" = "0 B" ] || fail "zero3_offload puts '$(nvme_of zero3_offload)' on NVMe"
# Per node: 8 ranks' host bytes, from the per-rank estimate of the same run.
"$ZTRAIN" estimate --strategy zero3_offload --model llama-7b --world 8 "$SRC/configs/run.toml" \
  > "$scratch/one7b.out" 2>&1 || { cat "$scratch/one7b.out" >&2; fail "estimate --strategy zero3_offload failed"; }
per_rank=$(awk '$1 == "host" && $2 == "total" { print $3 }' "$scratch/one7b.out")
per_node=$(bytes_of $(host_of zero3_offload))
awk -v r="$per_rank" -v n="$per_node" 'BEGIN { d = n / (8 * r); exit !(d > 0.999 && d < 1.001) }' ||
  fail "zero3_offload's host bytes per node ($per_node) are not 8 x its $per_rank per rank"

# The seeds' job: a 10B Llama at its 200k-token context on 3 nodes of 8
# devices of 80 GiB fits no preset as set; the "seq fits" column names the
# smallest split that does, at the run's micro-batch: for the ZeRO-3
# presets and zero2_offload Ulysses at 4 (not 8: 36 heads), for zero1 and
# zero2, which hold every parameter and its optimizer state, the ring at 8
# (Ulysses cannot split 36 heads 8 ways), for ddp none; and `ztrain
# estimate` of those runs agrees. Activations are kept in bf16 (the run's
# precision); kept in fp32, zero2_offload needs the ring at 8 too.
seed=(--world 24 --model llama-7b --set model.n_layer=40 --set model.n_embd=4608
  --set model.intermediate_size=12288 --set model.n_head=36 --set model.n_kv_head=36
  --set model.seq_len=200000 --set train.global_batch_size=24 --set train.precision=bf16)
"$ZTRAIN" estimate --all --gpus-per-node 8 --device-memory 80GiB "${seed[@]}" "$SRC/configs/run.toml" \
  > "$scratch/200k.out" 2>&1 ||
  { cat "$scratch/200k.out" >&2; fail "estimate --all of the 200k-token job failed"; }
cat "$scratch/200k.out"
grep -E "^ddp " "$scratch/200k.out" | grep -q " -  does not fit (" ||
  fail "ddp: fits at some sequence degree, or the table does not say"
for s in zero1 zero2; do
  grep -E "^$s " "$scratch/200k.out" | grep -q " ctx 8 ckpt  does not fit (" ||
    fail "$s: the table does not say it fits at context 8 with checkpointing"
done
"$ZTRAIN" estimate --all --gpus-per-node 8 --device-memory 80GiB "${seed[@]}" \
  --set train.activation_dtype=fp32 "$SRC/configs/run.toml" > "$scratch/200k_fp32.out" 2>&1 ||
  { cat "$scratch/200k_fp32.out" >&2; fail "estimate --all with fp32 activations failed"; }
grep -E "^zero2_offload " "$scratch/200k_fp32.out" | grep -q " ctx 8 ckpt  does not fit (" ||
  fail "zero2_offload with fp32 activations: the table does not say it fits at context 8"
for s in zero3 zero3_offload zero3_nvme zero2_offload; do
  grep -E "^$s " "$scratch/200k.out" | grep -q " 4 ckpt  does not fit (" ||
    fail "$s: the table does not say it fits at sequence 4 with checkpointing"
done
# fits_80g STRATEGY KEY DEGREE: `ztrain estimate` of the job under
# STRATEGY at [parallel] KEY = DEGREE with activation checkpointing needs
# between 60 and 80 GiB a device, as the table's column says.
fits_80g() {
  "$ZTRAIN" estimate --strategy "$1" "${seed[@]}" --set parallel."$2"="$3" \
    --set train.micro_batch_size=1 --set model.activation_checkpointing=true "$SRC/configs/run.toml" \
    > "$scratch/200k_$2$3.out" 2>&1 || { cat "$scratch/200k_$2$3.out" >&2; fail "estimate at $2 $3 failed"; }
  total=$(awk '$1 == "device" && $2 == "total" { print $3 }' "$scratch/200k_$2$3.out")
  awk -v t="$total" 'BEGIN { exit !(t <= 80 * 2^30 && t > 60 * 2^30) }' ||
    fail "$1 at $2 $3 needs $total bytes a device, which the table says fit 80 GiB"
}
fits_80g zero3 sequence 4
fits_80g zero1 context 8

# With the checkpoints offloaded to the host (ALST), each device keeps
# two fp32 residual streams and three 16-bit ones instead of 41 16-bit
# ones: zero3_offload fits at sequence 2,
# and its host memory per node grows by the 40 offloaded block inputs of
# its 8 ranks (40 x 200000 x 4608 x 2 bytes each, in bf16, at the run's
# degree 1; within the table's rounding to 3 digits).
"$ZTRAIN" estimate --all --gpus-per-node 8 --device-memory 80GiB "${seed[@]}" \
  --set model.activation_checkpointing=true --set model.offload_checkpoints=true "$SRC/configs/run.toml" \
  > "$scratch/200k_offload.out" 2>&1 ||
  { cat "$scratch/200k_offload.out" >&2; fail "estimate --all with offloaded checkpoints failed"; }
grep -E "^zero3_offload " "$scratch/200k_offload.out" | grep -q " 2 ckpt  does not fit (" ||
  fail "zero3_offload with offloaded checkpoints: the table does not say it fits at sequence 2"
kept_host=$(bytes_of $(host_of zero3_offload "$scratch/200k.out"))
off_host=$(bytes_of $(host_of zero3_offload "$scratch/200k_offload.out"))
awk -v k="$kept_host" -v o="$off_host" 'BEGIN { d = (o - k) / (8 * 40 * 200000 * 4608 * 2);
    exit !(d > 0.99 && d < 1.01) }' ||
  fail "offloading adds $((off_host - kept_host)) host bytes per node, not 8 ranks' 40 block inputs"

small=(--model gpt2-tiny --world 2)
"$ZTRAIN" estimate --all "${small[@]}" "$SRC/configs/run.toml" > "$scratch/tiny.out" 2>&1 ||
  { cat "$scratch/tiny.out" >&2; fail "estimate --all on gpt2-tiny failed"; }
for s in ddp zero1 zero2 zero3 zero3_offload; do
  "$ZTRAIN" estimate --strategy "$s" "${small[@]}" "$SRC/configs/run.toml" > "$scratch/one.out" 2>&1 ||
    { cat "$scratch/one.out" >&2; fail "estimate --strategy $s failed"; }
  row=$(grep -E "^$s " "$scratch/tiny.out")
  for c in params grads optimizer; do
    want=$(awk -v c="$c" '$1 == "device" && $2 == c { print $4, $5 }' "$scratch/one.out")
    [ -n "$want" ] || want="0 B"
    col=$(case $c in params) echo 2 ;; grads) echo 4 ;; optimizer) echo 6 ;; esac)
    got=$(echo "$row" | awk -v i="$col" '{ print $i, $(i + 1) }')
    [ "$got" = "$want" ] || fail "$s $c: the table says '$got', estimate says '$want'"
  done
  off=$(bytes_of $(echo "$row" | awk '{ print $10, $11 }'))
  on=$(bytes_of $(echo "$row" | awk '{ print $12, $13 }'))
  [ "$on" -lt "$off" ] || fail "$s: activation checkpointing does not lower the activations ($off -> $on)"
done
echo "every row agrees with estimate --strategy; checkpointing lowers activations"

# row TIER CATEGORY FILE: the bytes of an `estimate --strategy` table row (0: none)
row() { awk -v t="$1" -v c="$2" '$1 == t && $2 == c { b = $3 } END { print b + 0 }' "$3"; }
gpu=(--strategy zero2_offload --model gpt2-124m --set train.precision=bf16)
"$ZTRAIN" estimate "${gpu[@]}" "$SRC/configs/run.toml" > "$scratch/cpu.out" 2>&1 ||
  { cat "$scratch/cpu.out" >&2; fail "the cpu estimate failed"; }
"$ZTRAIN" estimate "${gpu[@]}" --set device.kind=cuda "$SRC/configs/run.toml" > "$scratch/gpu.out" 2>&1 ||
  { cat "$scratch/gpu.out" >&2; fail "the GPU estimate failed"; }
psi=$(sed -n 's/.*(gpt2, \([0-9]*\) params).*/\1/p' "$scratch/gpu.out")
[ "$(row host offload "$scratch/cpu.out")" -eq 0 ] || fail "the cpu estimate has a host stage"
[ "$(row host offload "$scratch/gpu.out")" -eq $((2 * psi)) ] ||
  fail "the GPU estimate's host stage is $(row host offload "$scratch/gpu.out"), not 2 x $psi"
[ "$(row device comm "$scratch/gpu.out")" -gt "$(row device comm "$scratch/cpu.out")" ] ||
  fail "the GPU estimate does not count the receive buffer a copy to the host holds"
echo "a GPU's offload estimate: host stage $(row host offload "$scratch/gpu.out") bytes, comm $(row device comm "$scratch/cpu.out") -> $(row device comm "$scratch/gpu.out")"

status=0
"$ZTRAIN" estimate --device-memory 80GiB "$SRC/configs/run.toml" > "$scratch/bad.out" 2>&1 || status=$?
[ "$status" -eq 2 ] && grep -q "go with estimate --all" "$scratch/bad.out" || fail "--device-memory alone accepted"
status=0
"$ZTRAIN" estimate --all --strategy zero3 "$SRC/configs/run.toml" > "$scratch/bad.out" 2>&1 || status=$?
[ "$status" -eq 2 ] && grep -q "drop --strategy" "$scratch/bad.out" || fail "--all with --strategy accepted"
# Each model preset's first line says its parameter count ("1.2M", "6.74B"):
# the model built from it has that many, to the digits given.
for preset in "$SRC"/configs/models/*.toml; do
  name=$(basename "$preset" .toml)
  said=$(head -n 1 "$preset" | grep -Eo '[0-9.]+[MB](-parameter| parameters)' | head -n 1 | grep -Eo '^[0-9.]+[MB]')
  [ -n "$said" ] || fail "$name: its first line gives no parameter count"
  real=$("$ZTRAIN" estimate --model "$name" "$SRC/configs/run.toml" | sed -n 's/.*, \([0-9]*\) params).*/\1/p')
  python3 - "$said" "$real" << 'PY' || fail "$name: said to have $said parameters, has $real"
import sys
said, real = sys.argv[1], int(sys.argv[2])
digits = said[:-1]
scale = 1e6 if said[-1] == "M" else 1e9
step = 10 ** -len(digits.split(".")[1]) if "." in digits else 1
sys.exit(0 if abs(real / scale - float(digits)) <= step / 2 else 1)
PY
  echo "$name: $said parameters, as its preset says ($real)"
done

# --nproc is the world size, as a launch would take it; with --world it must agree.
"$ZTRAIN" estimate --nproc 4 "$SRC/configs/run.toml" > "$scratch/nproc.out" 2>&1 &&
  grep -q "estimate: strategy ddp, 4 ranks" "$scratch/nproc.out" || fail "estimate --nproc 4 was not for 4 ranks"
status=0
"$ZTRAIN" estimate --nproc 4 --world 2 "$SRC/configs/run.toml" > "$scratch/bad.out" 2>&1 || status=$?
[ "$status" -eq 2 ] && grep -q "\-\-nproc 4 and --world 2 disagree" "$scratch/bad.out" ||
  fail "--nproc and --world disagreeing accepted"
echo "misuse refused"

# A model one of whose modules exceeds a preset's max_live_parameters (a
# Llama-3-70B shape: its embedding has 1.05e9 elements, zero3's cap is 1e9)
# is a row saying what to raise, not a failed table.
llama70=(--model llama-7b --set model.n_layer=80 --set model.n_embd=8192 --set model.n_head=64
  --set model.n_kv_head=8 --set model.intermediate_size=28672 --set model.vocab_size=128256
  --set train.global_batch_size=64 --set train.micro_batch_size=1)
"$ZTRAIN" estimate --all "${llama70[@]}" --world 64 --gpus-per-node 8 --device-memory 80GiB \
  "$SRC/configs/run.toml" > "$scratch/llama70.out" 2>&1 || fail "estimate --all failed on a 70B shape: $(tail -2 "$scratch/llama70.out")"
grep -Eq "^zero3 +- .*cannot run as set: \[strategy\] max_live_parameters = 1000000000 is smaller than module 0, which needs 1050673152 .*raise it to at least 1050673152" \
  "$scratch/llama70.out" || fail "the zero3 row does not say what to raise: $(grep ^zero3 "$scratch/llama70.out")"
grep -Eq "^zero2 +[0-9.]+ GiB" "$scratch/llama70.out" || fail "the other rows are missing"
echo "70B shape: $(grep -c "cannot run as set" "$scratch/llama70.out") presets need a larger max_live_parameters"
