#!/usr/bin/env bash
# `ztrain --llamafactory`: LLaMA-Factory's published training YAMLs
# (tests/data/llamafactory/lf_repo, verbatim but for model_name_or_path,
# which names a small Llama the script trains and saves), run from the
# checkout's root as `llamafactory-cli train` runs them.
# - As published they train with the template they name (qwen3_nothink,
#   LLaMA-Factory's own, which ztrain builds); a template ztrain does not
#   build is refused before anything runs, naming the YAML's place.
# - qwen3_lora_sft.yaml: LoRA on identity and alpaca_en_demo from data/,
#   the header saying what trains and what the YAML's no-op keys do not do;
#   `ztrain config --llamafactory` shows each key's YAML place.
# - qwen3_full_sft.yaml names examples/deepspeed/ds_z3_config.json: zero3,
#   its "auto" batch filled from the YAML; at world 2 (1 a device x 2
#   accumulation) it trains what world 1 with accumulation 4 trains, in
#   bf16, within 2e-4 and 4e-3 (sums in other orders, rounded to bf16);
#   with its ZeRO-3 offload config (ds_z3_offload_config.json) as well.
# - qwen3_lora_pretrain.yaml: stage pt, c4_demo's documents packed into
#   blocks as LLaMA-Factory packs them (held to it in
#   test_pretrain_encoding); with its 16 workers each of the ten documents
#   is packed alone, leaving fewer blocks.
# - On a base with no chat template, the export ships the named template as
#   the Jinja LLaMA-Factory writes for it; `ztrain sample --chat` uses it.
# - qwen3_preprocess.yaml: tokenized_path saved by one run, loaded by the
#   next (the same losses); `ztrain prepare --dataset` saves them ahead for
#   the LoRA YAML; another cutoff_len is refused against them.
# - A hub name as model_name_or_path is refused with the download command.
#
# usage: test_llamafactory.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

base_model="$scratch/base"
chat_model "$base_model"

repo="$scratch/LLaMA-Factory"
cp -r "$SRC/tests/data/llamafactory/lf_repo" "$repo"
cp "$SRC/tests/data/llamafactory/alpaca_en_demo.json" "$repo/data/"
for f in "$repo"/examples/*/*.yaml; do
  sed -i "s|^model_name_or_path: .*|model_name_or_path: $base_model|" "$f"
done
cd "$repo"

lora=examples/train_lora/qwen3_lora_sft.yaml
sed "s|^template: .*|template: mistral|" "$lora" > mistral.yaml
"$ZTRAIN" --llamafactory mistral.yaml > "$scratch/refused.out" 2>&1 && fail "an unbuilt template was not refused"
grep -qF "mistral.yaml:14:11: template: [data] template \"mistral\" is not one of LLaMA-Factory's templates ztrain builds (llama3, qwen, qwen3, qwen3_nothink" \
  "$scratch/refused.out" || fail "the template's refusal does not name it: $(cat "$scratch/refused.out")"

short=(--set train.steps=3 --set train.log_every=1 --set train.checkpoint_every=0
  --set device.threads=1)
"$ZTRAIN" --llamafactory "$lora" "${short[@]}" --set train.out_dir="$scratch/lora" \
  > "$scratch/lora.out" 2>&1 || { cat "$scratch/lora.out" >&2; fail "the LoRA YAML did not train"; }
cat "$scratch/lora.out"
grep -q "data sft identity, alpaca_en_demo: " "$scratch/lora.out" || fail "the YAML's datasets are not the run's"
grep -qF "template LLaMA-Factory's 'qwen3_nothink'" "$scratch/lora.out" ||
  fail "the YAML's template is not the run's"
grep -q "^ddp: trains [0-9]* parameters in 28 tensors under the strategy" "$scratch/lora.out" ||
  fail "the YAML's LoRA is not the run's"
grep -qF "$lora:3:20: trust_remote_code: no effect" "$scratch/lora.out" ||
  fail "a key with no effect is not said"
grep -q "^precision: bf16 working weights" "$scratch/lora.out" || fail "bf16: true is not the run's"
[ -f "$scratch/lora/adapter/adapter_model.safetensors" ] || fail "the LoRA run wrote no PEFT adapter"
"$ZTRAIN" config --llamafactory "$lora" > "$scratch/config.out" 2>&1 ||
  fail "ztrain config --llamafactory failed"
grep -qF "lr = 1e-04  # $lora:32:16: learning_rate" "$scratch/config.out" ||
  fail "ztrain config does not show learning_rate's place: $(grep "^lr" "$scratch/config.out")"
grep -qF "weight_decay = 0.0  # $lora: weight_decay absent (LLaMA-Factory's default)" "$scratch/config.out" ||
  fail "ztrain config does not show the default it took"

# A base model with no chat template, trained under the YAML's named
# template: the export ships that template as the Jinja LLaMA-Factory
# writes for it, so `ztrain sample --chat` talks to the model as trained.
cp -r "$base_model" "$scratch/bare_base"
rm "$scratch/bare_base/chat_template.jinja"
sed "s|^model_name_or_path: .*|model_name_or_path: $scratch/bare_base|" "$lora" > bare.yaml
"$ZTRAIN" --llamafactory bare.yaml "${short[@]}" --set train.out_dir="$scratch/bare" > "$scratch/bare.out" 2>&1 ||
  { cat "$scratch/bare.out" >&2; fail "the LoRA YAML on a base without a template did not train"; }
python3 - "$SRC/tests/data/llamafactory/template_golden.json" "$scratch/bare/chat_template.jinja" << 'PY' ||
import json, sys
want = json.load(open(sys.argv[1]))["jinja"]["qwen3_nothink"] + "\n"
sys.exit(0 if open(sys.argv[2]).read() == want else 1)
PY
  fail "the export does not ship qwen3_nothink as LLaMA-Factory writes it"
"$ZTRAIN" sample "$scratch/bare" --chat "hi" --max-tokens 2 > "$scratch/bare_sample.out" 2>&1 ||
  { cat "$scratch/bare_sample.out" >&2; fail "sample --chat failed on the export"; }

# qwen3_preprocess.yaml: its tokenized_path is saved by the first run and
# loaded by the next (the same training); `ztrain prepare` saves the same
# examples ahead, which the LoRA YAML then loads; a changed cutoff_len is
# refused against them.
pre=examples/train_lora/qwen3_preprocess.yaml
"$ZTRAIN" --llamafactory "$pre" "${short[@]}" --set train.out_dir="$scratch/pre1" > "$scratch/pre1.out" 2>&1 ||
  { cat "$scratch/pre1.out" >&2; fail "the preprocessing YAML did not train"; }
[ -f saves/qwen3-4b/dataset/sft/tokenized.json ] || fail "the YAML's tokenized_path was not saved"
"$ZTRAIN" --llamafactory "$pre" "${short[@]}" --set train.out_dir="$scratch/pre2" > "$scratch/pre2.out" 2>&1 ||
  { cat "$scratch/pre2.out" >&2; fail "the saved tokenized_path did not load"; }
curve pre1 3
curve pre2 3
same_training pre1 pre2 0 0
"$ZTRAIN" prepare --dataset-dir data --dataset identity,alpaca_en_demo --template qwen3_nothink \
  --cutoff-len 2048 --max-samples 1000 --out "$scratch/prepared" "$base_model" > "$scratch/prepare.out" 2>&1 ||
  { cat "$scratch/prepare.out" >&2; fail "ztrain prepare --dataset failed"; }
grep -q "^prepare: 95 examples (0 bad rows), .*saved in $scratch/prepared" "$scratch/prepare.out" ||
  fail "prepare did not say what it saved: $(cat "$scratch/prepare.out")"
"$ZTRAIN" --llamafactory "$lora" "${short[@]}" --set train.out_dir="$scratch/lora_prepared" \
  --set data.tokenized_path="\"$scratch/prepared\"" > "$scratch/lora_prepared.out" 2>&1 ||
  { cat "$scratch/lora_prepared.out" >&2; fail "the LoRA YAML did not train on prepare's examples"; }
curve lora 3
curve lora_prepared 3
same_training lora lora_prepared 0 0
"$ZTRAIN" --llamafactory "$lora" "${short[@]}" --set data.cutoff_len=1024 --set model.seq_len=1023 \
  --set data.tokenized_path="\"$scratch/prepared\"" > "$scratch/stale.out" 2>&1 &&
  fail "examples saved at another cutoff_len were loaded"
grep -qF "[data] cutoff_len was 2048 when they were saved, and is 1024 now" "$scratch/stale.out" ||
  fail "the stale examples' refusal does not name cutoff_len: $(tail -2 "$scratch/stale.out")"

# qwen3_lora_pretrain.yaml: stage pt on c4_demo, packed into 2048-token
# blocks; with one preprocessing worker the ten documents are packed
# together, with its 16 each alone (ten shards), each dropping its own
# remainder as LLaMA-Factory's does: fewer blocks.
cp "$SRC/tests/data/llamafactory/c4_demo.jsonl" data/
echo '{"eos_token": "<|endoftext|>"}' > "$base_model/tokenizer_config.json"
pt=examples/train_lora/qwen3_lora_pretrain.yaml
"$ZTRAIN" --llamafactory "$pt" "${short[@]}" --set train.out_dir="$scratch/pt" \
  --set data.preprocessing_num_workers=1 > "$scratch/pt.out" 2>&1 ||
  { cat "$scratch/pt.out" >&2; fail "the pretraining YAML did not train"; }
grep -q "data pt c4_demo: [0-9]* blocks of 2048 tokens" "$scratch/pt.out" ||
  fail "the pretraining YAML's blocks are not the run's: $(grep "^ztrain" "$scratch/pt.out")"
grep -q "^step 3/" "$scratch/pt.out" || fail "the pretraining run did not reach step 3"
"$ZTRAIN" --llamafactory "$pt" "${short[@]}" --set train.out_dir="$scratch/pt16" > "$scratch/pt16.out" 2>&1 ||
  { cat "$scratch/pt16.out" >&2; fail "the pretraining YAML as published did not train"; }
blocks() { sed -n 's/.*data pt c4_demo: \([0-9]*\) blocks.*/\1/p' "$scratch/$1.out"; }
[ "$(blocks pt16)" -lt "$(blocks pt)" ] ||
  fail "sixteen shards, each document packed alone, kept as many blocks ($(blocks pt16)) as one ($(blocks pt))"

full=examples/train_full/qwen3_full_sft.yaml
steps=3
lf_run() {  # lf_run NAME RANKS [ARGS...]
  local name=$1 np=$2
  shift 2
  on_ranks "$np" "$ZTRAIN" --llamafactory "$full" "${short[@]}" --set train.out_dir="$scratch/$name" \
    --set train.save_final=false "$@" > "$scratch/$name.out" 2>&1 ||
    { cat "$scratch/$name.out" >&2; fail "run $name failed"; }
  curve "$name" "$steps"
}
lf_run full_w2 2
grep -q "strategy zero3" "$scratch/full_w2.out" || fail "the YAML's deepspeed config did not choose zero3"
grep -q "^batch: 1 x 2 accum x 2 ranks = 4 sequences" "$scratch/full_w2.out" ||
  fail "the DeepSpeed config's auto batch is not the YAML's: $(grep "^batch" "$scratch/full_w2.out")"
lf_run full_w1 1 --set train.grad_accum=4
same_training full_w1 full_w2 2e-4 4e-3
# The same YAML with the choice its comment offers for ZeRO-3 with CPU
# offload (ds_z3_offload_config.json, LLaMA-Factory's own): cpu_offload at
# stage 3 with parameters and optimizer in host memory, the same training.
sed "s|ds_z3_config.json|ds_z3_offload_config.json|" "$full" > offload.yaml
full=offload.yaml
lf_run offload_w2 2
grep -q "strategy cpu_offload" "$scratch/offload_w2.out" ||
  fail "ds_z3_offload_config.json did not choose cpu_offload: $(grep -m1 "strategy" "$scratch/offload_w2.out")"
"$ZTRAIN" config --llamafactory offload.yaml > "$scratch/offload_config.out" 2>&1 ||
  fail "ztrain config --llamafactory offload.yaml failed"
grep -q "^stage = 3 " "$scratch/offload_config.out" &&
  grep -q '^offload_param.device = "cpu"' "$scratch/offload_config.out" ||
  fail "the offload config is not stage 3 with its parameters on the CPU: $(sed -n '/^\[strategy\]/,/^\[/p' "$scratch/offload_config.out")"
same_training full_w1 offload_w2 2e-4 4e-3

sed "s|^model_name_or_path: .*|model_name_or_path: Qwen/Qwen3-4B-Instruct-2507|" "$lora" > hub.yaml
"$ZTRAIN" --llamafactory hub.yaml > "$scratch/hub.out" 2>&1 && fail "a hub model name was not refused"
grep -qF "huggingface-cli download Qwen/Qwen3-4B-Instruct-2507 --local-dir DIR" "$scratch/hub.out" ||
  fail "the hub name's refusal does not say how to download it"
echo "PASS test_llamafactory"
