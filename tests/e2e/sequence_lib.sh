# Sourced by the mesh tests (sequence, context, tensor and pipeline
# parallelism) after lib.sh: the small runs they compare with ddp at world
# 1, and the checks they share.

steps=10
common=(--set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set train.steps="$steps" --set train.log_every=1
  --set train.eval_every=10 --set train.warmup_steps=5 --set device.threads=1
  --set train.save_final=false)

# same_val_loss REF OTHER...: each OTHER's val loss within 1e-6 (relative)
# of REF's (evaluation splits its sequences as training does).
same_val_loss() {
  local ref=$1 other a b
  shift
  a=$(metrics_fields "$scratch/$ref/metrics.jsonl" val loss)
  for other in "$@"; do
    b=$(metrics_fields "$scratch/$other/metrics.jsonl" val loss)
    [ -n "$a" ] && [ -n "$b" ] || fail "$ref or $other logged no val loss"
    awk -v a="$a" -v b="$b" 'BEGIN { d = (a - b) / a; if (d < 0) d = -d; exit !(d <= 1e-6) }' ||
      fail "$other's val loss $b is not $ref's $a"
  done
}

# peak_bytes NAME CATEGORY: the device's peak of CATEGORY in NAME's last
# training step.
peak_bytes() {
  grep '"split": "train"' "$scratch/$1/metrics.jsonl" | tail -n 1 |
    sed -n "s/.*\"device\": {[^}]*\"$2\": \([0-9]*\).*/\1/p"
}

# from_weights NAME RANKS WEIGHTS ARGS...: one step of ${base[@]} ARGS on
# RANKS ranks from $scratch/WEIGHTS ([model] init_from), into
# $scratch/NAME and its curve.
from_weights() {
  local name=$1 np=$2 weights=$3
  shift 3
  on_ranks "$np" "$ZTRAIN" "${base[@]}" --set train.steps=1 --set train.save_final=false \
    --set model.init_from="$scratch/$weights" --set train.out_dir="$scratch/$name" "$@" \
    "$SRC/configs/run.toml" > "$scratch/$name.out" 2>&1 ||
    { cat "$scratch/$name.out" >&2; fail "a step from $weights's weights ($name) failed"; }
  curve "$name" 1
}

# estimated_as_measured NAME WORLD ARGS...: `ztrain estimate --world WORLD
# ARGS configs/run.toml` says the bytes of parameters, optimizer state and
# activations a rank of NAME measured (its output kept in
# $scratch/NAME.estimate).
estimated_as_measured() {
  local name=$1 world=$2 category estimated
  shift 2
  "$ZTRAIN" estimate --world "$world" "$@" "$SRC/configs/run.toml" > "$scratch/$name.estimate" 2>&1 ||
    { cat "$scratch/$name.estimate" >&2; fail "estimate as $name failed"; }
  for category in params optimizer activations; do
    estimated=$(awk -v c="$category" '$1 == "device" && $2 == c { print $3 }' "$scratch/$name.estimate")
    [ "$estimated" = "$(peak_bytes "$name" "$category")" ] ||
      fail "estimate as $name says $estimated bytes of $category a rank, a rank measured $(peak_bytes "$name" "$category")"
  done
}

# peak_activations NAME [TIER]: the worst rank's peak bytes of activations
# in TIER (device by default) in the last training step of $scratch/NAME.
peak_activations() {
  grep '"split": "train"' "$scratch/$1/metrics.jsonl" | tail -n 1 |
    sed -n "s/.*\"${2:-device}\": {[^}]*\"activations\": \([0-9]*\).*/\1/p"
}

# refused WHAT TEXT RANKS COMMAND...: COMMAND on RANKS ranks must fail,
# saying TEXT.
refused() {
  local what=$1 text=$2
  shift 2
  on_ranks "$@" > "$scratch/refused.out" 2>&1 &&
    { cat "$scratch/refused.out" >&2; fail "$what: the run was not refused"; }
  grep -qF -- "$text" "$scratch/refused.out" ||
    { cat "$scratch/refused.out" >&2; fail "$what: the refusal does not say \"$text\""; }
}

# split_activations KEY MAX: a 4096-token Llama (8 layers, 4 heads of 32,
# the head's chunk 256 tokens) trained one step whole and with [parallel]
# KEY = 4: each run's measured activations must be what `ztrain estimate`
# says, and a rank at 4 must hold between a quarter and MAX (a fraction)
# of the whole's: what is not divided is the split's scratch, which the
# layers share, and the head's chunk of logits.
split_activations() {
  local key=$1 max=$2 n estimated whole quarter
  local mem=(--model llama-tiny --set model.n_kv_head=4 --set model.n_layer=8
    --set model.seq_len=4096 --set model.loss_chunk_tokens=256 --set train.steps=1
    --set train.global_batch_size=1 --set train.eval_every=0 --set device.threads=1
    --set train.save_final=false)
  for n in 1 4; do
    on_ranks "$n" "$ZTRAIN" "${mem[@]}" --set parallel."$key"=$n \
      --set train.out_dir="$scratch/mem_${key}_$n" "$SRC/configs/run.toml" \
      > "$scratch/mem_${key}_$n.out" 2>&1 || fail "the 4096-token run at $key $n failed"
    estimated=$("$ZTRAIN" estimate --world "$n" "${mem[@]}" --set parallel."$key"=$n \
      "$SRC/configs/run.toml" | awk '$1 == "device" && $2 == "activations" { print $3 }')
    [ "$estimated" = "$(peak_activations "mem_${key}_$n")" ] ||
      fail "$key $n: the estimate's activations ($estimated) are not the measured $(peak_activations "mem_${key}_$n")"
  done
  whole=$(peak_activations "mem_${key}_1") quarter=$(peak_activations "mem_${key}_4")
  echo "activations of 4096 tokens: $whole bytes whole, $quarter per rank at $key 4"
  awk -v w="$whole" -v q="$quarter" -v m="$max" 'BEGIN { exit !(q >= 0.25 * w && q <= m * w) }' ||
    fail "$key 4 holds $quarter bytes of activations per rank, not between a quarter and $max of $whole"
}

# compared_on_mesh STRATEGIES PARALLEL MESH ARGS...: `ztrain compare
# --strategies STRATEGIES --parallel PARALLEL` of ${base[@]} ARGS on 2
# ranks runs every job on the mesh (each job's log says "mesh: " and the
# mesh's first words), names it MESH in compare.json, and finds the
# strategies equivalent.
compared_on_mesh() {
  local strategies=$1 parallel=$2 mesh=$3 job
  shift 3
  "$ZTRAIN" compare --strategies "$strategies" --nproc 2 --steps 3 --parallel "$parallel" \
    --out "$scratch/compare" "${base[@]}" "$@" "$SRC/configs/run.toml" > "$scratch/compare.out" 2>&1 ||
    { cat "$scratch/compare.out" >&2; fail "compare --parallel $parallel failed"; }
  for job in ${strategies//,/ }; do
    grep -q "mesh: ${mesh%% (*}" "$scratch/compare/$job.log" ||
      fail "compare's $job job did not run on ${mesh%% (*}"
  done
  grep -qF "\"mesh\": \"$mesh\"" "$scratch/compare/compare.json" ||
    fail "compare.json does not name the mesh $mesh"
  grep -q "^verdict: equivalent" "$scratch/compare.out" ||
    { cat "$scratch/compare.out" >&2; fail "compare --parallel $parallel: no equivalence verdict"; }
}
