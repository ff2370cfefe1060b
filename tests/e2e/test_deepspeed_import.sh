#!/usr/bin/env bash
# DeepSpeed configs, unchanged.
# - Both reference configs (configs/deepspeed, every batch, precision and
#   bucket key "auto") load: convert-deepspeed prints the [strategy] they
#   make, with "auto" resolved as the Hugging Face Trainer does (hidden =
#   n_embd 64: reduce_bucket_size 4096, prefetch 3686, persistence 640)
#   and each resolution said, above the whole run they make (the run
#   file's model and keys with DeepSpeed's merged, which trains as
#   --deepspeed does); the offload one at world 2 trains with the
#   losses of --strategy zero3_offload, and the plain one those of zero3.
# - A config with every supported key maps each onto its ztrain key
#   (checked in the resolved config.toml of a run, with the DeepSpeed key
#   as the value's origin), a --set wins over it, and a key with no effect
#   is a warning.
# - Errors naming the keys: fp16 and bf16 both enabled, offload_param below
#   stage 3, NVMe offload below stage 3, a batch that breaks
#   train_batch_size = micro x accumulation x world, a key that is not
#   DeepSpeed's, a value of the wrong type, --deepspeed with --strategy.
#
# usage: test_deepspeed_import.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

steps=8
base=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set train.steps="$steps" --set train.log_every=1 --set train.eval_every=0
  --set train.warmup_steps=2 --set device.threads=1 --set train.save_final=false)
ds=$SRC/configs/deepspeed

echo "== the reference configs"
"$ZTRAIN" convert-deepspeed "$ds/ds_z3_offload_config.json" "${base[@]}" "$SRC/configs/run.toml" \
  > "$scratch/offload.toml" 2>&1 || { cat "$scratch/offload.toml" >&2; fail "convert-deepspeed failed"; }
cat "$scratch/offload.toml"
python3 - "$scratch/offload.toml" << 'PY' || fail "the offload config converts wrongly"
import sys, tomllib
t = tomllib.load(open(sys.argv[1], "rb"))
s = t["strategy"]
assert s["plugin"] == "cpu_offload" and s["stage"] == 3, s
assert s["offload_optimizer"]["device"] == "cpu" and s["offload_param"]["device"] == "cpu", s
assert s["offload_optimizer"]["pin_memory"] is True and s["offload_param"]["pin_memory"] is True, s
assert s["reduce_bucket_size"] == 4096 and s["prefetch_bucket_size"] == 3686, s
assert s["param_persistence_threshold"] == 640, s
assert s["max_live_parameters"] == 10**9 and s["max_reuse_distance"] == 10**9, s
assert s["overlap_comm"] is True and s["contiguous_gradients"] is True, s
fp16 = t["train"]["fp16"]
assert fp16 == {"loss_scale": 0.0, "min_loss_scale": 1.0, "initial_scale_power": 16,
                "loss_scale_window": 1000, "hysteresis": 2}, fp16
# The whole run, not the DeepSpeed keys alone: the run file's model and
# --set values, the precision the run keeps ("auto").
assert t["train"]["precision"] == "fp32" and t["train"]["steps"] == 8, t["train"]
assert t["model"]["n_layer"] == 2 and t["model"]["n_embd"] == 64, t["model"]
PY
grep -q '^precision = "fp32"  # .*run.toml' "$scratch/offload.toml" ||
  fail "convert-deepspeed: the precision is not the run file's"
for said in "train_batch_size: auto -> the run's train.global_batch_size" \
  "zero_optimization.reduce_bucket_size: auto -> 4096 (hidden², hidden = n_embd 64)" \
  "stage3_param_persistence_threshold: auto -> 640 (10·hidden" \
  "warning: ds_z3_offload_config.json: zero_optimization.stage3_gather_16bit_weights_on_model_save has no effect" \
  "warning: ds_z3_offload_config.json: zero_optimization.sub_group_size has no effect in ztrain under cpu_offload"; do
  grep -qF -- "$said" "$scratch/offload.toml" || fail "convert-deepspeed does not say '$said'"
done

train_run() {  # train_run NAME ARGS...: 2 ranks into $scratch/NAME, its curve
  local name=$1
  shift
  "$ZTRAIN" --nproc 2 "${base[@]}" --set train.out_dir="$scratch/$name" "$@" "$SRC/configs/run.toml" \
    > "$scratch/$name.out" 2>&1 || { cat "$scratch/$name.out" >&2; fail "run $name failed"; }
  curve "$name" "$steps"
}
train_run ds_offload --deepspeed "$ds/ds_z3_offload_config.json"
train_run preset_offload --strategy zero3_offload
same_training preset_offload ds_offload 1e-6 2e-6
grep -qF "ds_z3_offload_config.json: zero_optimization.reduce_bucket_size: auto -> 4096" \
  "$scratch/ds_offload.out" || fail "the run header does not say what auto became"
grep -q "strategy cpu_offload" "$scratch/ds_offload.out" || fail "the run is not under cpu_offload"
# An optimizer's "auto" values are the run's, and the notes say which.
printf '{"optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}}' \
  > "$scratch/auto_adamw.json"
"$ZTRAIN" convert-deepspeed "$scratch/auto_adamw.json" "${base[@]}" --set train.lr=0.002 "$SRC/configs/run.toml" \
  > "$scratch/auto_adamw.toml" 2>&1 || { cat "$scratch/auto_adamw.toml" >&2; fail "convert-deepspeed of auto AdamW failed"; }
for said in "optimizer.params.lr: auto -> the run's train.lr (0.002)" \
  "optimizer.params.betas: auto -> the run's train.betas ([0.9, 0.95])" \
  "optimizer.params.eps: auto -> the run's train.eps (1e-08)" \
  "optimizer.params.weight_decay: auto -> the run's train.weight_decay (0.1)"; do
  grep -qF -- "$said" "$scratch/auto_adamw.toml" || fail "convert-deepspeed does not say '$said'"
done

# The converted file is a whole run: it trains what --deepspeed trains.
"$ZTRAIN" --nproc 2 --set train.out_dir="$scratch/converted" "$scratch/offload.toml" \
  > "$scratch/converted.out" 2>&1 || { cat "$scratch/converted.out" >&2; fail "the converted run failed"; }
curve converted "$steps"
same_training ds_offload converted 0 0
train_run ds_z3 --deepspeed "$ds/ds_z3_config.json"
train_run preset_z3 --strategy zero3
same_training preset_z3 ds_z3 1e-6 2e-6

echo "== every supported key"
cat > "$scratch/full.json" << 'EOF'
{
  "train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
  "gradient_clipping": 0.5, "steps_per_print": 2,
  "bf16": {"enabled": true},
  "fp16": {"enabled": false, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 50,
           "hysteresis": 3, "consecutive_hysteresis": true, "min_loss_scale": 2},
  "optimizer": {"type": "AdamW", "params": {"lr": 0.002, "betas": [0.8, 0.9], "eps": 1e-7,
                                            "weight_decay": 0.05}},
  "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 3, "total_num_steps": 8,
                                                    "warmup_max_lr": 0.002, "warmup_min_lr": 0}},
  "zero_optimization": {
    "stage": 3, "overlap_comm": false, "contiguous_gradients": true, "reduce_bucket_size": 5e4,
    "stage3_prefetch_bucket_size": 7e4, "stage3_param_persistence_threshold": 100,
    "stage3_max_live_parameters": 2e6, "stage3_max_reuse_distance": 3e6, "sub_group_size": 4000,
    "offload_optimizer": {"device": "nvme", "nvme_path": "SWAP", "buffer_count": 3, "pin_memory": true},
    "offload_param": {"device": "cpu", "pin_memory": true}
  },
  "aio": {"block_size": 262144, "queue_depth": 4, "single_submit": true, "overlap_events": true,
          "thread_count": 1},
  "wall_clock_breakdown": false
}
EOF
disk_dir swap
sed -i "s|SWAP|$swap|" "$scratch/full.json"
# The model's keys only: the training keys come from the DeepSpeed config,
# but a --set still wins over it (the scheduler's peak lr). The run's
# length is the run's: total_num_steps is only the scheduler's.
model_only=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set device.threads=1 --set train.save_final=false --set train.eval_every=0)
"$ZTRAIN" --nproc 2 "${model_only[@]}" --deepspeed "$scratch/full.json" \
  --set train.scheduler.warmup_max_lr=0.001 --set train.steps=8 \
  --set train.out_dir="$scratch/full" "$SRC/configs/run.toml" > "$scratch/full.out" 2>&1 || { cat "$scratch/full.out" >&2; fail "the full config does not train"; }
grep -q "batch: 2 x 4 accum x 2 ranks = 16 sequences" "$scratch/full.out" || fail "the batch keys were not applied"
grep -q "warning: full.json: wall_clock_breakdown has no effect in ztrain" "$scratch/full.out" ||
  fail "no warning for a key without effect"
grep -q "warning: full.json: optimizer.params.lr has no effect: DeepSpeed's WarmupDecayLR sets the lr" \
  "$scratch/full.out" || fail "no warning that WarmupDecayLR replaces the optimizer's lr"
python3 - "$scratch/full/config.toml" << 'PY' || fail "the resolved config does not hold every key"
import sys, tomllib
text = open(sys.argv[1]).read()
t = tomllib.loads(text)
tr, s = t["train"], t["strategy"]
want_train = {"global_batch_size": 16, "micro_batch_size": 2, "grad_accum": 4, "grad_clip": 0.5,
              "print_every": 2, "precision": "bf16", "betas": [0.8, 0.9], "eps": 1e-7,
              "weight_decay": 0.05, "schedule": "WarmupDecayLR", "steps": 8}
for k, v in want_train.items():
    assert tr[k] == v, (k, tr[k], v)
assert tr["scheduler"] == {**tr["scheduler"], "warmup_num_steps": 3, "total_num_steps": 8,
                           "warmup_max_lr": 0.001, "warmup_min_lr": 0}, tr["scheduler"]
assert tr["fp16"]["initial_scale_power"] == 12 and tr["fp16"]["hysteresis"] == 3
assert tr["fp16"]["consecutive_hysteresis"] is True and tr["fp16"]["min_loss_scale"] == 2
want_strategy = {"plugin": "nvme_offload", "overlap_comm": False, "reduce_bucket_size": 50000,
                 "prefetch_bucket_size": 70000, "param_persistence_threshold": 100,
                 "max_live_parameters": 2000000, "max_reuse_distance": 3000000,
                 "sub_group_size": 4000}
for k, v in want_strategy.items():
    assert s[k] == v, (k, s[k], v)
assert s["offload_optimizer"]["buffer_count"] == 3 and s["offload_param"]["device"] == "cpu"
assert s["aio"] == {**s["aio"], "block_size": 262144, "queue_depth": 4, "single_submit": True,
                    "intra_op_parallelism": 1}, s["aio"]
assert "--set train.scheduler.warmup_max_lr=0.001" in text, "the --set is not the origin"
for origin in ("full.json: zero_optimization.stage", "full.json: optimizer.params.betas",
               "full.json: aio.thread_count", "full.json: bf16.enabled"):
    assert origin in text, origin
print("every key in the resolved config, with its DeepSpeed origin")
PY
[ -z "$(ls -A "$swap")" ] || fail "swap files left in $swap"

echo "== errors name the keys"
refused() {  # refused WHAT EXPECTED JSON [ARGS...]
  local what=$1 want=$2 json=$3 status=0
  shift 3
  echo "$json" > "$scratch/bad.json"
  "$ZTRAIN" --nproc 2 "${base[@]}" --deepspeed "$scratch/bad.json" --set train.out_dir="$scratch/bad" "$@" \
    "$SRC/configs/run.toml" > "$scratch/bad.out" 2>&1 || status=$?
  [ "$status" -ne 0 ] || fail "$what: accepted"
  grep -qF -- "$want" "$scratch/bad.out" || { cat "$scratch/bad.out" >&2; fail "$what: '$want' not said"; }
  echo "$what: refused"
}
refused "fp16 and bf16" "bad.json: fp16.enabled and bad.json: bf16.enabled are both true" \
  '{"fp16": {"enabled": true}, "bf16": {"enabled": true}}'
refused "offload_param below stage 3" \
  'bad.json: zero_optimization.offload_param.device is "cpu" but bad.json: zero_optimization.stage is 2' \
  '{"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}'
refused "NVMe below stage 3" \
  'bad.json: zero_optimization.offload_optimizer.device is "nvme" but bad.json: zero_optimization.stage is 1' \
  '{"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "nvme"}}}'
refused "the batch identity" "bad.json: train_batch_size" \
  '{"train_batch_size": 10, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}'
refused "a key that is not DeepSpeed's" "bad.json: zero_optimization.stage3_prefetch_size is not a DeepSpeed key" \
  '{"zero_optimization": {"stage": 3, "stage3_prefetch_size": 5}}'
refused "a wrong type" 'bad.json: zero_optimization.reduce_bucket_size is 1.5; expected an integer' \
  '{"zero_optimization": {"stage": 2, "reduce_bucket_size": 1.5}}'
refused "--deepspeed with --strategy" "drop --strategy zero2" '{}' --strategy zero2
# The mesh's degrees land on [parallel]: Ulysses' on sequence, trained
# over both ranks (the same training as the preset with [parallel]
# sequence), refused where it does not divide them; AutoTP's on tensor,
# trained as the preset with [parallel] tensor trains.
echo '{"zero_optimization": {"stage": 2}, "sequence_parallel_size": 2}' > "$scratch/ulysses.json"
train_run ds_ulysses --deepspeed "$scratch/ulysses.json"
train_run preset_ulysses --strategy zero2 --set parallel.sequence=2
same_training preset_ulysses ds_ulysses 0 0
grep -qF "mesh: sequence 2: each sequence split over 2 ranks" "$scratch/ds_ulysses.out" ||
  fail "sequence_parallel_size did not split the sequences"
refused "Ulysses' degree beyond the ranks" \
  "bad.json: sequence_parallel_size: [parallel] tensor x sequence x context x pipeline = 4 ranks per copy of the model do not divide the world of 2 ranks" \
  '{"zero_optimization": {"stage": 2}, "sequence_parallel_size": 4}'
echo '{"zero_optimization": {"stage": 1}, "tensor_parallel": {"autotp_size": 2}}' > "$scratch/autotp.json"
train_run ds_autotp --deepspeed "$scratch/autotp.json"
train_run preset_tensor --strategy zero1 --set parallel.tensor=2
same_training preset_tensor ds_autotp 0 0
grep -qF "mesh: tensor 2: each block's projections split over tensor groups 0-1" "$scratch/ds_autotp.out" ||
  fail "tensor_parallel.autotp_size did not split the blocks"
refused "AutoTP's degree beyond the heads" \
  "bad.json: tensor_parallel.autotp_size: [parallel] tensor = 2: [model] n_head (attention heads) = 1 does not divide into 2 equal parts" \
  '{"zero_optimization": {"stage": 1}, "tensor_parallel": {"autotp_size": 2}}' --set model.n_head=1
refused "a tensor_parallel key ztrain does not know" "bad.json: tensor_parallel.tp_grain_size is not a DeepSpeed key" \
  '{"tensor_parallel": {"autotp_size": 1, "tp_grain_size": 64}}'
