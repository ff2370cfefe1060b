#!/usr/bin/env bash
# Accelerate's config files (tests/data/accelerate: what `accelerate
# config` writes), run as `accelerate launch` runs them.
# - One file per distributed_type (NO, MULTI_CPU, MULTI_GPU, DEEPSPEED with
#   deepspeed_config or deepspeed_config_file, FSDP with each sharding
#   strategy, CPU offload and FSDP 2): its num_processes ranks start, with
#   the strategy, precision and batch it asks for (the run's header), and
#   train the losses of the same run given as --strategy and --set.
# - Several machines, as accelerate launch starts them (--dry-run): each
#   machine its num_processes / num_machines ranks, numbered from its
#   machine_rank, meeting at main_process_ip:main_process_port; DEEPSPEED's
#   pdsh launch from machine 0 over deepspeed_hostfile with --num_gpus or
#   the inclusion filter. (test_multihost trains across machines.)
# - MULTI_CPU's ipex_config as `accelerate config` writes it ({ipex:
#   false}) is taken: ztrain's CPU kernels are its own.
# - Refused, naming the key with file:line:col, before any rank starts:
#   fp8, a GPU list, XLA, an Intel XPU, a misspelled key, a machine_rank out of range,
#   ranks that do not divide among the machines, no main_process_ip, pdsh
#   without a hostfile or from another machine than 0.
# GPU types train on the cpu here (--set device.kind=cpu wins over them).
#
# usage: test_accelerate_config.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

steps=4
base=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set train.steps="$steps" --set train.log_every=1
  --set train.eval_every=0 --set train.warmup_steps=2 --set device.threads=1
  --set train.save_final=false --set device.kind=cpu)
acc=$SRC/tests/data/accelerate
# deepspeed_config_file is read from the working directory, as Accelerate reads it.
sed "s|configs/deepspeed/|$SRC/configs/deepspeed/|" "$acc/deepspeed_file.yaml" > "$scratch/deepspeed_file.yaml"

accelerate_run() {  # accelerate_run NAME FILE: the run, ranks from the file
  "$ZTRAIN" --accelerate-config "$2" "${base[@]}" --set train.out_dir="$scratch/$1" \
    "$SRC/configs/run.toml" < /dev/null > "$scratch/$1.out" 2>&1 || { cat "$scratch/$1.out" >&2; fail "$1 failed"; }
  curve "$1" "$steps"
}
reference_run() {  # reference_run NAME NPROC ARGS...: the same run given on the command line
  local name=$1 np=$2
  shift 2
  "$ZTRAIN" --nproc "$np" "${base[@]}" --set train.out_dir="$scratch/$name" "$@" \
    "$SRC/configs/run.toml" < /dev/null > "$scratch/$name.out" 2>&1 || { cat "$scratch/$name.out" >&2; fail "$name failed"; }
  curve "$name" "$steps"
}
header() {  # header NAME STRATEGY PRECISION RANKS
  grep -q "strategy $2 " "$scratch/$1.out" || fail "$1: not strategy $2: $(head -2 "$scratch/$1.out")"
  grep -q "precision: $3 working weights" "$scratch/$1.out" || fail "$1: not $3"
  grep -q "x $4 rank\|\[strategy\] across all $4 ranks" "$scratch/$1.out" ||
    fail "$1: not $4 ranks: $(sed -n 2p "$scratch/$1.out")"
}

# file, strategy, precision, ranks, then the reference's command line.
while read -r file strategy precision ranks ref; do
  name=${file%.yaml}
  path=$acc/$file
  ref=${ref//SRC/$SRC}
  [ "$file" = deepspeed_file.yaml ] && path=$scratch/$file
  accelerate_run "$name" "$path"
  header "$name" "$strategy" "$precision" "$ranks"
  # shellcheck disable=SC2086
  reference_run "ref_$name" "$ranks" $ref
  same_training "ref_$name" "$name" 0 0
  echo "$file: $strategy, $precision, $ranks rank(s), the losses of: $ref"
done << 'TABLE'
no_distribution.yaml ddp bf16 1 --strategy ddp --set train.precision=bf16
multi_cpu.yaml ddp fp32 2 --strategy ddp
multi_gpu.yaml ddp fp16 2 --strategy ddp --set train.precision=fp16
deepspeed_zero2.yaml zero2 bf16 2 --strategy zero2 --set train.precision=bf16 --set train.grad_accum=2
deepspeed_zero3_offload.yaml cpu_offload fp32 2 --strategy zero3_offload
deepspeed_file.yaml zero3 fp32 2 --deepspeed SRC/configs/deepspeed/ds_z3_config.json
fsdp_full_shard.yaml zero3 bf16 2 --strategy zero3 --set train.precision=bf16
fsdp_shard_grad_op.yaml zero2 bf16 2 --strategy zero2 --set train.precision=bf16
fsdp_no_shard.yaml ddp bf16 2 --strategy ddp --set train.precision=bf16
fsdp_hybrid_shard.yaml zero3 bf16 2 --strategy zero3 --set train.precision=bf16
fsdp_offload.yaml cpu_offload fp32 2 --strategy zero3_offload
fsdp2.yaml zero2 fp32 2 --strategy zero2 --set model.activation_checkpointing=true
fsdp2_context_parallel.yaml zero3 fp32 4 --strategy zero3 --set parallel.context=2
TABLE
grep -q "mesh: context 2 x data 2" "$scratch/fsdp2_context_parallel.out" ||
  fail "parallelism_config_cp_size did not split the sequences: $(grep mesh "$scratch/fsdp2_context_parallel.out")"
grep -q "^context = 2  # fsdp2_context_parallel.yaml:.*parallelism_config_cp_size" \
  "$scratch/fsdp2_context_parallel/config.toml" || fail "[parallel] context does not name its Accelerate key"

grep -q "^activation_checkpointing = true  # fsdp2.yaml:" "$scratch/fsdp2/config.toml" ||
  fail "fsdp_activation_checkpointing did not reach [model]: $(grep checkpointing "$scratch/fsdp2/config.toml")"

dry_run() {  # dry_run FILE: the launch's lines in $scratch/dry.out
  "$ZTRAIN" --accelerate-config "$1" --dry-run "${base[@]}" --set train.out_dir="$scratch/dry" \
    --set train.global_batch_size=16 \
    "$SRC/configs/run.toml" > "$scratch/dry.out" 2>&1 || fail "$1: --dry-run failed: $(cat "$scratch/dry.out")"
}
expect_line() {  # expect_line FILE PATTERN
  grep -qE -- "$2" "$scratch/dry.out" || fail "$1: no line like '$2' in: $(cat "$scratch/dry.out")"
}
# Machine 0 and machine 1 of two, 8 ranks each.
dry_run "$acc/two_machines.yaml"
[ "$(wc -l < "$scratch/dry.out")" -eq 8 ] || fail "two_machines.yaml: not 8 ranks here: $(cat "$scratch/dry.out")"
for r in 0 7; do
  expect_line two_machines.yaml "^RANK=$r WORLD_SIZE=16 LOCAL_RANK=$r LOCAL_WORLD_SIZE=8 GROUP_RANK=0 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 .*--accelerate-config"
done
dry_run "$acc/two_machines_rank1.yaml"
for r in 0 7; do
  expect_line two_machines_rank1.yaml "^RANK=$((8 + r)) WORLD_SIZE=16 LOCAL_RANK=$r LOCAL_WORLD_SIZE=8 GROUP_RANK=1 "
done
echo "two machines: ranks 0-7 on machine 0, 8-15 on machine 1, meeting at 10.0.0.1:29500"
# The batch is checked at the job's 16 ranks, not one machine's 8: a global
# batch of 8 divides among one machine's ranks but not the job's.
status=0
"$ZTRAIN" --accelerate-config "$acc/two_machines.yaml" --dry-run "${base[@]}" --set train.out_dir="$scratch/dry" \
  --set train.global_batch_size=8 "$SRC/configs/run.toml" > "$scratch/dry.out" 2>&1 || status=$?
[ "$status" -eq 2 ] && grep -qF "global_batch_size 8 is not divisible by the world size (16)" "$scratch/dry.out" ||
  fail "two_machines.yaml: a batch for one machine's ranks was not refused at the job's 16 (exit $status): $(cat "$scratch/dry.out")"
echo "two machines: a global batch of 8 is refused at the job's 16 ranks"
# DEEPSPEED's pdsh launch from machine 0: the hostfile's hosts, 2 GPUs each
# (--num_gpus), or the inclusion filter's slots.
for f in deepspeed_pdsh deepspeed_pdsh_include; do
  sed "s|tests/data/accelerate/hostfile|$acc/hostfile|" "$acc/$f.yaml" > "$scratch/$f.yaml"
done
dry_run "$scratch/deepspeed_pdsh.yaml"
expect_line deepspeed_pdsh.yaml "--host worker-1:2 -np 2 .*CUDA_VISIBLE_DEVICES=0,1 .* : --host worker-2:2 -np 2 .*CUDA_VISIBLE_DEVICES=0,1 "
expect_line deepspeed_pdsh.yaml "MASTER_PORT=29500"
dry_run "$scratch/deepspeed_pdsh_include.yaml"
expect_line deepspeed_pdsh_include.yaml "--host worker-1:2 -np 2 .*CUDA_VISIBLE_DEVICES=2,3 .* : --host worker-2:2 -np 2 .*CUDA_VISIBLE_DEVICES=0,1 "
echo "pdsh: the hostfile's hosts through mpirun, with the file's slots"

refused() {  # refused FILE WHAT: exit 2, WHAT said, no rank started (FILE: under $acc, or a path)
  local status=0 path=$1
  [ -e "$path" ] || path=$acc/$1
  "$ZTRAIN" --accelerate-config "$path" "${base[@]}" --set train.out_dir="$scratch/bad" \
    "$SRC/configs/run.toml" > "$scratch/bad.out" 2>&1 || status=$?
  [ "$status" -eq 2 ] || fail "$1: exit $status, expected 2: $(cat "$scratch/bad.out")"
  grep -qF -- "$2" "$scratch/bad.out" || fail "$1: '$2' not said: $(cat "$scratch/bad.out")"
  ! grep -q "^\[rank" "$scratch/bad.out" || fail "$1: ranks started before the refusal"
  echo "$1: refused ($2)"
}
variant() {  # variant NAME SED FILE: FILE changed by SED, as $scratch/NAME.yaml
  sed "$2" "$3" > "$scratch/$1.yaml"
}
variant rank_out 's/machine_rank: 0/machine_rank: 2/' "$acc/two_machines.yaml"
refused "$scratch/rank_out.yaml" "rank_out.yaml:3:15: machine_rank is 2; it must be 0 to num_machines - 1 (1)"
variant uneven 's/num_processes: 16/num_processes: 15/' "$acc/two_machines.yaml"
refused "$scratch/uneven.yaml" "uneven.yaml:8:16: num_processes is 15 on 2 machines"
variant no_ip '/main_process_ip/d' "$acc/two_machines.yaml"
refused "$scratch/no_ip.yaml" "no_ip.yaml:1:1: main_process_ip is missing; with num_machines 2"
variant no_hostfile '/deepspeed_hostfile/d' "$acc/deepspeed_pdsh.yaml"
refused "$scratch/no_hostfile.yaml" "deepspeed_config.deepspeed_hostfile is missing"
variant pdsh_rank1 's/machine_rank: 0/machine_rank: 1/' "$scratch/deepspeed_pdsh.yaml"
refused "$scratch/pdsh_rank1.yaml" "machine_rank is 1: with deepspeed_multinode_launcher \"pdsh\" machine 0 starts every machine's ranks"
refused fp8.yaml "fp8.yaml:3:18: mixed_precision is \"fp8\""
refused gpu_ids.yaml "gpu_ids.yaml:3:10: gpu_ids is \"0,2\""
refused xla.yaml "xla.yaml:2:19: distributed_type is \"XLA\""
sed 's/  ipex: false/  ipex: false\n  use_xpu: true/' "$acc/multi_cpu.yaml" > "$scratch/xpu.yaml"
refused "$scratch/xpu.yaml" "xpu.yaml:8:12: ipex_config.use_xpu is true; ztrain runs on CPUs and NVIDIA GPUs"
refused typo.yaml "typo.yaml:10:20: main_process_prot is not an Accelerate config key"
variant cp_mismatch 's/parallelism_config_dp_shard_size: 2/parallelism_config_dp_shard_size: 4/' \
  "$acc/fsdp2_context_parallel.yaml"
refused "$scratch/cp_mismatch.yaml" "dp_replicate 1 x dp_shard 4 x tp 1 x cp 2 x sp 1 = 8 ranks, but num_processes is 4"
variant cp_tensor 's/parallelism_config_tp_size: 1/parallelism_config_tp_size: 2/; s/parallelism_config_dp_shard_size: 2/parallelism_config_dp_shard_size: 1/' \
  "$acc/fsdp2_context_parallel.yaml"
# tp_size lands on [parallel] tensor: tensor 2 x context 2 over the 4 ranks.
accelerate_run cp_tensor "$scratch/cp_tensor.yaml"
reference_run ref_cp_tensor 4 --strategy zero3 --set parallel.context=2 --set parallel.tensor=2
same_training ref_cp_tensor cp_tensor 0 0
grep -q "mesh: tensor 2 x context 2" "$scratch/cp_tensor.out" ||
  fail "parallelism_config_tp_size did not split the blocks: $(grep mesh "$scratch/cp_tensor.out")"
echo "PASS"
