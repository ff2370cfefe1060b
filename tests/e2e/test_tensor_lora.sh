#!/usr/bin/env bash
# Fine-tuning under tensor parallelism: LoRA's adapters cut with their
# projections (a column-parallel one's B by rows, A whole on every rank; a
# row-parallel one's A by columns, B whole, its product added once) and
# freeze's frozen parts must train what the same method trains at world 1:
# GPT-2 with every projection adapted (the fused c_attn's B cut in q, k, v
# sections) at tensor 2 and 4, Llama with 2 key/value heads and every
# projection adapted at tensor 2 and at tensor 2 x data 2 under zero3 (the
# frozen base parts sharded over the data ranks), freeze at tensor 2.
# Losses and gradient norms within 1e-6 and 4e-6 per step (test_lora.sh's
# tolerances: the sums only grouped otherwise); the gradient norm counts
# an adapter the group shares once, and `ztrain estimate` says what a rank
# measures. A checkpoint of LoRA at tensor 2
# resumes at world 1 with the same later steps; the final weights (the
# adapters merged, gathered from the parts) and PEFT's adapter directory
# are world 1's tensors, and a step from the merge, or from the adapters
# read back in parts ([model] adapter_from), is world 1's. Adapters
# on key/value heads copied over more ranks than there are heads are
# refused by key.
#
# usage: test_tensor_lora.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/sequence_lib.sh"

lora=(--set 'model.finetuning_type="lora"' --set model.lora_rank=4 --set model.lora_alpha=8)
base=(--model gpt2-tiny "${common[@]}" "${lora[@]}")
train_run g_w1 1 8 1
train_run g_t2 2 8 1 --set parallel.tensor=2
train_run g_t4 4 8 1 --set parallel.tensor=4
for name in g_t2 g_t4; do same_training g_w1 "$name" 1e-6 4e-6; done

base=(--model llama-tiny --set model.n_kv_head=2 "${common[@]}" "${lora[@]}")
train_run l_w1 1 4 2
train_run l_t2 2 4 2 --set parallel.tensor=2
train_run l_t2d2_zero3 4 2 2 --set parallel.tensor=2 --strategy zero3
for name in l_t2 l_t2d2_zero3; do same_training l_w1 "$name" 1e-6 4e-6; done
# `ztrain estimate` knows the parts and the frozen base: a rank's bytes are
# those it measured.
estimated_as_measured l_t2 2 "${base[@]}" --set parallel.tensor=2 --set train.micro_batch_size=4 \
  --set train.grad_accum=2

base=(--model llama-tiny --set model.n_kv_head=2 "${common[@]}"
  --set 'model.finetuning_type="freeze"' --set model.freeze_trainable_layers=1)
train_run f_w1 1 4 2
train_run f_t2 2 4 2 --set parallel.tensor=2
same_training f_w1 f_t2 1e-6 4e-6

# A checkpoint at tensor 2 (the adapters' state, the whole model's
# coordinates) continues at world 1 with the same steps 6 to 10.
base=(--model llama-tiny --set model.n_kv_head=2 "${common[@]}" "${lora[@]}")
train_run c_t2 2 4 2 --set parallel.tensor=2 --set train.checkpoint_every=5
on_ranks 1 "$ZTRAIN" "${base[@]}" --set train.micro_batch_size=4 --set train.grad_accum=2 \
  --set train.out_dir="$scratch/c_resumed" --resume="$scratch/c_t2/step_5" --set parallel.tensor=1 \
  "$SRC/configs/run.toml" > "$scratch/c_resumed.out" 2>&1 ||
  { cat "$scratch/c_resumed.out" >&2; fail "resuming LoRA's tensor-parallel checkpoint failed"; }
curve c_resumed 5
tail -n 5 "$scratch/l_w1.curve" > "$scratch/l_w1_last5.curve"
same_training l_w1_last5 c_resumed 1e-6 4e-6

# The weights out: merged and gathered, the same tensors as world 1's, and
# PEFT's adapters likewise; one step from each merge at world 1 is the
# same step.
train_run e_w1 1 4 2 --set train.save_final=true
train_run e_t2 2 4 2 --set parallel.tensor=2 --set train.save_final=true
headers() {  # headers FILE: each tensor's name, dtype and shape
  python3 - "$1" << 'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
h.pop("__metadata__", None)
for name in sorted(h):
    print(name, h[name]["dtype"], h[name]["shape"])
PY
}
for file in model.safetensors adapter/adapter_model.safetensors; do
  [ "$(headers "$scratch/e_w1/$file")" = "$(headers "$scratch/e_t2/$file")" ] ||
    fail "tensor 2's $file does not hold world 1's tensors"
done
base=(--model llama-tiny --set model.n_kv_head=2 "${common[@]}")
for name in e_w1 e_t2; do from_weights "from_$name" 1 "$name"; done
same_training from_e_w1 from_e_t2 1e-6 2e-6
# And PEFT's adapters in ([model] adapter_from): each rank reads its parts
# of the whole adapters, so tensor 2's first step from them is world 1's.
base=(--model llama-tiny --set model.n_kv_head=2 "${common[@]}" "${lora[@]}")
for np in 1 2; do
  on_ranks "$np" "$ZTRAIN" "${base[@]}" --set train.steps=1 --set parallel.tensor="$np" \
    --set model.adapter_from="$scratch/e_w1/adapter" --set train.out_dir="$scratch/adapter_t$np" \
    "$SRC/configs/run.toml" > "$scratch/adapter_t$np.out" 2>&1 ||
    { cat "$scratch/adapter_t$np.out" >&2; fail "a step from e_w1's adapters at tensor $np failed"; }
  curve "adapter_t$np" 1
done
same_training adapter_t1 adapter_t2 1e-6 2e-6

# Adapters on key/value heads copied over ranks: refused by key.
base=(--model llama-tiny --set model.n_kv_head=2 "${common[@]}" "${lora[@]}")
refused "adapters on copied key/value heads" \
  "[parallel] tensor = 4: [model] lora_target adapts k_proj and v_proj, whose 2 key/value heads are copied over 4 tensor-parallel ranks" \
  4 "$ZTRAIN" "${base[@]}" --set parallel.tensor=4 --set train.out_dir="$scratch/refused_kv" \
  "$SRC/configs/run.toml"
train_run l_t4_qo 4 4 2 --set parallel.tensor=4 --set 'model.lora_target="q_proj,o_proj"'
train_run l_w1_qo 1 4 2 --set 'model.lora_target="q_proj,o_proj"'
same_training l_w1_qo l_t4_qo 1e-6 4e-6
echo "PASS"
