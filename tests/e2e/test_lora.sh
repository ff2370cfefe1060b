#!/usr/bin/env bash
# Fine-tuning methods beside full training: LoRA ([model] finetuning_type =
# "lora") and freeze, on LLaMA-Factory's datasets from a small Llama the
# script first trains and saves (as test_sft.sh).
# - LoRA: the header says what trains and what is frozen; the loss falls;
#   the out directory holds the merged model (loadable as the base was)
#   and PEFT's adapter (adapter/adapter_model.safetensors under PEFT's
#   names, adapter_config.json); `ztrain sample` answers from the merge.
# - zero3 shards the frozen base (a rank's params peak at world 4 under
#   0.6 of world 1's), gathering it within the strategy's
#   max_live_parameters (a smaller one, a smaller estimated peak).
# - Equivalence, the contract: micro 2 x accumulation 2 at world 1 against
#   world 2 under ddp, zero1, zero2, zero3, cpu_offload and nvme_offload
#   and world 4 under zero3: losses and gradient norms within 1e-6 and
#   4e-6 per step (the sums only grouped otherwise); in bf16, world 2
#   under zero2 against world 1 within 2e-4 and 4e-3.
# - Checkpoints hold the adapters alone (the manifest marks the base
#   frozen, its files a few times the adapters' 12 bytes per element); one
#   of world 2 resumes at world 1 with the same later steps, the base read
#   from init_from again; `ztrain export` of the last checkpoint writes the
#   run's own merged weights, bit for bit.
# - freeze: only the last block trains; world 2 under zero3 reproduces
#   world 1.
# - Refused before step 1, naming the key: lora_dropout, an unknown
#   lora_target, a LoRA key without finetuning_type = "lora", an unknown
#   freeze module.
#
# usage: test_lora.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

base_model="$scratch/base"
chat_model "$base_model"

cat > "$scratch/lora.toml" << TOML
[model]
from = "$base_model"
finetuning_type = "lora"
lora_rank = 4
lora_alpha = 8

[data]
plugin = "sft"
dataset_dir = "$SRC/tests/data/llamafactory"
dataset = ["alpaca_en_demo", "glaive_toolcall_en_demo", "alpaca_history", "openai_messages"]

[train]
steps = 8
micro_batch_size = 2
grad_accum = 2
lr = 1e-2
warmup_steps = 2
eval_every = 0
log_every = 1
checkpoint_every = 4
save_final = true

[device]
threads = 1
TOML

steps=8
run() { toml_run "$scratch/lora.toml" "$@"; }  # run NAME RANKS MICRO ACCUM [ARGS...]

run w1 1 2 2
cat "$scratch/w1.out"
# 2 blocks x 7 projections, an A and a B each; the rest frozen.
grep -q "^ddp: trains [0-9]* parameters in 28 tensors under the strategy; [0-9]* frozen ones held whole on every rank" \
  "$scratch/w1.out" || fail "the header does not say what trains"
# The batches differ in what they train: the last four steps' mean below
# the first four's.
awk 'NR <= 4 { a += $2 } NR > 4 { b += $2 } END { exit !(b < a - 0.02) }' "$scratch/w1.curve" ||
  fail "the loss did not fall: $(cat "$scratch/w1.curve")"
for f in model.safetensors config.json tokenizer.json adapter/adapter_model.safetensors \
  adapter/adapter_config.json; do
  [ -f "$scratch/w1/$f" ] || fail "the out directory has no $f"
done
python3 - "$scratch/w1" "$base_model" << 'PY' || fail "the export is not a merged model and PEFT's adapter"
import json, struct, sys
def names(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return {k for k in json.loads(f.read(n)) if k != "__metadata__"}
out, base = sys.argv[1:]
assert names(out + "/model.safetensors") == names(base + "/model.safetensors")
adapter = names(out + "/adapter/adapter_model.safetensors")
assert len(adapter) == 28, adapter
assert "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight" in adapter, adapter
config = json.load(open(out + "/adapter/adapter_config.json"))
assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8, config
assert sorted(config["target_modules"]) == sorted(
    ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]), config
PY
cmp -s "$base_model/model.safetensors" "$scratch/w1/model.safetensors" &&
  fail "the merged weights are the base's: the adapters did not reach them"
"$ZTRAIN" sample "$scratch/w1" --chat "Hello" --max-tokens 4 > "$scratch/sample.out" 2>&1 ||
  fail "sample --chat on the merged model failed"

run accum 1 1 4
run w2 2 1 2
for strategy in zero1 zero2 zero3 cpu_offload; do
  run "w2_$strategy" 2 1 2 --strategy "$strategy"
done
disk_dir swap
run w2_nvme 2 1 2 --strategy zero3_nvme --set strategy.offload_optimizer.nvme_path="\"$swap\""
run w4_zero3 4 1 1 --strategy zero3
for name in accum w2 w2_zero1 w2_zero2 w2_zero3 w2_cpu_offload w2_nvme w4_zero3; do
  same_training w1 "$name" 1e-6 4e-6
done
# zero3 shards the frozen base as it shards its own parameters. Measured:
# a Llama of 9M frozen parameters (each block's matrices past the
# persistence threshold) at world 2 holds less of the params category a
# rank than at world 1, where the frozen copy is whole (the live cap keeps
# gathered blocks, so not half). Estimated: LoRA on llama-7b in bf16 over 8
# ranks, a rank's params under a quarter of zero2's, which keeps the base
# whole on every rank.
grep -q "frozen ones sharded over the ranks as the strategy shards its own" "$scratch/w4_zero3.out" ||
  fail "zero3 does not say it shards the frozen base"
wide=(--model llama-tiny --set model.n_layer=2 --set model.n_embd=512 --set model.n_head=8
  --set model.vocab_size=2048 --set model.seq_len=64 --set train.steps=1 --set train.eval_every=0
  --set train.save_final=false --set 'model.finetuning_type="lora"' --set train.global_batch_size=4
  --strategy zero3 --set device.threads=1)
for np in 1 2; do
  on_ranks "$np" "$ZTRAIN" "${wide[@]}" --set train.out_dir="$scratch/wide$np" "$SRC/configs/run.toml" \
    > "$scratch/wide$np.out" 2>&1 || fail "the wide LoRA run at world $np failed"
done
python3 - "$scratch/wide1/metrics.jsonl" "$scratch/wide2/metrics.jsonl" << 'PY' ||
import json, sys
def peak(path):
    steps = [j for j in map(json.loads, open(path)) if j["split"] == "train"]
    return steps[-1]["peak_bytes"]["device"]["params"]
whole, shard = peak(sys.argv[1]), peak(sys.argv[2])
print(f"params peak: world 1 {whole} bytes, world 2 under zero3 {shard} a rank")
assert shard < 0.95 * whole, (whole, shard)
PY
  fail "zero3's ranks hold the whole frozen base"
seven() { "$ZTRAIN" estimate --world 8 --model llama-7b --strategy "$1" --set 'model.finetuning_type="lora"' \
  --set train.global_batch_size=8 --set 'train.precision="bf16"' "$SRC/configs/run.toml" |
  awk '$1 == "device" && $2 == "params" { print $3 }'; }
z3=$(seven zero3)
z2=$(seven zero2)
echo "llama-7b LoRA over 8 ranks, params a rank: zero3 $z3 bytes, zero2 $z2"
[ "$z3" -lt $((z2 / 4)) ] || fail "zero3's estimate does not shard the frozen base"
run w1_bf16 1 2 2 --set train.precision=bf16
run w2_bf16 2 1 2 --set train.precision=bf16 --strategy zero2
same_training w1_bf16 w2_bf16 2e-4 4e-3

python3 - "$scratch/w2/step_4" << 'PY' || fail "the checkpoint does not hold the adapters alone"
import json, sys
m = json.load(open(sys.argv[1] + "/manifest.json"))
frozen = [p for p in m["params"] if p.get("frozen")]
trained = [p for p in m["params"] if not p.get("frozen")]
assert len(trained) == 28 and all(".lora_" in p["name"] for p in trained), trained
assert all(not p["pieces"] for p in frozen) and len(frozen) > 0, frozen
numel = lambda p: eval("*".join(map(str, p["shape"])) or "1")
adapters = sum(numel(p) for p in trained)
stored = sum(f["bytes"] for f in m["files"])
assert 12 * adapters <= stored <= 4 * 12 * adapters, (stored, adapters)
PY
"$ZTRAIN" checkpoint info "$scratch/w2/step_4" > "$scratch/info.out" 2>&1 ||
  fail "checkpoint info on a LoRA checkpoint failed"
grep -q "^  frozen      [0-9]* tensors, [0-9]* parameters, not stored: a resume reads them from \[model\] init_from" \
  "$scratch/info.out" || fail "checkpoint info does not say the base is not stored: $(cat "$scratch/info.out")"
tail -n 4 "$scratch/w2.curve" > "$scratch/w2_last4.curve"
on_ranks 1 "$ZTRAIN" --set train.out_dir="$scratch/resumed" --set train.micro_batch_size=2 \
  --resume="$scratch/w2/step_4" "$scratch/lora.toml" > "$scratch/resumed.out" 2>&1 ||
  { cat "$scratch/resumed.out" >&2; fail "resuming world 2's step 4 at world 1 failed"; }
curve resumed 4
same_training w2_last4 resumed 1e-6 2e-6
"$ZTRAIN" export "$scratch/w1/step_8" "$scratch/exported" > "$scratch/export.out" 2>&1 ||
  { cat "$scratch/export.out" >&2; fail "exporting the last checkpoint failed"; }
cmp "$scratch/w1/model.safetensors" "$scratch/exported/model.safetensors" ||
  fail "the checkpoint's export is not the run's merged weights"
cmp "$scratch/w1/adapter/adapter_model.safetensors" "$scratch/exported/adapter/adapter_model.safetensors" ||
  fail "the checkpoint's export is not the run's adapter"

# adapter_from: the run's PEFT adapter beside the base computes the run's
# merged model: with no update (lr 0), step 1's loss is the merged
# model's, fine-tuned in full.
steps=1
one_step=(--set train.steps=1 --set train.lr=0 --set train.warmup_steps=0
  --set train.checkpoint_every=0 --set train.save_final=false)
run from_adapter 1 2 2 "${one_step[@]}" --set "model.adapter_from=\"$scratch/w1/adapter\""
grep -qF "adapters from $scratch/w1/adapter" "$scratch/from_adapter.out" ||
  fail "the run does not say where its adapters came from"
sed -e "s|^from = .*|from = \"$scratch/w1\"|" -e '/^finetuning_type/d' -e '/^lora_/d' \
  "$scratch/lora.toml" > "$scratch/merged.toml"
on_ranks 1 "$ZTRAIN" --set train.out_dir="$scratch/merged" "${one_step[@]}" "$scratch/merged.toml" \
  > "$scratch/merged.out" 2>&1 || { cat "$scratch/merged.out" >&2; fail "the merged model's run failed"; }
curve merged 1
same_losses from_adapter merged 1e-6
steps=8

sed -e 's/^finetuning_type = "lora"/finetuning_type = "freeze"\nfreeze_trainable_layers = 1/' \
  -e '/^lora_/d' "$scratch/lora.toml" > "$scratch/freeze.toml"
freeze() { toml_run "$scratch/freeze.toml" "$@"; }  # freeze NAME RANKS MICRO ACCUM [ARGS...]
steps=4
freeze freeze_w1 1 2 2 --set train.steps=4
# Block 1's 9 tensors (two norms, seven projections) train.
grep -q "trains [0-9]* parameters in 9 tensors under the strategy" "$scratch/freeze_w1.out" ||
  fail "the freeze run does not train block 1 alone: $(grep trainable "$scratch/freeze_w1.out")"
python3 - "$scratch/freeze_w1/step_4/manifest.json" << 'PY' || fail "freeze did not train the last block alone"
import json, sys
m = json.load(open(sys.argv[1]))
trained = [p["name"] for p in m["params"] if not p.get("frozen")]
assert len(trained) == 9 and all(n.startswith("model.layers.1.") for n in trained), trained
PY
freeze freeze_w2 2 1 2 --set train.steps=4 --strategy zero3
same_training freeze_w1 freeze_w2 1e-6 4e-6

# configs/examples/lora_budget.toml, the README's budget: LoRA's estimate
# fits its 400 MiB, full training's does not.
total() { "$ZTRAIN" estimate "$@" "$SRC/configs/examples/lora_budget.toml" | awk '$2 == "total" { print $3 }'; }
lora_bytes=$(total)
full_bytes=$(total --set 'model.finetuning_type="full"')
echo "lora_budget.toml: LoRA $lora_bytes bytes, full $full_bytes bytes of 419430400"
[ "$lora_bytes" -lt 419430400 ] && [ "$full_bytes" -gt 419430400 ] ||
  fail "lora_budget.toml does not show LoRA fitting where full training does not"

refused() {  # refused WHAT TEXT ARGS...: the run refused before step 1, saying TEXT
  local what=$1 text=$2
  shift 2
  "$ZTRAIN" --set train.out_dir="$scratch/refused" "$@" > "$scratch/refused.out" 2>&1 &&
    fail "$what: the run was not refused"
  grep -qF -- "$text" "$scratch/refused.out" ||
    fail "$what: the refusal does not say \"$text\": $(cat "$scratch/refused.out")"
  grep -q "^step 1/" "$scratch/refused.out" && fail "$what: refused only after training began"
  echo "$what: refused"
}
refused "lora_dropout" "lora_dropout: ztrain's LoRA has no dropout" \
  --set model.lora_dropout=0.1 "$scratch/lora.toml"
refused "an unknown target" "lora_target: 'c_attn' is no projection of Llama's blocks" \
  --set 'model.lora_target="q_proj,c_attn"' "$scratch/lora.toml"
refused "a LoRA key without LoRA" "[model] lora_rank is a key of finetuning_type = \"lora\"" \
  --set model.lora_rank=8 "$scratch/freeze.toml"
refused "an adapter of another rank" "has r = 4, this run's [model] lora_rank gives 8; set lora_rank to the adapter's" \
  --set model.lora_rank=8 --set "model.adapter_from=\"$scratch/w1/adapter\"" "$scratch/lora.toml"
refused "an adapter of other targets" "does not hold this run's adapters" \
  --set 'model.lora_target="q_proj"' --set "model.adapter_from=\"$scratch/w1/adapter\"" "$scratch/lora.toml"
refused "an unknown freeze module" "'attn' is no module of the blocks; they are" \
  --set 'model.freeze_trainable_modules="attn"' "$scratch/freeze.toml"
# The frozen base follows the strategy's gather budget: a smaller
# max_live_parameters lowers a rank's parameter peak under zero3.
params_peak() {
  "$ZTRAIN" estimate --model llama-tiny --set 'model.finetuning_type="lora"' --set model.n_layer=4 \
    --set model.n_embd=256 --set model.n_head=4 --set strategy.max_live_parameters="$1" \
    --strategy zero3 --world 2 "$SRC/configs/run.toml" | awk '$1 == "device" && $2 == "params" { print $3 }'
}
wide=$(params_peak 1000000000)
tight=$(params_peak 2000000)
[ -n "$wide" ] && [ -n "$tight" ] && [ "$tight" -lt "$wide" ] ||
  fail "the frozen base ignores the strategy's max_live_parameters ($tight against $wide bytes)"

echo "PASS test_lora"
