#!/usr/bin/env bash
# Memory truth. At world 2 and 4, in fp32, in bf16 and in bf16 with fp32
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
# threshold 0).
#
# usage: test_zero_memory.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

C=64 V=256 T=32 live=80000
common=(--model gpt2-tiny --set model.n_layer=6 --set model.n_embd=$C --set model.seq_len=$T
  --set model.vocab_size=$V --set train.steps=3 --set train.log_every=1 --set train.eval_every=0
  --set device.threads=1 --set train.save_final=false --set train.micro_batch_size=2
  --set strategy.reduce_bucket_size=20000)
zero3=(--set strategy.param_persistence_threshold=0 --set strategy.max_live_parameters=$live
  --set strategy.prefetch_bucket_size=30000)
M=$((12 * C * C + 13 * C)) E=$((V * C + T * C))

# peak CATEGORY FILE: the peak bytes of CATEGORY in the device tier (worst rank)
peak() {
  grep '"split": "train"' "$2" | tail -n 1 | sed -n "s/.*\"device\": {[^}]*\"$1\": \([0-9]*\).*/\1/p"
}
# within NAME GOT LOW HIGH
within() {
  awk -v g="$2" -v lo="$3" -v hi="$4" 'BEGIN { exit !(g >= lo && g <= hi) }' ||
    fail "$1 = $2 bytes, outside [$3, $4]"
}

for mode in "fp32 4 4 8" "bf16 2 2 12" "bf16acc32 2 4 12"; do
  read -r label P G O <<< "$mode"
  precision=(--set train.precision=${label%acc32})
  [ "$label" = bf16acc32 ] && precision+=(--set train.grad_accum_dtype=fp32)
  for strategy in ddp zero1 zero2 zero3; do
    extra=()
    [ "$strategy" = zero3 ] && extra=("${zero3[@]}")
    for n in 2 4; do
      name="${label}_${strategy}_w$n"
      on_ranks "$n" "$ZTRAIN" "${common[@]}" "${precision[@]}" \
        --strategy "$strategy" "${extra[@]}" --set train.out_dir="$scratch/$name" \
        "$SRC/configs/run.toml" > "$scratch/$name.out" 2>&1 ||
        { cat "$scratch/$name.out" >&2; fail "run $name failed"; }
      "$ZTRAIN" estimate --world "$n" "${common[@]}" "${precision[@]}" --strategy "$strategy" \
        "${extra[@]}" "$SRC/configs/run.toml" > "$scratch/$name.estimate" ||
        { cat "$scratch/$name.estimate" >&2; fail "estimate $name failed"; }
      psi=$(sed -n 's/.*(gpt2, \([0-9]*\) params).*/\1/p' "$scratch/$name.estimate")
      [ -n "$psi" ] || fail "no parameter count in the estimate of $name"
      grep -q "${label%acc32} weights and $([ $G = 4 ] && echo fp32 || echo bf16) gradients" \
        "$scratch/$name.estimate" || fail "the estimate of $name does not state its precision"
      metrics="$scratch/$name/metrics.jsonl"
      p=$(peak params "$metrics") g=$(peak grads "$metrics") o=$(peak optimizer "$metrics")
      echo "$name: psi $psi | params $p grads $g optimizer $o"
      for c in params grads optimizer comm; do
        got=$(peak "$c" "$metrics")
        want=$(awk -v c="$c" '$1 == "device" && $2 == c { print $3 }' "$scratch/$name.estimate")
        want=${want:-0}
        echo "  $c: measured $got, estimated $want"
        awk -v g="$got" -v w="$want" 'BEGIN { d = g - w; if (d < 0) d = -d;
            exit !(d <= 0.05 * (g > w ? g : w)) }' ||
          fail "$name: estimate of $c ($want) is not within 5% of the measured $got"
      done
      shard=$((psi / n))
      case $strategy in
        ddp)
          within "$name params" "$p" $((P * psi)) $((P * psi * 101 / 100))
          within "$name grads" "$g" $((G * psi)) $((G * psi * 101 / 100))
          within "$name optimizer" "$o" $((O * psi)) $((O * psi * 101 / 100)) ;;
        zero1)
          within "$name params" "$p" $((P * psi)) $((P * psi * 101 / 100))
          within "$name grads" "$g" $((G * psi)) $((G * psi * 101 / 100))
          within "$name optimizer" "$o" $((O * shard)) $((O * shard * 101 / 100)) ;;
        zero2 | zero3)
          within "$name grads" "$g" $((G * shard)) $((G * (shard + 2 * M + E) * 101 / 100))
          within "$name optimizer" "$o" $((O * shard)) $((O * shard * 101 / 100))
          if [ "$strategy" = zero2 ]; then
            within "$name params" "$p" $((P * psi)) $((P * psi * 101 / 100))
          else
            within "$name params" "$p" $((P * (shard + M))) $((P * (shard + live) * 101 / 100))
          fi ;;
      esac
    done
  done
done
echo "PASS"
