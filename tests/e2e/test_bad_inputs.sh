#!/usr/bin/env bash
# Bad inputs fail early, with a non-zero status (1 or 2, never a crash) and a
# message that says what and where: config errors name file:line:col and the
# key, data errors the file, a missing plugin the directories searched.
# Also: `ztrain plugins` lists the built-in plugins with their options, and
# the files it did not load with why. Bounds say the real limit, a size's
# error names its key once, a text file may hold nothing out when the run
# does not evaluate (and the run says how many epochs it reads), an
# evaluation that reads its val split more than once says so, and
# weights that are not finite are refused at load, naming the tensor.
#
# usage: test_bad_inputs.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail

source "$(dirname "$0")/lib.sh"

# Small enough that nothing takes time if a check below wrongly starts training.
TINY=(--set train.steps=2 --set model.n_layer=1 --set model.n_head=2 --set model.n_embd=32
  --set model.seq_len=16 --set model.vocab_size=64)

# must_fail LABEL CMD...: CMD exits 1 or 2 (an error, not a crash); its
# stderr is left in $scratch/err.
must_fail() {
  local label=$1
  shift
  local rc=0
  "$@" >"$scratch/out" 2>"$scratch/err" || rc=$?
  if [[ $rc -eq 0 ]]; then
    cat "$scratch/out" >&2
    fail "$label: expected a failure, but the command exited 0"
  fi
  if [[ $rc -ne 1 && $rc -ne 2 ]]; then
    cat "$scratch/err" >&2
    fail "$label: exit status $rc (a crash?), expected 1 or 2"
  fi
  [[ -s "$scratch/err" ]] || fail "$label: failed with status $rc but printed nothing on stderr"
}

# says LABEL TEXT...: stderr of the last must_fail contains each TEXT.
says() {
  local label=$1
  shift
  local text
  for text in "$@"; do
    grep -qF -- "$text" "$scratch/err" || {
      echo "--- stderr:" >&2
      cat "$scratch/err" >&2
      fail "$label: the message does not contain '$text'"
    }
  done
}

# ------------------------------------------------------------ (a) bad config
cat >"$scratch/unknown_key.toml" <<'EOF'
[model]
n_layer = 1

[train]
steps = 3
stepz = 3
EOF
must_fail "unknown key" "$ZTRAIN" "$scratch/unknown_key.toml"
says "unknown key" "$scratch/unknown_key.toml:6:1" "stepz" "'steps'"
[[ $(cat "$scratch/err") == *"did you mean 'steps'"* ]] || fail "unknown key: no 'did you mean' suggestion"

must_fail "wrong type (--set)" "$ZTRAIN" "${TINY[@]}" --set 'train.steps="abc"' "$SRC/configs/run.toml"
says "wrong type (--set)" 'train.steps="abc"' "steps" "abc" "expected an integer"

cat >"$scratch/wrong_type.toml" <<'EOF'
[train]
steps = "abc"
EOF
must_fail "wrong type (file)" "$ZTRAIN" "$scratch/wrong_type.toml"
says "wrong type (file)" "$scratch/wrong_type.toml:2:" "steps" "expected an integer"

cat >"$scratch/syntax.toml" <<'EOF'
[model]
n_layer = 1
[train]
steps = = 3
EOF
must_fail "TOML syntax error" "$ZTRAIN" "$scratch/syntax.toml"
says "TOML syntax error" "$scratch/syntax.toml:4:"
grep -qE 'syntax\.toml:4:[0-9]+' "$scratch/err" || fail "TOML syntax error: no line:col in $(cat "$scratch/err")"

cat >"$scratch/bad_section.toml" <<'EOF'
[trian]
steps = 3
EOF
must_fail "unknown section" "$ZTRAIN" "$scratch/bad_section.toml"
says "unknown section" "$scratch/bad_section.toml:1:" "trian" "'train'"

must_fail "malformed --set" "$ZTRAIN" --set 'train.steps' "$SRC/configs/run.toml"
says "malformed --set" "train.steps"

# ------------------------------------------------------------ (b) bad token files
# llm.c header: 256 little-endian int32 (magic, version, count, 0...), then tokens.
perl -e 'print pack("l<256", 20240520, 7, 100); print pack("S<*", map { $_ % 60 } 0 .. 99)' \
  >"$scratch/bad_version.bin"
must_fail "llm.c file with version 7 for magic 20240520" "$ZTRAIN" "${TINY[@]}" \
  --set data.plugin=tokens --set data.path="\"$scratch/bad_version.bin\"" \
  --set train.out_dir="\"$scratch/out_version\"" "$SRC/configs/run.toml"
says "llm.c bad version" "$scratch/bad_version.bin" "version" "20240520"
[[ ! -e "$scratch/out_version/metrics.jsonl" ]] || fail "llm.c bad version: training started before the data was checked"

perl -e 'my @t = map { $_ % 60 } 0 .. 999; $t[500] = 70; print pack("l<256", 20240520, 1, 1000); print pack("S<*", @t)' \
  >"$scratch/big_id.bin"
must_fail "token id >= vocab_size" "$ZTRAIN" "${TINY[@]}" \
  --set data.plugin=tokens --set data.path="\"$scratch/big_id.bin\"" \
  --set train.out_dir="\"$scratch/out_id\"" "$SRC/configs/run.toml"
says "token id >= vocab_size" "$scratch/big_id.bin" "70" "vocab_size 64" "token 500"
[[ ! -e "$scratch/out_id/metrics.jsonl" ]] || fail "token id >= vocab_size: training started before the data was checked"

# The same file is fine with a big enough vocabulary (so the failure above is the id).
"$ZTRAIN" "${TINY[@]}" --set model.vocab_size=128 --set data.plugin=tokens \
  --set data.path="\"$scratch/big_id.bin\"" --set train.out_dir="\"$scratch/out_ok\"" \
  "$SRC/configs/run.toml" >"$scratch/out" 2>&1 || {
  cat "$scratch/out" >&2
  fail "a valid llm.c token file with vocab_size 128 does not train"
}

must_fail "tokens without path" "$ZTRAIN" "${TINY[@]}" --set data.plugin=tokens "$SRC/configs/run.toml"
says "tokens without path" "path" "required"

must_fail "missing token file" "$ZTRAIN" "${TINY[@]}" --set data.plugin=tokens \
  --set data.path="\"$scratch/no_such.bin\"" "$SRC/configs/run.toml"
says "missing token file" "$scratch/no_such.bin"

# ------------------------------------------------------------ (c) missing plugin
mkdir "$scratch/extra_plugins"
must_fail "missing model plugin" "$ZTRAIN" "${TINY[@]}" --plugin-path "$scratch/extra_plugins" \
  --set model.plugin=nonexistent "$SRC/configs/run.toml"
says "missing model plugin" "no model plugin named 'nonexistent'" "searched" "$scratch/extra_plugins"
# The directories listed include the one that holds the built-in plugins.
found_dir=0
while IFS= read -r line; do
  dir=${line#"${line%%[![:space:]]*}"}
  [[ -n "$dir" && -e "$dir/libztrain_model_transformer.so" ]] && found_dir=1
done <"$scratch/err"
[[ $found_dir -eq 1 ]] || {
  cat "$scratch/err" >&2
  fail "missing model plugin: the searched directories do not include the built-in plugin directory"
}

must_fail "missing data plugin" "$ZTRAIN" "${TINY[@]}" --set data.plugin=nonexistent "$SRC/configs/run.toml"
says "missing data plugin" "no data plugin named 'nonexistent'"

# ------------------------------------------------------------ (d) missing run file
must_fail "missing run file" "$ZTRAIN" "$scratch/does_not_exist.toml"
says "missing run file" "$scratch/does_not_exist.toml"
grep -qi 'no such file\|not found\|cannot read\|does not exist' "$scratch/err" ||
  fail "missing run file: the message does not say the file is missing: $(cat "$scratch/err")"

must_fail "no run file" "$ZTRAIN"
says "no run file" "no run file"

must_fail "unknown option" "$ZTRAIN" --no-such-option "$SRC/configs/run.toml"
says "unknown option" "no-such-option"

# ------------------------------------------------------------ (e) ztrain plugins
rc=0
"$ZTRAIN" plugins >"$scratch/plugins" 2>"$scratch/err" || rc=$?
[[ $rc -eq 0 ]] || {
  cat "$scratch/plugins" "$scratch/err" >&2
  fail "'ztrain plugins' exited with status $rc"
}
# block KIND NAME: the lines of one plugin's entry (its header and indented lines).
block() {
  awk -v head="$1 $2 " '
    index($0, head) == 1 { inside = 1; print; next }
    /^[^ ]/ { inside = 0 }
    inside { print }
  ' "$scratch/plugins"
}
check_plugin() { # check_plugin KIND NAME OPTION...
  local kind=$1 name=$2
  shift 2
  local entry
  entry=$(block "$kind" "$name")
  [[ -n "$entry" ]] || {
    cat "$scratch/plugins" >&2
    fail "'ztrain plugins' does not list $kind plugin '$name'"
  }
  [[ "$entry" == *"file: "*"$name"* ]] || fail "'ztrain plugins': $kind $name has no file line: $entry"
  local opt
  for opt in "$@"; do
    grep -qE "^    $opt \(" <<<"$entry" || fail "'ztrain plugins': $kind $name does not list its option '$opt': $entry"
  done
}
check_plugin model transformer arch n_layer n_head n_embd vocab_size seq_len activation_checkpointing
check_plugin data synthetic vocab_size branching skew
check_plugin data tokens path val_path format val_fraction shuffle
check_plugin data text path val_fraction shuffle
check_plugin strategy ddp
# Options show type and default.
grep -qE '^    n_layer \(integer, default [0-9]+\)' "$scratch/plugins" ||
  fail "'ztrain plugins' does not show the type and default of n_layer"

# ------------------------------------------------------------ (f) bounds, odd values
# Steps past what 64-bit counters hold say the real bound at this batch.
must_fail "steps past the bound" "$ZTRAIN" "${TINY[@]}" --set train.steps=9223372036854775806 \
  --set train.out_dir="$scratch/bound" "$SRC/configs/run.toml"
says "steps past the bound" "at most 1152921504606846975 steps at this batch"
must_fail "steps past 64 bits" "$ZTRAIN" "${TINY[@]}" --set train.steps=1e19 "$SRC/configs/run.toml"
says "steps past 64 bits" "past the 64-bit integers (at most 9223372036854775807)"
# A negative size names its key once.
must_fail "negative memory_limit" "$ZTRAIN" "${TINY[@]}" --set device.memory_limit=-5 "$SRC/configs/run.toml"
says "negative memory_limit" "[device] memory_limit: got -5"
[[ $(grep -o "\[device\] memory_limit" "$scratch/err" | wc -l) -eq 1 ]] ||
  fail "the memory_limit error repeats its prefix: $(cat "$scratch/err")"

# A text file with nothing held out trains when the run does not evaluate,
# and says how many epochs it reads; with evaluation it is refused, naming
# eval_every.
python3 -c "print('hello world, this is text. ' * 200)" >"$scratch/text.txt"
text=(--model gpt2-tiny --set model.n_layer=1 --set model.n_embd=32 --set model.seq_len=16
  --set model.vocab_size=256 --set data.plugin=text --set data.path="$scratch/text.txt"
  --set data.val_fraction=0 --set train.steps=100 --set device.threads=1)
"$ZTRAIN" "${text[@]}" --set train.eval_every=0 --set train.out_dir="$scratch/no_val" \
  "$SRC/configs/run.toml" >"$scratch/no_val.out" 2>&1 ||
  fail "val_fraction = 0 without evaluation was refused: $(tail -2 "$scratch/no_val.out")"
grep -Eq "^data: [0-9]+ training sequences; 100 steps of 8 read them [0-9.]+ times \(epochs\): the data repeats" \
  "$scratch/no_val.out" || fail "a run that repeats its data does not say how many epochs"
must_fail "val_fraction 0 with evaluation" "$ZTRAIN" "${text[@]}" --set train.out_dir="$scratch/val0" \
  "$SRC/configs/run.toml"
says "val_fraction 0 with evaluation" "0 held-out tokens" "[train] eval_every = 0 to hold nothing out"
# A val split smaller than an evaluation reads is said, with the
# eval_batches that reads each sequence once.
"$ZTRAIN" "${text[@]}" --set data.val_fraction=0.05 --set train.steps=1 --set train.out_dir="$scratch/small_val" \
  "$SRC/configs/run.toml" >"$scratch/small_val.out" 2>&1 || fail "a small val split was refused: $(tail -2 "$scratch/small_val.out")"
grep -Eq "^warning: data: the val split holds [0-9]+ sequences and an evaluation reads eval_batches 8 x 8 = 64, so it reads some more than once; set \[train\] eval_batches = [0-9]+ to read each once" \
  "$scratch/small_val.out" || fail "a small val split is not said: $(grep -i val "$scratch/small_val.out")"

# init_from weights holding a NaN are refused at load, naming the tensor.
tiny_w=(--model gpt2-tiny --set model.n_layer=1 --set model.n_embd=32 --set model.seq_len=16
  --set model.vocab_size=64 --set device.threads=1 --set train.steps=1)
"$ZTRAIN" "${tiny_w[@]}" --set train.out_dir="$scratch/weights" "$SRC/configs/run.toml" >/dev/null 2>&1 ||
  fail "the run making weights failed"
python3 - "$scratch/weights/model.safetensors" "$scratch/nan.safetensors" <<'PY'
import json, struct, sys
data = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
start = 8 + n + header["transformer.wte.weight"]["data_offsets"][0]
data[start + 4 * 5:start + 4 * 6] = struct.pack("<f", float("inf"))
open(sys.argv[2], "wb").write(data)
PY
must_fail "weights with an inf" "$ZTRAIN" "${tiny_w[@]}" --set model.init_from="$scratch/nan.safetensors" \
  --set train.out_dir="$scratch/from_nan" "$SRC/configs/run.toml"
says "weights with an inf" "init_from: tensor 'transformer.wte.weight'" "holds inf at element 5"
! grep -q "^step 1" "$scratch/out" || fail "the run trained on weights that are not finite"

# A 10 MB value is named and cut, not echoed whole.
python3 -c "import sys; open(sys.argv[1], 'w').write('[train]\\nschedule = \"' + 'A' * 10_000_000 + '\"\\n')" \
  "$scratch/huge_value.toml"
must_fail "a 10 MB value" "$ZTRAIN" "$scratch/huge_value.toml"
says "a 10 MB value" "huge_value.toml:2:1: [train] schedule: got \"AAAA" "... (10000000 bytes), expected"
[[ $(wc -c <"$scratch/err") -lt 10000 ]] || fail "a 10 MB value: $(wc -c <"$scratch/err") bytes of message"

# Refused plugins are listed with the reason, not dropped from the list
# (the test plugins, built beside this script's working directory).
[[ -d "$build_tests/plugins" ]] || fail "no test plugin directory at $build_tests/plugins"
"$ZTRAIN" plugins --plugin-path "$build_tests/plugins" >"$scratch/plugins" 2>"$scratch/err" ||
  fail "'ztrain plugins --plugin-path' failed: $(cat "$scratch/err")"
grep -A1 "libztrain_strategy_bad_abi.so\$" "$scratch/plugins" |
  grep -q "plugin ABI version 999, but this ztrain expects" ||
  fail "'ztrain plugins' does not say why bad_abi was refused: $(cat "$scratch/plugins")"
grep -A1 "libztrain_strategy_old_abi.so\$" "$scratch/plugins" | grep -q "without an ABI record" ||
  fail "'ztrain plugins' does not say why old_abi was refused"
grep -A1 "libnot_a_plugin.so\$" "$scratch/plugins" | grep -q "not a ztrain plugin" ||
  fail "'ztrain plugins' does not list a library that is not a plugin"

echo "test_bad_inputs: ok"
