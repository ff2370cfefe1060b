#!/usr/bin/env bash
# Wrong files and launches are errors that say what is wrong, never a
# default run that exits 0.
# - A directory given as the run file, and an empty run file.
# - --plugin-path naming a directory that is not there.
# - --nproc asking for more ranks than the hostfile's slots.
# - A token file whose llm.c magic is corrupt is not read as headerless
#   tokens (format auto).
# - A torchrun-style rank 0 whose peers never start says, every few
#   seconds, which ranks are missing, and names them when it gives up.
# - A plugin whose factory crashes (a null write) is named by the host as
#   the process dies, and one whose factory throws is a plugin error.
# - [device] kind = "cuda" where no GPU is usable (CI) stops at its
#   configuration line saying why; "auto" trains on the cpu there.
#
# usage: test_wrong_inputs.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

small=(--model gpt2-tiny --set model.n_layer=1 --set model.n_embd=32 --set model.seq_len=16
  --set model.vocab_size=256 --set train.steps=1 --set device.threads=1)

# refused NAME PATTERN ARGS...: ztrain ARGS exits non-zero printing PATTERN.
refused() {
  local name=$1 pattern=$2 status=0
  shift 2
  "$ZTRAIN" "$@" > "$scratch/$name.out" 2>&1 || status=$?
  [ "$status" -ne 0 ] || fail "$name: accepted (exit 0): $(tail -3 "$scratch/$name.out")"
  grep -q -- "$pattern" "$scratch/$name.out" || fail "$name: unclear error: $(cat "$scratch/$name.out")"
  echo "$name: $(grep -m1 -- "$pattern" "$scratch/$name.out" | cut -c1-180)"
}

if "$ZTRAIN" "${small[@]}" --set device.kind=auto --set train.out_dir="$scratch/auto" \
  "$SRC/configs/run.toml" > "$scratch/auto.out" 2>&1 && grep -q "| cpu (" "$scratch/auto.out"; then
  refused cuda_without_gpu '\-\-set device.kind=cuda: \[device\] kind "cuda": ' \
    "${small[@]}" --set device.kind=cuda --set train.out_dir="$scratch/cuda" "$SRC/configs/run.toml"
  echo "auto: trained on the cpu"
else
  echo "auto chose a GPU here: the no-GPU refusal is not checked"
fi

mkdir -p "$scratch/a_directory"
refused run_file_directory "run file '$scratch/a_directory' is a directory" \
  "${small[@]}" --set train.out_dir="$scratch/o1" "$scratch/a_directory"
: > "$scratch/empty.toml"
printf '# only a comment\n' > "$scratch/comment.toml"
for f in empty comment; do
  refused "run_file_$f" "run file '$scratch/$f.toml' sets nothing" \
    "${small[@]}" --set train.out_dir="$scratch/o2" "$scratch/$f.toml"
done
refused plugin_path "--plugin-path '/no/such/plugins' is not a directory" \
  --plugin-path /no/such/plugins "${small[@]}" --set train.out_dir="$scratch/o3" "$SRC/configs/run.toml"
printf 'localhost slots=2\n' > "$scratch/hostfile"
refused nproc_over_slots "--nproc 3 asks for more ranks than the 2 slots of the hosts (localhost:2)" \
  --hostfile "$scratch/hostfile" --nproc 3 --dry-run "$SRC/configs/run.toml"

# Plugins that fail while starting (tests/plugins, beside the test binaries).
test_plugins=$(cd "$(dirname "$ZTRAIN")/../tests/plugins" && pwd)
for p in crashing throwing; do
  printf '[model]\nplugin = "%s"\n[train]\nout_dir = "%s"\n' "$p" "$scratch/o_$p" > "$scratch/$p.toml"
done
status=0
"$ZTRAIN" --plugin-path "$test_plugins" "$scratch/crashing.toml" > "$scratch/crash.out" 2>&1 || status=$?
[ "$status" -ne 0 ] || fail "crashing plugin: exit 0"
grep -q "ztrain: crashed (SIGSEGV) while starting plugin 'crashing' from $test_plugins/" "$scratch/crash.out" ||
  fail "crashing plugin: not named: $(cat "$scratch/crash.out")"
echo "crashing plugin: $(grep -m1 "crashed" "$scratch/crash.out" | cut -c1-160) (exit $status)"
refused throwing_plugin "plugin 'throwing' failed to start: cannot build the model (test)" \
  --plugin-path "$test_plugins" "$scratch/throwing.toml"

# An llm.c token file whose magic is damaged.
python3 - "$scratch/bad.bin" << 'PY'
import struct, sys
header = [12345678, 1, 3000] + [0] * 253
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *header))
    f.write(struct.pack("<3000H", *[i % 200 for i in range(3000)]))
PY
refused corrupt_magic "have an llm.c header's shape (version 1, 3000 tokens) but its magic is 12345678" \
  "${small[@]}" --set train.out_dir="$scratch/o4" --set data.plugin=tokens --set data.path="$scratch/bad.bin" \
  "$SRC/configs/run.toml"

# Rank 0 of 3 alone: it names the missing ranks while it waits and when it gives up.
reserve_port
status=0
RANK=0 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 "$ZTRAIN" "${small[@]}" \
  --set comm.timeout=7 --set train.out_dir="$scratch/o5" "$SRC/configs/run.toml" > "$scratch/alone.out" 2>&1 ||
  status=$?
[ "$status" -ne 0 ] && [ "$status" -ne 124 ] || fail "alone: exit $status: $(cat "$scratch/alone.out")"
grep -q "rank 0: waiting at port $port for ranks 1, 2 (2 of 2), not arrived after 5 s" "$scratch/alone.out" ||
  fail "alone: no report of the missing ranks: $(cat "$scratch/alone.out")"
grep -q "never arrived: ranks 1, 2 (2 of 2); start them with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE" \
  "$scratch/alone.out" || fail "alone: the final error does not name the missing ranks: $(cat "$scratch/alone.out")"
echo "alone: $(tail -1 "$scratch/alone.out" | cut -c1-200)"
echo "PASS"
