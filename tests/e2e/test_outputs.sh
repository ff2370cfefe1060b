#!/usr/bin/env bash
# A run's outputs never vanish silently.
# - A second run into the same out_dir is refused, naming the directory
#   and --overwrite, and leaves the first run's files as they were; with
#   --overwrite it replaces that run and leaves none of its files behind
#   (no stale weights beside new metrics). Under mpirun every rank stops.
# - An export_to that cannot be written, or an existing one, is refused
#   before the first step.
# - `ztrain export` refuses to write onto its own source and onto an
#   existing file without --overwrite.
# - A disk without room for the weights (a small loop-mounted file system,
#   where this machine allows one) is found before training, naming the
#   bytes needed and free; nothing partial is left there. The checkpoints a
#   run holds at once are reserved, none when it writes none. A disk that fills
#   during the final save (injected) fails the run naming the file, and
#   leaves no partial weights file.
#
# usage: test_outputs.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

base=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set train.steps=2 --set train.eval_every=0 --set device.threads=1
  --set train.micro_batch_size=2)
out="$scratch/run"

"$ZTRAIN" "${base[@]}" --set train.out_dir="$out" "$SRC/configs/run.toml" > "$scratch/first.out" 2>&1 ||
  fail "first run failed: $(cat "$scratch/first.out")"
before=$(cd "$out" && md5sum metrics.jsonl model.safetensors config.toml)

# expect_refusal NAME PATTERN COMMAND...: exit 2 naming PATTERN, before any step.
expect_refusal() {
  local name=$1 pattern=$2 status=0
  shift 2
  "$@" > "$scratch/$name.out" 2>&1 || status=$?
  [ "$status" -eq 2 ] || fail "$name: exit $status, not 2: $(cat "$scratch/$name.out")"
  grep -q -- "$pattern" "$scratch/$name.out" || fail "$name: unclear error: $(cat "$scratch/$name.out")"
  ! grep -q "step 1/" "$scratch/$name.out" || fail "$name: trained before refusing"
  echo "$name: $(grep -m1 -- "$pattern" "$scratch/$name.out" | cut -c1-200)"
}

expect_refusal again "out_dir '$out' already holds a run (config.toml, metrics.jsonl, model.safetensors, config.json); choose another out_dir, or pass --overwrite" \
  "$ZTRAIN" "${base[@]}" --set train.out_dir="$out" "$SRC/configs/run.toml"
[ "$(cd "$out" && md5sum metrics.jsonl model.safetensors config.toml)" = "$before" ] ||
  fail "the refused run changed the first run's files"

# Every rank stops, promptly.
status=0
on_ranks 2 "$ZTRAIN" "${base[@]}" --set train.out_dir="$out" "$SRC/configs/run.toml" > "$scratch/mpi.out" 2>&1 ||
  status=$?
[ "$status" -ne 0 ] || fail "mpi: a second run into the same out_dir exited 0"
grep -q "\[rank 0\] ztrain: config error: \[train\] out_dir '$out' already holds a run" "$scratch/mpi.out" ||
  fail "mpi: rank 0 did not say why: $(cat "$scratch/mpi.out")"
grep -q "\[rank 1\] ztrain: config error: rank 0 refused the run's outputs" "$scratch/mpi.out" ||
  fail "mpi: rank 1 did not stop with rank 0: $(cat "$scratch/mpi.out")"

# --overwrite replaces the run, and clears what the new one does not write.
"$ZTRAIN" "${base[@]}" --set train.out_dir="$out" --set train.save_final=false --overwrite \
  "$SRC/configs/run.toml" > "$scratch/overwrite.out" 2>&1 || fail "--overwrite failed: $(cat "$scratch/overwrite.out")"
[ ! -e "$out/model.safetensors" ] || fail "--overwrite left the earlier run's weights beside the new metrics"
[ "$(grep -c '"split": "train"' "$out/metrics.jsonl")" -eq 2 ] || fail "--overwrite: metrics are not the new run's"

# An out_dir that names an existing file is refused, and the file kept.
printf 'precious\n' > "$scratch/afile"
expect_refusal out_dir_file "\[train\] out_dir '$scratch/afile' cannot be made a directory" \
  "$ZTRAIN" "${base[@]}" --set train.out_dir="$scratch/afile" "$SRC/configs/run.toml"
[ "$(cat "$scratch/afile")" = precious ] || fail "a refused run removed the file its out_dir named"

# export_to checked at the start.
expect_refusal unwritable_export "\[train\] export_to ./proc/ztrain-export. cannot be" \
  "$ZTRAIN" "${base[@]}" --set train.out_dir="$scratch/e1" --set train.export_to=/proc/ztrain-export \
  "$SRC/configs/run.toml"
mkdir -p "$scratch/exports" && cp "$out/config.toml" "$scratch/exports/model.safetensors"
expect_refusal existing_export "export_to: '$scratch/exports/model.safetensors' exists; choose another export_to, or pass --overwrite" \
  "$ZTRAIN" "${base[@]}" --set train.out_dir="$scratch/e2" --set train.export_to="$scratch/exports" \
  "$SRC/configs/run.toml"

# ztrain export: never onto its source, never over a file unasked.
"$ZTRAIN" "${base[@]}" --set train.out_dir="$scratch/src" "$SRC/configs/run.toml" > /dev/null 2>&1 ||
  fail "the export source run failed"
sum=$(md5sum < "$scratch/src/model.safetensors")
expect_refusal export_onto_source "is the source itself; writing there would replace the weights being read" \
  "$ZTRAIN" export "$scratch/src" "$scratch/src" --dtype bf16
expect_refusal export_onto_source_overwrite "is the source itself" \
  "$ZTRAIN" export "$scratch/src/model.safetensors" "$scratch/src/model.safetensors" --dtype bf16 --overwrite
[ "$(md5sum < "$scratch/src/model.safetensors")" = "$sum" ] || fail "export replaced its own source"
"$ZTRAIN" export "$scratch/src" "$scratch/bf16.safetensors" --dtype bf16 > /dev/null || fail "export failed"
expect_refusal export_existing "'$scratch/bf16.safetensors' exists; choose another OUT, or pass --overwrite" \
  "$ZTRAIN" export "$scratch/src" "$scratch/bf16.safetensors" --dtype fp16
"$ZTRAIN" export "$scratch/src" "$scratch/bf16.safetensors" --dtype fp16 --overwrite > /dev/null ||
  fail "export --overwrite failed"

# A disk that fills during the final save (injected): the run fails naming
# the file and the full disk, and leaves no partial weights file.
status=0
ZTRAIN_TEST_INJECT_WRITE_ERROR=ENOSPC "$ZTRAIN" "${base[@]}" --set model.n_embd=256 \
  --set train.out_dir="$scratch/fill" "$SRC/configs/run.toml" > "$scratch/fill.out" 2>&1 || status=$?
[ "$status" -ne 0 ] || fail "fill: a failed save exited 0"
grep -q "cannot write '$scratch/fill/model.safetensors.tmp': No space left on device; the disk is full" \
  "$scratch/fill.out" || fail "fill: unclear error: $(tail -2 "$scratch/fill.out")"
[ -z "$(ls "$scratch/fill" | grep safetensors || true)" ] || fail "fill: a partial weights file was left: $(ls "$scratch/fill")"
echo "fill: $(grep -m1 -o "cannot write.*" "$scratch/fill.out" | cut -c1-160)"

# A disk too small for the weights, found before training.
tiny="$scratch/tiny"
mkdir -p "$tiny"
if truncate -s 4M "$scratch/tiny.img" && mkfs.ext4 -q "$scratch/tiny.img" 2> /dev/null &&
  mount -o loop "$scratch/tiny.img" "$tiny" 2> /dev/null; then
  status=0
  "$ZTRAIN" --model gpt2-tiny --set model.n_embd=256 --set model.n_layer=4 --set train.steps=1 \
    --set train.micro_batch_size=1 --set model.seq_len=16 --set train.out_dir="$tiny/run" \
    "$SRC/configs/run.toml" > "$scratch/full.out" 2>&1 || status=$?
  leftovers=$(ls -A "$tiny" | grep -v lost+found || true)
  # A run whose weights fit and which writes no checkpoint reserves none (it
  # used to reserve keep_last + 1); with checkpoint_every it reserves the
  # ones it will hold at once, which do not fit here.
  small=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
    --set model.vocab_size=256 --set train.steps=2 --set device.threads=1)
  "$ZTRAIN" "${small[@]}" --set train.out_dir="$tiny/small" "$SRC/configs/run.toml" \
    > "$scratch/small.out" 2>&1 || fail "a run without checkpoints was refused on a small disk: $(tail -2 "$scratch/small.out")"
  small_status=0
  "$ZTRAIN" "${small[@]}" --set train.checkpoint_every=1 --set train.out_dir="$tiny/small_ckpt" \
    "$SRC/configs/run.toml" > "$scratch/small_ckpt.out" 2>&1 || small_status=$?
  umount "$tiny"
  [ "$small_status" -eq 2 ] && grep -q "the run will write .* under '$tiny/small_ckpt'" "$scratch/small_ckpt.out" ||
    fail "checkpoints that do not fit were not refused: $(tail -2 "$scratch/small_ckpt.out")"
  [ "$status" -eq 2 ] || fail "full disk: exit $status, not 2: $(cat "$scratch/full.out")"
  grep -q "the run will write .* under '$tiny/run' (weights, checkpoints, metrics and configuration), but only .* are free there" \
    "$scratch/full.out" || fail "full disk: unclear error: $(cat "$scratch/full.out")"
  [ -z "$leftovers" ] || fail "full disk: files were left: $leftovers"
  echo "full disk: $(grep -m1 -o "the run will write.*" "$scratch/full.out" | cut -c1-200)"
else
  echo "skipped: cannot loop-mount a small file system here (needs root and a loop device)"
fi
echo "PASS"
