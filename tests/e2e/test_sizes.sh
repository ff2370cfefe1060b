#!/usr/bin/env bash
# Sizes that cannot be are refused at once, naming the key, never narrowed
# into another model that trains and exits 0.
# - Integers out of their type's range (a vocabulary of 2^32 + 512 that
#   would wrap to 512, 2^40, n_layer 2^32 + 4 that would wrap to 4,
#   n_layer 1e9, a micro-batch of 2^32 + 1) are config errors naming the
#   key and the accepted range, in `ztrain estimate` and in a run.
# - Products that overflow 64 bits (seq_len x micro_batch x widths) are
#   config errors naming the keys.
# - A run whose memory exceeds this machine's RAM (seq_len 1e8, a
#   vocabulary of 2e9) is refused before it allocates, within seconds,
#   naming what makes it large; no weights are written.
# - `estimate` of a model with a long context builds nothing proportional to
#   it (Llama's rotary tables live with the activations): seq_len 1e8 is
#   estimated in a second.
#
# usage: test_sizes.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

run=(--set train.steps=1 --set train.out_dir="$scratch/out" --set device.threads=1)

# refused WHAT PATTERN ARGS...: `ztrain ARGS` and `ztrain estimate ARGS`
# exit 2 within 20 s, printing PATTERN.
refused() {
  local what=$1 pattern=$2 out status
  shift 2
  for mode in run estimate; do
    status=0
    if [ "$mode" = run ]; then
      out=$(timeout 20 "$ZTRAIN" "${run[@]}" "$@" "$SRC/configs/run.toml" 2>&1) || status=$?
    else
      out=$(timeout 20 "$ZTRAIN" estimate "$@" "$SRC/configs/run.toml" 2>&1) || status=$?
    fi
    [ "$status" -eq 2 ] || fail "$what ($mode): exit $status, not 2: $out"
    grep -q -- "$pattern" <<< "$out" || fail "$what ($mode): unclear error: $out"
  done
  [ ! -e "$scratch/out/model.safetensors" ] || fail "$what wrote weights"
  echo "$what: $(grep -m1 -o -- "$pattern.*" <<< "$out" | cut -c1-160)"
}

refused "vocabulary 2^32+512" "\[model\] vocab_size: got 4294967808, expected an integer in \[1, 2147483647\]" \
  --set model.vocab_size=4294967808
refused "vocabulary 2^40" "\[model\] vocab_size: got 1099511627776" --set model.vocab_size=1099511627776
refused "n_layer 2^32+4" "\[model\] n_layer: got 4294967300, expected an integer in \[1, 100000\]" \
  --set model.n_layer=4294967300
refused "n_layer 1e9" "\[model\] n_layer: got 1000000000" --set model.n_layer=1e9
refused "micro-batch 2^32+1" "\[train\] micro_batch_size: got 4294967297" --set train.micro_batch_size=4294967297
refused "activations past 2^62 bytes" "\[model\] seq_len = 2000000000 with \[train\] micro_batch_size = 8 makes activations of more than 2^62 bytes" \
  --set model.seq_len=2e9 --set model.n_embd=200000000

# Larger than the machine: refused before allocating.
big() {
  local what=$1 pattern=$2 out status=0
  shift 2
  out=$(timeout 20 "$ZTRAIN" "${run[@]}" "$@" "$SRC/configs/run.toml" 2>&1) || status=$?
  [ "$status" -eq 2 ] || fail "$what: exit $status, not 2: $out"
  grep -q -- "$pattern" <<< "$out" || fail "$what: unclear error: $out"
  echo "$what: $(grep -m1 -o -- "this run needs.*" <<< "$out" | cut -c1-200)"
}
big "seq_len 1e8" "more than its .* of RAM: mostly activations .* from \[model\] seq_len = 100000000 (--set model.seq_len=1e8)" \
  --set model.seq_len=1e8
big "seq_len 1e8, Llama" "mostly activations" --model llama-tiny --set model.seq_len=1e8
big "vocabulary 2e9" "more than its .* of RAM" --set model.vocab_size=2e9
big "1e5 layers" "more than its .* of RAM" --set model.n_layer=100000 --set model.n_embd=1024

# estimate builds nothing the size of the context.
start=$(date +%s)
"$ZTRAIN" estimate --model llama-tiny --set model.seq_len=1e8 "$SRC/configs/run.toml" > "$scratch/est.out" 2>&1 ||
  fail "estimate of a long context failed: $(cat "$scratch/est.out")"
[ $(($(date +%s) - start)) -le 5 ] || fail "estimate of a long context took $(($(date +%s) - start)) s"
echo "PASS"
