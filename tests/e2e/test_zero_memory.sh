#!/usr/bin/env bash
# Memory truth. At world 1, 2 and 4, in fp32, in bf16 and in bf16 with fp32
# gradient accumulation, each strategy's measured peak bytes per rank of
# parameters, gradients and optimizer state (the largest over ranks, as the
# metrics report them) must be ZeRO's formulas plus padding (at most 1 %)
# plus the buffers the options allow, and `ztrain estimate` must predict
# every category within 5 %. With p bytes per working parameter (4 or 2),
# g per gradient (4 or 2) and o optimizer bytes per parameter (8: m and v;
# 12 with fp32 master weights beside 16-bit working ones):
#   ddp    params p psi     grads g psi            optimizer o psi
#   zero1  params p psi     grads g psi            optimizer o psi / N
#   zero2  params p psi     grads g psi / N + B    optimizer o psi / N
#   zero3  params p psi / N + L   grads as zero2   optimizer o psi / N
# which in bf16 is ZeRO's 16 psi, 4 psi + 12 psi/N, 2 psi + 14 psi/N and
# 16 psi/N. B, the gradient buckets alive at once: with overlap_comm, those
# of the module in backward and of the one before it (still being
# reduced), plus the embedding's, which the tied head keeps open through
# backward; at most g (2 M + E) bytes with M the largest block and E the
# embedding module. L, the gathered parameters: at least one block (p M),
# at most max_live_parameters (every parameter sharded: persistence
# threshold 0). zero3 also runs at its default options, where every
# parameter of this model is under the persistence threshold (1e5) and is
# gathered once and kept: params p (psi/N + psi).
# Both the measured peaks and `ztrain estimate` must meet these closed
# forms, so an estimate that leaves a category out fails even where it
# shares its code with the run.
# Activations are measured where the model allocates them (one device
# allocation per activation, all returned at the end of the micro-step),
# and must equal, measured and estimated, this GPT-2's closed form in
# floats (N = B T tokens, C width, H = 4C, h heads, V vocabulary, L blocks):
#   (L+1) N C                        residual stream
#   + L (15 N C + 4 N + h N)         per block: norms, qkv, attention, MLP
#   + 15 N C + 3 N + N V             final norm, logits, losses, gradients
# with activation checkpointing one block's activations instead of L.
# Kept in bf16 (the runs in bf16), the 15 N C a block keeps and the L+1
# streams are 16-bit copies, beside one fp32 working set of a block and
# two fp32 stream slots; the statistics stay fp32:
#   2 N C + L (4 N + h N) + 15 N C + (15 N C + 3 N + N V)   in fp32
#   + (L+1) N C + L 15 N C                                   in bf16
#
# usage: test_zero_memory.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

C=64 V=256 T=32 B=2 L=6 heads=4 live=80000
common=(--model gpt2-tiny --set model.n_layer=$L --set model.n_embd=$C --set model.seq_len=$T
  --set model.vocab_size=$V --set train.steps=3 --set train.log_every=1 --set train.eval_every=0
  --set device.threads=1 --set train.save_final=false --set train.micro_batch_size=$B
  --set strategy.reduce_bucket_size=20000)
zero3=(--set strategy.param_persistence_threshold=0 --set strategy.max_live_parameters=$live
  --set strategy.prefetch_bucket_size=30000)
M=$((12 * C * C + 13 * C)) E=$((V * C + T * C)) N=$((B * T))
# activations BLOCKS: the closed form above, in bytes
activations() {
  echo $((4 * ((L + 1) * N * C + $1 * (15 * N * C + 4 * N + heads * N) + 15 * N * C + 3 * N + N * V)))
}
# activations16: the closed form of activations kept in bf16, in bytes
activations16() {
  echo $((4 * (2 * N * C + L * (4 * N + heads * N) + 15 * N * C + 15 * N * C + 3 * N + N * V) +
    2 * ((L + 1) * N * C + L * 15 * N * C)))
}

# peak CATEGORY FILE: the peak bytes of CATEGORY in the device tier (worst rank)
peak() {
  grep '"split": "train"' "$2" | tail -n 1 | sed -n "s/.*\"device\": {[^}]*\"$1\": \([0-9]*\).*/\1/p"
}
# estimated CATEGORY FILE: the estimate's bytes of CATEGORY in the device tier
estimated() {
  local b
  b=$(awk -v c="$1" '$1 == "device" && $2 == c { print $3 }' "$2")
  echo "${b:-0}"
}
# expect NAME CATEGORY LOW HIGH: the measured peak and the estimate both in [LOW, HIGH]
expect() {
  local name=$1 c=$2 lo=$3 hi=$4 got
  for got in "$(peak "$c" "$scratch/$name/metrics.jsonl")" "$(estimated "$c" "$scratch/$name.estimate")"; do
    awk -v g="$got" -v lo="$lo" -v hi="$hi" 'BEGIN { exit !(g >= lo && g <= hi) }' ||
      fail "$name: $c = $got bytes (measured $(peak "$c" "$scratch/$name/metrics.jsonl"), estimated $(estimated "$c" "$scratch/$name.estimate")), outside the closed form's [$lo, $hi]"
  done
}

# measure NAME RANKS ARGS...: a run and its estimate; psi into $psi
measure() {
  local name=$1 n=$2 c got want
  shift 2
  on_ranks "$n" "$ZTRAIN" "${common[@]}" "$@" --set train.out_dir="$scratch/$name" \
    "$SRC/configs/run.toml" > "$scratch/$name.out" 2>&1 ||
    { cat "$scratch/$name.out" >&2; fail "run $name failed"; }
  "$ZTRAIN" estimate --world "$n" "${common[@]}" "$@" "$SRC/configs/run.toml" \
    > "$scratch/$name.estimate" || { cat "$scratch/$name.estimate" >&2; fail "estimate $name failed"; }
  psi=$(sed -n 's/.*(gpt2, \([0-9]*\) params).*/\1/p' "$scratch/$name.estimate")
  [ -n "$psi" ] || fail "no parameter count in the estimate of $name"
  echo "$name: psi $psi"
  for c in params grads optimizer comm activations; do
    got=$(peak "$c" "$scratch/$name/metrics.jsonl") want=$(estimated "$c" "$scratch/$name.estimate")
    echo "  $c: measured $got, estimated $want"
    awk -v g="$got" -v w="$want" 'BEGIN { d = g - w; if (d < 0) d = -d;
        exit !(d <= 0.05 * (g > w ? g : w)) }' ||
      fail "$name: estimate of $c ($want) is not within 5% of the measured $got"
  done
}

for mode in "fp32 4 4 8" "bf16 2 2 12" "bf16acc32 2 4 12"; do
  read -r label P G O <<< "$mode"
  precision=(--set train.precision=${label%acc32})
  [ "$label" = bf16acc32 ] && precision+=(--set train.grad_accum_dtype=fp32)
  for strategy in ddp zero1 zero2 zero3 zero3_default; do
    extra=(--strategy "${strategy%_default}")
    [ "$strategy" = zero3 ] && extra+=("${zero3[@]}")
    for n in 1 2 4; do
      name="${label}_${strategy}_w$n"
      measure "$name" "$n" "${precision[@]}" "${extra[@]}"
      grep -q "${label%acc32} weights and $([ $G = 4 ] && echo fp32 || echo bf16) gradients" \
        "$scratch/$name.estimate" || fail "the estimate of $name does not state its precision"
      shard=$((psi / n))
      a=$(activations "$L")
      [ "$label" = fp32 ] || a=$(activations16)
      expect "$name" activations "$a" "$a"
      case $strategy in
        ddp)
          expect "$name" params $((P * psi)) $((P * psi * 101 / 100))
          expect "$name" grads $((G * psi)) $((G * psi * 101 / 100))
          expect "$name" optimizer $((O * psi)) $((O * psi * 101 / 100)) ;;
        zero1)
          expect "$name" params $((P * psi)) $((P * psi * 101 / 100))
          expect "$name" grads $((G * psi)) $((G * psi * 101 / 100))
          expect "$name" optimizer $((O * shard)) $((O * shard * 101 / 100)) ;;
        zero2 | zero3 | zero3_default)
          expect "$name" grads $((G * shard)) $((G * (shard + 2 * M + E) * 101 / 100))
          expect "$name" optimizer $((O * shard)) $((O * shard * 101 / 100))
          case $strategy in
            zero2) expect "$name" params $((P * psi)) $((P * psi * 101 / 100)) ;;
            zero3) expect "$name" params $((P * (shard + M))) $((P * (shard + live) * 101 / 100)) ;;
            zero3_default)
              expect "$name" params $((P * (shard + psi))) $((P * (shard + psi) * 101 / 100)) ;;
          esac ;;
      esac
    done
  done
done
measure ckpt_w2 2 --set model.activation_checkpointing=true
a=$(activations 1)
expect ckpt_w2 activations "$a" "$a"
echo "PASS"
