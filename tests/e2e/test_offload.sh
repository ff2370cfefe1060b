#!/usr/bin/env bash
# ZeRO-Offload (the cpu_offload strategy, presets zero2_offload and
# zero3_offload).
# - Equivalence: at world 1 and 2, with and without accumulation, stages
#   1-3, a partial offload (ratio 0.5) and parameters offloaded, every
#   offload run logs ddp-at-world-1's losses and gradient norms within the
#   tolerances of test_zero_equivalence.sh (1e-6, 2e-6); and against the
#   same stage without offload, bit for bit (the same reductions, the same
#   AdamW on the same values, only in another tier), in fp32 and in bf16.
# - Memory: each tier's measured peaks per rank equal `ztrain estimate`
#   within 5 %, and the device tier holds less than zero3's by what went
#   to the host: the parameter shard (p psi/N), the gradient shard (g
#   psi/N) and the optimizer state (o psi/N), each within 1 %, while the
#   host holds them (its optimizer state without masters: the host
#   parameter shard is the master copy in fp32).
# - The budget: under a [device] memory_limit zero3 stops with an
#   out-of-memory error naming the tier and category, zero3_offload trains,
#   and ratio = "auto" picks a partial offload that fits, saying so.
# - Options of another stage, and an out-of-range ratio, are config errors.
#
# usage: test_offload.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

steps=20
base=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set train.steps="$steps" --set train.log_every=1 --set train.eval_every=0
  --set train.warmup_steps=5 --set device.threads=1 --set train.save_final=false)
zero3=(--set strategy.param_persistence_threshold=0 --set strategy.max_live_parameters=70000
  --set strategy.prefetch_bucket_size=20000 --set strategy.reduce_bucket_size=5000)

train_run ddp_w1 1 8 1
for np in 1 2; do
  micro=$((4 / np))
  train_run "zero2_off_w$np" "$np" "$micro" 2 --strategy zero2_offload
  train_run "zero3_off_w$np" "$np" "$micro" 2 --strategy zero3_offload "${zero3[@]}"
  same_training ddp_w1 "zero2_off_w$np" 1e-6 2e-6
  same_training ddp_w1 "zero3_off_w$np" 1e-6 2e-6
done
grep -q "cpu_offload: parameter shards in host memory; optimizer state and gradient shards 100% in host memory" \
  "$scratch/zero3_off_w2.out" || fail "zero3_offload's run header does not say what it offloads"
train_run stage1_off_w2 2 2 2 --strategy cpu_offload --set strategy.stage=1
train_run partial_off_w2 2 2 2 --strategy zero3_offload "${zero3[@]}" --set strategy.offload_optimizer.ratio=0.5
train_run params_only_w2 2 2 2 --strategy zero3_offload "${zero3[@]}" \
  --set strategy.offload_optimizer.device=none
for name in stage1_off_w2 partial_off_w2 params_only_w2; do same_training ddp_w1 "$name" 1e-6 2e-6; done

# Bit for bit against the stage without offload.
train_run zero1_w2 2 2 2 --strategy zero1
train_run zero2_w2 2 2 2 --strategy zero2
train_run zero3_w2 2 2 2 --strategy zero3 "${zero3[@]}"
same_training zero1_w2 stage1_off_w2 0 0
same_training zero2_w2 zero2_off_w2 0 0
for name in zero3_off_w2 partial_off_w2 params_only_w2; do same_training zero3_w2 "$name" 0 0; done
bf16=(--set train.precision=bf16)
train_run bf16_zero3_w2 2 2 2 "${bf16[@]}" --strategy zero3 "${zero3[@]}"
train_run bf16_zero3_off_w2 2 2 2 "${bf16[@]}" --strategy zero3_offload "${zero3[@]}"
train_run bf16_zero2_w2 2 2 2 "${bf16[@]}" --strategy zero2
train_run bf16_zero2_off_w2 2 2 2 "${bf16[@]}" --strategy zero2_offload
same_training bf16_zero3_w2 bf16_zero3_off_w2 0 0
same_training bf16_zero2_w2 bf16_zero2_off_w2 0 0
same_training ddp_w1 bf16_zero3_off_w2 2e-3 2e-2

# Memory, per tier and category, measured against estimated, and against
# zero3's device tier.
# peak TIER CATEGORY NAME: the largest over ranks, from the last train line
peak() {
  grep '"split": "train"' "$scratch/$3/metrics.jsonl" | tail -n 1 |
    sed -n "s/.*\"$1\": {[^}]*\"$2\": \([0-9]*\).*/\1/p"
}
estimated() {
  local b
  b=$(awk -v t="$1" -v c="$2" '$1 == t && $2 == c { print $3 }' "$scratch/$3.estimate")
  echo "${b:-0}"
}
mem=(--set train.steps=3 --set train.micro_batch_size=2 --set train.grad_accum=2)
for s in zero3 zero3_offload zero2_offload; do
  extra=(--strategy "$s")
  [ "$s" = zero2_offload ] || extra+=("${zero3[@]}")
  on_ranks 2 "$ZTRAIN" "${base[@]}" "${mem[@]}" "${extra[@]}" --set train.out_dir="$scratch/mem_$s" \
    "$SRC/configs/run.toml" > "$scratch/mem_$s.out" 2>&1 || { cat "$scratch/mem_$s.out" >&2; fail "mem_$s failed"; }
  "$ZTRAIN" estimate --world 2 "${base[@]}" "${mem[@]}" "${extra[@]}" "$SRC/configs/run.toml" \
    > "$scratch/mem_$s.estimate" || fail "estimate of $s failed"
  for tier in device host; do
    for c in params grads optimizer comm; do
      got=$(peak "$tier" "$c" "mem_$s") want=$(estimated "$tier" "$c" "mem_$s")
      echo "$s $tier $c: measured $got, estimated $want"
      awk -v g="$got" -v w="$want" 'BEGIN { d = g - w; if (d < 0) d = -d; exit !(d <= 0.05 * (g > w ? g : w)) }' ||
        fail "$s: the estimate of $tier $c ($want) is not within 5% of the measured $got"
    done
  done
done
psi=$(sed -n 's/.*(gpt2, \([0-9]*\) params).*/\1/p' "$scratch/mem_zero3.estimate")
shard=$((psi / 2))
# offloaded CATEGORY BYTES: zero3's device bytes minus zero3_offload's, and
# zero3_offload's host bytes, both BYTES within 1 %
offloaded() {
  local c=$1 want=$2 moved host
  moved=$(($(peak device "$c" mem_zero3) - $(peak device "$c" mem_zero3_offload)))
  host=$(peak host "$c" mem_zero3_offload)
  echo "offloaded $c: device tier $moved bytes lower, host tier $host, expected $want"
  for got in "$moved" "$host"; do
    awk -v g="$got" -v w="$want" 'BEGIN { exit !(g >= w && g <= w * 1.01) }' ||
      fail "offloaded $c: $got bytes, expected $want (within 1%)"
  done
}
offloaded params $((4 * shard))
offloaded grads $((4 * shard))
offloaded optimizer $((8 * shard))
[ "$(peak device optimizer mem_zero3_offload)" -eq 0 ] || fail "zero3_offload keeps optimizer state on the device"

# The budget: zero3 does not fit 20 MiB of device memory, zero3_offload does.
budget=(--model gpt2-tiny --set model.n_embd=128 --set model.n_layer=4 --set model.vocab_size=1024
  --set model.seq_len=64 --set train.micro_batch_size=2 --set train.steps=3 --set train.eval_every=0
  --set device.threads=1 --set train.save_final=false --set device.memory_limit=20MiB)
if "$ZTRAIN" "${budget[@]}" --strategy zero3 --set train.out_dir="$scratch/b_zero3" \
  "$SRC/configs/run.toml" > "$scratch/b_zero3.out" 2>&1; then
  fail "zero3 fitted a budget it should not"
fi
grep -q "out of memory on tier 'device'.*20.00 MiB budget" "$scratch/b_zero3.out" ||
  fail "zero3's out-of-memory error does not name the tier and budget: $(tail -2 "$scratch/b_zero3.out")"
"$ZTRAIN" "${budget[@]}" --strategy zero3_offload --set train.out_dir="$scratch/b_off" \
  "$SRC/configs/run.toml" > "$scratch/b_off.out" 2>&1 || { cat "$scratch/b_off.out" >&2; fail "zero3_offload did not fit"; }
# ratio auto under a budget where some of the optimizer may stay: a share
# below 100 %, and the run fits.
"$ZTRAIN" "${budget[@]}" --strategy zero3_offload --set strategy.offload_optimizer.ratio=auto \
  --set strategy.offload_param.device=none --set device.memory_limit=26MiB \
  --set train.out_dir="$scratch/b_auto" "$SRC/configs/run.toml" > "$scratch/b_auto.out" 2>&1 ||
  { cat "$scratch/b_auto.out" >&2; fail "ratio auto did not fit"; }
line=$(grep "^cpu_offload: " "$scratch/b_auto.out") || fail "ratio auto says nothing in the run header"
echo "$line"
[[ "$line" == *"ratio auto: the smallest offload that fits the device tier's 26.00 MiB budget"* ]] ||
  fail "ratio auto does not say why: $line"
share=$(sed -n 's/.*gradient shards \([0-9]*\)% in host.*/\1/p' <<< "$line")
[ -n "$share" ] && [ "$share" -gt 0 ] && [ "$share" -lt 100 ] || fail "ratio auto chose '$share'%, not a partial offload"

# configs/examples/offload.toml, the README's budget: zero3 runs out of the
# 400 MiB it allows, zero3_offload and zero3_nvme train, and ratio auto
# keeps what fits of the optimizer on the device.
ex_args=(--set train.steps=2 --set train.log_every=1 --set device.threads=1 --set train.save_final=false)
disk_dir swap
if "$ZTRAIN" "${ex_args[@]}" --strategy zero3 --set train.out_dir="$scratch/ex_zero3" \
  "$SRC/configs/examples/offload.toml" > "$scratch/ex_zero3.out" 2>&1; then
  fail "zero3 fitted the example's budget"
fi
grep -q "out of memory on tier 'device'.* of a 400.00 MiB budget" "$scratch/ex_zero3.out" ||
  fail "zero3 did not run out of the example's budget: $(tail -2 "$scratch/ex_zero3.out")"
# The hint names strategies that keep less on the device, never zero3 itself.
grep -q "a strategy that shards or offloads more than zero3: zero3_offload, zero3_nvme" \
  "$scratch/ex_zero3.out" || fail "the out-of-memory hint does not name what to try after zero3"
# example NAME ARGS...: trains the example for two steps
example() {
  local name=$1
  shift
  "$ZTRAIN" "${ex_args[@]}" "$@" --set train.out_dir="$scratch/$name" \
    "$SRC/configs/examples/offload.toml" > "$scratch/$name.out" 2>&1 ||
    { rm -rf "$swap"; cat "$scratch/$name.out" >&2; fail "$name did not train the example"; }
}
example ex_offload --strategy zero3_offload
grep -Eq "^  device: [0-9.]+ MiB of a 400.00 MiB budget \(" "$scratch/ex_offload.out" ||
  fail "the summary does not say the budget the run kept within: $(grep "device:" "$scratch/ex_offload.out")"
example ex_nvme --strategy zero3_nvme --set strategy.offload_optimizer.nvme_path="$swap" \
  --set strategy.sub_group_size=2000000
example ex_auto --strategy zero3_offload --set strategy.offload_param.device=none \
  --set strategy.offload_optimizer.ratio=auto
rmdir "$swap"
line=$(grep "^cpu_offload: " "$scratch/ex_auto.out") || fail "ratio auto says nothing in the example"
share=$(sed -n 's/.*gradient shards \([0-9]*\)% in host.*ratio auto.*/\1/p' <<< "$line")
[ -n "$share" ] && [ "$share" -gt 0 ] && [ "$share" -lt 100 ] ||
  fail "ratio auto chose '$share'% for the example, not a partial offload: $line"
echo "example, $line"

# Config errors name the keys.
bad() {
  local want=$1 out
  shift
  if out=$("$ZTRAIN" "${base[@]}" --set train.steps=1 "$@" "$SRC/configs/run.toml" 2>&1); then
    fail "accepted: $*"
  fi
  grep -q "$want" <<< "$out" || fail "unclear error for $*: $out"
}
bad 'offload_param.device = "cpu" needs stage 3' --strategy zero2_offload --set strategy.offload_param.device=cpu
bad 'offload_optimizer.device = "nvme" is the nvme_offload strategy.s: run with --strategy zero3_nvme' \
  --strategy zero3_offload --set strategy.offload_optimizer.device=nvme
bad 'offload_param.device = "nvme" is the nvme_offload strategy.s: run with --strategy zero3_nvme' \
  --strategy zero3_offload --set strategy.offload_param.device=nvme
bad "prefetch_bucket_size applies to stage 3" --strategy zero2_offload \
  --set strategy.prefetch_bucket_size=10
bad "ratio.*expected a number in \[0, 1\], or \"auto\"" --strategy zero2_offload \
  --set strategy.offload_optimizer.ratio=1.5
echo "PASS"
