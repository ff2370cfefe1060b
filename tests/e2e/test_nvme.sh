#!/usr/bin/env bash
# ZeRO-Infinity (the nvme_offload strategy, preset zero3_nvme): optimizer
# state in per-rank swap files, stepped through host buffers, and with
# offload_param.device = "nvme" the parameter shards in swap files too.
# - Equivalence: at world 1 and 2, with accumulation, in fp32 and bf16, with
#   sub-groups small enough to need many (and 1, 2 or 4 buffers), with the
#   parameter shards in host memory or in swap files, it logs zero3's
#   losses and gradient norms bit for bit (the same AdamW on the same
#   values, only streamed from a file) and ddp's within the cross-world
#   tolerances.
# - Memory: every tier's measured peaks per rank (nvme included) equal
#   `ztrain estimate` within 5 %, with parameters in host memory and in
#   swap files (read through 5 buffers, and through 1); the nvme tier holds the master weights, m and v (12 bytes
#   per shard element, page-aligned per sub-group) and, when asked, the
#   working parameters (4 bytes per element, page-rounded); the preset's
#   sub_group_size "auto" is estimated as it runs and named in the header.
# - Weights in and out through the parameter swap files: a run with
#   parameters on NVMe saves zero3's bytes, and starting from saved weights
#   (init_from) it trains as zero3 does from them.
# - Swap files, named by host and pid: a killed run's are removed by the
#   next run in nvme_path, saying so; a running one's are not, even when
#   the next run starts the moment they are made (a hold point); none is
#   left after a run that ends, fails, or is stopped with SIGTERM.
# - Errors that name the path and what to do (a read buffer too small for a
#   gather is refused by the estimate as by the run): a missing nvme_path, one on
#   tmpfs, a disk without room for the swap file (a small loop-mounted
#   file system, where this machine allows mounting one), and a disk that
#   fills (ENOSPC) or fails (EIO) half-way through a step (injected).
#
# usage: test_nvme.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

disk_dir swap

steps=20
base=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set train.steps="$steps" --set train.log_every=1 --set train.eval_every=0
  --set train.warmup_steps=5 --set device.threads=1 --set train.save_final=false)
zero3=(--set strategy.param_persistence_threshold=0 --set strategy.max_live_parameters=70000
  --set strategy.prefetch_bucket_size=20000 --set strategy.reduce_bucket_size=5000)
nvme=(--strategy zero3_nvme --set strategy.offload_optimizer.nvme_path="$swap")
params_nvme=(--set strategy.offload_param.device=nvme --set strategy.offload_param.nvme_path="$swap")

no_swap_files() {
  [ -z "$(ls -A "$swap")" ] || fail "$1 left swap files behind: $(ls "$swap")"
}

train_run ddp_w1 1 8 1
for np in 1 2; do
  micro=$((4 / np))
  train_run "zero3_w$np" "$np" "$micro" 2 --strategy zero3 "${zero3[@]}"
  for buffers in 1 2 4; do
    name="nvme_w${np}_b$buffers"
    train_run "$name" "$np" "$micro" 2 "${nvme[@]}" "${zero3[@]}" --set strategy.sub_group_size=5000 \
      --set strategy.offload_optimizer.buffer_count="$buffers"
    same_training "zero3_w$np" "$name" 0 0
    same_training ddp_w1 "$name" 1e-6 2e-6
    no_swap_files "$name"
  done
  for buffers in 1 4; do
    name="nvme_params_w${np}_b$buffers"
    train_run "$name" "$np" "$micro" 2 "${nvme[@]}" "${params_nvme[@]}" "${zero3[@]}" \
      --set strategy.sub_group_size=5000 --set strategy.offload_optimizer.buffer_count="$buffers" \
      --set strategy.offload_param.buffer_count="$buffers"
    same_training "zero3_w$np" "$name" 0 0
    no_swap_files "$name"
  done
done
grep -q "nvme_offload: parameter shards in host memory; optimizer state in swap files under $swap (sub-groups of 5000 (6144: whole pages) elements through 4 host buffers)" \
  "$scratch/nvme_w2_b4.out" || fail "the run header does not say where the optimizer state is"
grep -q "nvme_offload: parameter shards in swap files under $swap (read through 4 host buffers); optimizer state in swap files" \
  "$scratch/nvme_params_w2_b4.out" || fail "the run header does not say where the parameter shards are"
train_run bf16_zero3 2 2 2 --set train.precision=bf16 --strategy zero3 "${zero3[@]}"
train_run bf16_nvme 2 2 2 --set train.precision=bf16 "${nvme[@]}" "${zero3[@]}" --set strategy.sub_group_size=5000
same_training bf16_zero3 bf16_nvme 0 0
train_run bf16_nvme_params 2 2 2 --set train.precision=bf16 "${nvme[@]}" "${params_nvme[@]}" "${zero3[@]}" \
  --set strategy.sub_group_size=5000
same_training bf16_zero3 bf16_nvme_params 0 0

# Export and import through the parameter swap files.
save=(--set train.save_final=true)
train_run save_zero3 2 2 2 --strategy zero3 "${zero3[@]}" "${save[@]}"
train_run save_nvme 2 2 2 "${nvme[@]}" "${params_nvme[@]}" "${zero3[@]}" --set strategy.sub_group_size=5000 \
  "${save[@]}"
cmp -s "$scratch/save_zero3/model.safetensors" "$scratch/save_nvme/model.safetensors" ||
  fail "the weights saved with parameters on NVMe are not zero3's"
from=(--set model.init_from="$scratch/save_zero3")
train_run from_zero3 2 2 2 --strategy zero3 "${zero3[@]}" "${from[@]}"
train_run from_nvme 2 2 2 "${nvme[@]}" "${params_nvme[@]}" "${zero3[@]}" --set strategy.sub_group_size=5000 \
  "${from[@]}"
same_training from_zero3 from_nvme 0 0
grep -q "weights from $scratch/save_zero3" "$scratch/from_nvme.out" || fail "init_from was not used"
no_swap_files "the export and import runs"

# Memory per tier, measured against estimated.
peak() {
  grep '"split": "train"' "$scratch/$3/metrics.jsonl" | tail -n 1 |
    sed -n "s/.*\"$1\": {[^}]*\"$2\": \([0-9]*\).*/\1/p"
}
measure() {
  local name=$1
  shift
  on_ranks 2 "$ZTRAIN" "${base[@]}" "$@" --set train.out_dir="$scratch/$name" \
    "$SRC/configs/run.toml" > "$scratch/$name.out" 2>&1 || { cat "$scratch/$name.out" >&2; fail "$name failed"; }
  "$ZTRAIN" estimate --world 2 "${base[@]}" "$@" "$SRC/configs/run.toml" > "$scratch/$name.estimate"
  for tier in device host nvme; do
    for c in params grads optimizer comm offload; do
      got=$(peak "$tier" "$c" "$name")
      want=$(awk -v t="$tier" -v c="$c" '$1 == t && $2 == c { print $3 }' "$scratch/$name.estimate")
      want=${want:-0}
      echo "$name: $tier $c: measured $got, estimated $want"
      awk -v g="$got" -v w="$want" 'BEGIN { d = g - w; if (d < 0) d = -d; exit !(d <= 0.05 * (g > w ? g : w)) }' ||
        fail "$name: the estimate of $tier $c ($want) is not within 5% of the measured $got"
    done
  done
  no_swap_files "$name"
}
mem=(--set train.steps=3 --set train.micro_batch_size=2 --set train.grad_accum=2 "${nvme[@]}"
  --set strategy.sub_group_size=7000)
measure mem "${mem[@]}" --set strategy.offload_param.device=cpu
measure mem_params "${mem[@]}" "${params_nvme[@]}" "${zero3[@]}"
measure mem_params_b1 "${mem[@]}" "${params_nvme[@]}" "${zero3[@]}" --set strategy.offload_param.buffer_count=1
# The preset's "auto": at least 2^22 elements a sub-group, so this shard of
# 59264 is one (its three arrays page-aligned), and the header says why.
measure mem_auto "${mem[@]}" --set strategy.sub_group_size=auto
[ "$(peak nvme optimizer mem_auto)" -eq $((3 * ((59264 * 4 + 4095) / 4096 * 4096))) ] ||
  fail "sub_group_size auto did not make the shard one sub-group: $(peak nvme optimizer mem_auto) bytes"
grep -q "sub-groups of [0-9]* elements through 4 host buffers.*(sub_group_size auto, for a .* share of this machine's RAM)" \
  "$scratch/mem_auto.out" || fail "the run header does not say what sub_group_size auto chose"
# gpt2-124m at one rank: a sixteenth of its 124439808-element shard, whole
# pages of elements (the RAM cap is lower only below about 4 GiB).
est=$("$ZTRAIN" estimate --model gpt2-124m "${nvme[@]}" "$SRC/configs/run.toml")
grep -q "sub-groups of 7778304 elements through 4 host buffers" <<< "$est" ||
  fail "sub_group_size auto is not a sixteenth of gpt2-124m's shard: $est"
# The README's headline example: a 4.6B Llama with its parameters and
# optimizer state on disk, 14 bytes per parameter there and the gradient
# shard (bf16) in host memory.
est=$("$ZTRAIN" estimate "$SRC/configs/examples/llama_nvme.toml")
grep -q "(llama, 4626066432 params)" <<< "$est" || fail "llama_nvme.toml is not the 4.6B model: $est"
grep -q "parameter shards in swap files under /var/tmp" <<< "$est" || fail "llama_nvme.toml keeps its parameters off disk: $est"
awk '$1 == "nvme" && $2 == "total" { nv = $3 } $1 == "host" && $2 == "grads" { g = $3 }
  END { exit !(nv >= 14 * 4626066432 && g == 2 * 4626066432) }' <<< "$est" ||
  fail "llama_nvme.toml's tiers are not 14 bytes per parameter on disk and bf16 gradients in memory: $est"
# 59264 shard elements in sub-groups of 7000, rounded to whole pages of
# elements (8192): 7 of 32768 bytes and one of 1920 elements, 7680 bytes
# page-aligned to 8192, three arrays each.
[ "$(peak nvme optimizer mem)" -eq $((3 * (7 * 32768 + 8192))) ] ||
  fail "the nvme tier holds $(peak nvme optimizer mem) bytes, not the masters, m and v"
[ "$(peak nvme params mem)" -eq 0 ] || fail "parameters reached the nvme tier with offload_param cpu"
# The working parameters: 59264 fp32 elements, page-rounded.
[ "$(peak nvme params mem_params)" -eq $(((59264 * 4 + 4095) / 4096 * 4096)) ] ||
  fail "the nvme tier holds $(peak nvme params mem_params) bytes of parameters, not the shard's"
[ "$(peak host params mem_params)" -eq 0 ] || fail "parameter shards stayed in host memory"

# SIGTERM: the job stops and its swap files go.
on_ranks 2 "$ZTRAIN" "${base[@]}" "${nvme[@]}" "${params_nvme[@]}" --set train.steps=100000 --set train.micro_batch_size=2 \
  --set train.out_dir="$scratch/term" "$SRC/configs/run.toml" > "$scratch/term.out" 2>&1 &
job=$!
spawned+=("$job")
until_step "$scratch/term.out" 3
[ -n "$(ls -A "$swap")" ] || fail "no swap file while the job runs"
for pid in $(pgrep -f "train.out_dir=$scratch/term" || true); do kill -TERM "$pid" 2> /dev/null || true; done
exit_within "$job" 30
no_swap_files "a job stopped with SIGTERM"

# SIGKILL: the job cannot remove its swap files; the next run in that
# nvme_path removes them, saying so.
"$ZTRAIN" "${base[@]}" "${nvme[@]}" --set train.steps=100000 --set train.micro_batch_size=2 \
  --set train.out_dir="$scratch/killed" "$SRC/configs/run.toml" > "$scratch/killed.out" 2>&1 &
job=$!
spawned+=("$job")
until_step "$scratch/killed.out" 2
kill -9 "$job"
wait "$job" 2> /dev/null || true
left=$(ls -A "$swap")
[[ "$left" == "ztrain-swap@$(hostname)@$job@rank0.optimizer" ]] ||
  fail "the killed run's swap file is not named by host and pid: $left"
train_run after_kill 1 2 2 "${nvme[@]}" --set strategy.sub_group_size=5000
grep -q "nvme_path '$swap': removed the swap files of runs that ended without removing them (killed, or crashed): $left (.*, pid $job)" \
  "$scratch/after_kill.out" || fail "the next run did not say it removed the killed run's swap file"
no_swap_files "the run after a killed one"

# The hand-off held at its moment: run A holds right after making its swap
# file (ZTRAIN_TEST_HOLD=swap_created); run B starts in the same nvme_path
# then and sweeps it. A runs, so its file stays (B does not name it as
# removed), and A trains on to the losses of the run above, bit for bit.
ZTRAIN_TEST_HOLD=swap_created:8 "$ZTRAIN" "${base[@]}" "${nvme[@]}" --set strategy.sub_group_size=5000 \
  --set train.micro_batch_size=2 --set train.grad_accum=2 --set train.out_dir="$scratch/held" \
  "$SRC/configs/run.toml" > "$scratch/held.out" 2>&1 &
held=$!
spawned+=("$held")
until_printed "$scratch/held.out" "test: holding at swap_created"
held_file="ztrain-swap@$(hostname)@$held@rank0.optimizer"
[ -e "$swap/$held_file" ] || fail "run A holds without its swap file: $(ls -A "$swap")"
"$ZTRAIN" "${base[@]}" "${nvme[@]}" --set train.steps=100000 --set train.micro_batch_size=2 \
  --set train.out_dir="$scratch/beside" "$SRC/configs/run.toml" > "$scratch/beside.out" 2>&1 &
beside=$!
spawned+=("$beside")
until_step "$scratch/beside.out" 1
[ -e "$swap/$held_file" ] || fail "run B removed the swap file of run A, which was running"
! grep -q "$held_file" "$scratch/beside.out" || fail "run B named A's live swap file as removed"
kill -TERM "$beside"
exit_within "$beside" 60
exit_within "$held" 120
[ "$status" -eq 0 ] || fail "run A failed after B swept beside it (exit $status)"
curve held "$steps"
same_training after_kill held 0 0
no_swap_files "runs A and B"

# Errors.
bad() {
  local want=$1 out
  shift
  if out=$("$ZTRAIN" "${base[@]}" --set train.steps=2 --set train.micro_batch_size=2 "$@" \
    --set train.out_dir="$scratch/bad" "$SRC/configs/run.toml" 2>&1); then
    fail "accepted: $*"
  fi
  grep -q "$want" <<< "$out" || fail "unclear error for $*: $out"
  echo "error: $(grep -m1 "$want" <<< "$out")"
}
bad "nvme_path '/no/such/dir' is not a directory; create it" --strategy zero3_nvme \
  --set strategy.offload_optimizer.nvme_path=/no/such/dir
bad "nvme_path '/no/such/params' is not a directory; create it" --strategy zero3_nvme \
  --set strategy.offload_optimizer.nvme_path="$swap" --set strategy.offload_param.device=nvme \
  --set strategy.offload_param.nvme_path=/no/such/params
no_swap_files "a run refused for its parameters' nvme_path"
bad "offload_param.buffer_size = 100 elements is smaller than a rank's part of the parameters gathered with '.*' (.* elements); raise it to at least" \
  --strategy zero3_nvme --set strategy.offload_optimizer.nvme_path="$swap" "${params_nvme[@]}" "${zero3[@]}" \
  --set strategy.offload_param.buffer_size=100
no_swap_files "a run refused for its parameters' buffer_size"
# The estimate refuses it too, with the same words.
if out=$("$ZTRAIN" estimate "${base[@]}" --strategy zero3_nvme "${params_nvme[@]}" "${zero3[@]}" \
  --set strategy.offload_param.buffer_size=100 "$SRC/configs/run.toml" 2>&1); then
  fail "estimate sized a run whose read buffers cannot hold a gather: $out"
fi
grep -q "offload_param.buffer_size = 100 elements is smaller than a rank's part of the parameters gathered with" <<< "$out" ||
  fail "estimate's refusal does not name buffer_size: $out"
if [ "$(stat -f -c %T /dev/shm 2> /dev/null)" = tmpfs ]; then
  bad "is on tmpfs, which is memory" --strategy zero3_nvme --set strategy.offload_optimizer.nvme_path=/dev/shm
else
  echo "skipped: /dev/shm is not tmpfs here"
fi
ZTRAIN_TEST_INJECT_IO_ERROR=ENOSPC:3 bad "the disk under nvme_path is full" "${nvme[@]}" \
  --set strategy.sub_group_size=5000
no_swap_files "a run that failed on a full disk"
ZTRAIN_TEST_INJECT_IO_ERROR=EIO:3 bad "failed: Input/output error; check the drive (dmesg) or choose another nvme_path" \
  "${nvme[@]}" --set strategy.sub_group_size=5000
no_swap_files "a run that failed on a failing disk"
# A disk too small for the swap file, found before training.
tiny="$scratch/tiny"
mkdir -p "$tiny"
if truncate -s 4M "$scratch/tiny.img" && mkfs.ext4 -q "$scratch/tiny.img" 2> /dev/null &&
  mount -o loop "$scratch/tiny.img" "$tiny" 2> /dev/null; then
  # A swap file of a live run (this shell's pid) is named in the error; one
  # of a process that has ended is removed first.
  true &
  dead=$!
  wait "$dead"
  live_file="ztrain-swap@$(hostname)@$$@rank0.optimizer"
  head -c 1048576 /dev/zero > "$tiny/$live_file"
  head -c 1048576 /dev/zero > "$tiny/ztrain-swap@$(hostname)@$dead@rank0.optimizer"
  big=(--model gpt2-tiny --set model.n_embd=256 --set model.n_layer=4)
  out=$("$ZTRAIN" "${big[@]}" --set train.steps=1 --set train.micro_batch_size=1 --set model.seq_len=16 \
    --set train.save_final=false --strategy zero3_nvme --set strategy.offload_optimizer.nvme_path="$tiny" \
    --set train.out_dir="$scratch/small_disk" "$SRC/configs/run.toml" 2>&1) && fail "a 4 MiB disk held the swap file"
  leftovers=$(ls -A "$tiny" | grep -v "lost+found\|$live_file" || true)
  umount "$tiny"
  grep -q "the NVMe tier needs .* but only .* are free under nvme_path '$tiny'; it also holds the swap files of other runs: $live_file (1.00 MiB, pid $$ running)" <<< "$out" ||
    fail "unclear error for a full disk: $out"
  grep -q "removed the swap files of runs that ended without removing them (killed, or crashed): ztrain-swap@$(hostname)@$dead@rank0.optimizer (1.00 MiB, pid $dead)" <<< "$out" ||
    fail "the ended process's swap file was not removed: $out"
  [ -z "$leftovers" ] || fail "a swap file was left on the full disk: $leftovers"
  echo "error: $(grep -m1 "NVMe tier needs" <<< "$out")"
else
  echo "skipped: cannot loop-mount a small file system here (needs root and a loop device)"
fi
echo "PASS"
