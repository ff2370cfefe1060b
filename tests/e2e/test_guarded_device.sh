#!/usr/bin/env bash
# What runs on a GPU runs on the guarded cpu device ([device] guard = true:
# the device tier page-protected except inside kernels, the device's
# copies and the strategy's collectives), so host code that would touch a
# GPU's memory faults here, in CI, without a GPU:
# - ddp, zero1, zero2 and zero3 on gpt2-tiny (fp32 and bf16, with gradient
#   accumulation), zero3 on llama-tiny, and the offload strategies
#   (zero2_offload, zero3_offload in bf16, cpu_offload with half the
#   optimizer on the host, zero3_nvme with parameters on NVMe too: their
#   host-tier AdamW runs on the cpu kernels and writes the working copy
#   through a host buffer) log exactly the losses and norms of the same
#   runs unguarded (the staged paths give the same bits);
# - a checkpoint written under the guard resumes under it (another
#   strategy), weights export, and init_from imports, all guarded;
# - more than one rank is refused, saying why.
#
# usage: test_guarded_device.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

steps=4
base=(--set model.n_layer=2 --set model.seq_len=32 --set model.vocab_size=256
  --set train.steps="$steps" --set train.log_every=1 --set train.eval_every=2
  --set train.warmup_steps=1 --set device.threads=1)
gpt=(--model gpt2-tiny --set model.n_embd=64)
guard=(--set device.guard=true)

for precision in fp32 bf16; do
  for s in ddp zero1 zero2 zero3; do
    train_run "$s-$precision" 1 2 2 "${gpt[@]}" --strategy "$s" --set train.precision=$precision
    train_run "$s-$precision-guarded" 1 2 2 "${gpt[@]}" "${guard[@]}" --strategy "$s" \
      --set train.precision=$precision
    grep -q "device tier guarded" "$scratch/$s-$precision-guarded.out" ||
      fail "$s-$precision-guarded: the header does not name the guarded device"
    same_training "$s-$precision" "$s-$precision-guarded" 0 0
  done
done
disk_dir swap
for case in "zero2_offload" "zero3_offload --set train.precision=bf16" \
  "cpu_offload --set strategy.offload_optimizer.ratio=0.5" \
  "zero3_nvme --set strategy.offload_optimizer.nvme_path=$swap --set strategy.offload_param.device=nvme --set strategy.offload_param.nvme_path=$swap"; do
  read -r -a args <<< "$case"
  name=${args[0]}
  train_run "$name" 1 2 2 "${gpt[@]}" --strategy "${args[@]}"
  train_run "$name-guarded" 1 2 2 "${gpt[@]}" "${guard[@]}" --strategy "${args[@]}"
  same_training "$name" "$name-guarded" 0 0
done
train_run llama 1 2 1 --model llama-tiny --strategy zero3
train_run llama-guarded 1 2 1 --model llama-tiny --strategy zero3 "${guard[@]}"
same_training llama llama-guarded 0 0

# A checkpoint written guarded (zero3, bf16) resumes guarded under zero1.
train_run ck 1 2 2 "${gpt[@]}" "${guard[@]}" --strategy zero3 --set train.precision=bf16 \
  --set train.checkpoint_every=2
"$ZTRAIN" "${base[@]}" "${gpt[@]}" "${guard[@]}" --strategy zero1 --set train.precision=bf16 \
  --set train.micro_batch_size=2 --set train.grad_accum=2 --set train.out_dir="$scratch/ck" \
  --resume "$scratch/ck/step_2" "$SRC/configs/run.toml" > "$scratch/resumed.out" 2>&1 ||
  { cat "$scratch/resumed.out" >&2; fail "guarded resume failed"; }
grep -q "resuming $scratch/ck/step_2 at step 2" "$scratch/resumed.out" || fail "no resume line"
echo "checkpoint written and resumed under the guard"

# init_from the exported weights of a guarded run, guarded: step 1's loss is
# that of an unguarded import of the same file.
train_run import 1 2 1 "${gpt[@]}" --strategy zero2 \
  --set model.init_from="$scratch/zero3-fp32-guarded/model.safetensors"
train_run import-guarded 1 2 1 "${gpt[@]}" "${guard[@]}" --strategy zero2 \
  --set model.init_from="$scratch/zero3-fp32-guarded/model.safetensors"
same_training import import-guarded 0 0

status=0
on_ranks 2 "$ZTRAIN" "${base[@]}" "${gpt[@]}" "${guard[@]}" --set train.out_dir="$scratch/two" \
  "$SRC/configs/run.toml" > "$scratch/two.out" 2>&1 || status=$?
[ "$status" -ne 0 ] || fail "two guarded ranks: accepted"
grep -q "guard = true runs one rank" "$scratch/two.out" || fail "two ranks: $(cat "$scratch/two.out")"
echo "two ranks: refused"
