#!/usr/bin/env bash
# Every rank runs rank 0's run, and what the ranks cannot share is checked.
# Rank 0 alone reads the run file, its presets, the --set overrides and a
# DeepSpeed config; two ranks started separately, the second in a
# directory without any of them and with other arguments, train rank 0's
# run (the losses of a world-1 run of it), torchrun-style (gloo) and
# under mpirun (MPMD). When rank 0 cannot read the run, both ranks stop
# with its error. Ranks that load different builds of a plugin stop,
# naming it (a byte-identical copy under another path agrees); so do ranks
# whose data files (the same path in different working directories)
# differ or are missing on one host. Initial weights (init_from) that only
# rank 0's host has reach the other ranks from rank 0, each receiving the
# ranges its strategy holds, and train as a world-1 run from the same file;
# on a shared path each rank reads its own ranges. A checkpoint only rank
# 0's host has resumes the same way.
#
# usage: test_rank_agreement.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

common=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set train.steps=3 --set train.eval_every=0 --set device.threads=1)

# env_pair NAME RANK1_ARGS...: rank 0 with the common arguments, ${only0[@]}
# and $run0, rank 1 with the common arguments, RANK1_ARGS and $run1,
# started in $dir0 and $dir1; their exit statuses in $s0 and $s1.
dir0=$PWD dir1=$PWD run0=$SRC/configs/run.toml run1=$SRC/configs/run.toml only0=()
env_pair() {
  local name=$1 p0 p1
  shift
  reserve_port
  (cd "$dir0" && RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$ZTRAIN" \
    "${common[@]}" "${only0[@]}" --set train.out_dir="$scratch/$name" "$run0") \
    > "$scratch/$name.0.out" 2>&1 &
  p0=$!
  (cd "$dir1" && RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$ZTRAIN" \
    "${common[@]}" --set train.out_dir="$scratch/$name" "$@" "$run1") \
    > "$scratch/$name.1.out" 2>&1 &
  p1=$!
  spawned+=("$p0" "$p1")
  exit_within "$p0" 60
  s0=$status
  exit_within "$p1" 60
  s1=$status
}

# both_exited NAME CODE: both ranks of NAME exited CODE (else their output).
both_exited() {
  [ "$s0" -eq "$2" ] && [ "$s1" -eq "$2" ] ||
    { cat "$scratch/$1".*.out >&2; fail "$1: exits $s0 and $s1, not $2 and $2"; }
}
# said NAME RANK PATTERN WHAT: rank RANK of NAME said PATTERN (grep), else
# its output and "NAME: WHAT".
said() {
  grep -q "$3" "$scratch/$1.$2.out" || { cat "$scratch/$1.$2.out" >&2; fail "$1: $4"; }
}

# The run from rank 0: run.toml and the preset it is run with
# (strategies/sharded.toml: zero3 gathering every parameter) are in host0's
# directory only; rank 1 starts in host1's, which has neither, asking for
# another shape, strategy and length. Both train rank 0's run: the losses
# and norms of a world-1 run of it, and rank 0 says how the run travelled.
mkdir -p "$scratch/host0/strategies" "$scratch/host1"
cp "$SRC/configs/run.toml" "$scratch/host0/run.toml"
printf '[strategy]\nplugin = "zero3"\nparam_persistence_threshold = 0\n' \
  > "$scratch/host0/strategies/sharded.toml"
common+=(--set train.log_every=1)
(cd "$scratch/host0" && "$ZTRAIN" "${common[@]}" --strategy sharded \
  --set train.out_dir="$scratch/run_ref" run.toml > "$scratch/run_ref.out" 2>&1) ||
  { cat "$scratch/run_ref.out" >&2; fail "the world-1 run failed"; }
curve run_ref 3
dir0=$scratch/host0 dir1=$scratch/host1 run0=run.toml run1=run.toml only0=(--strategy sharded)
env_pair run_from_0 --strategy zero2 --set model.n_layer=3 --set train.steps=5
both_exited run_from_0 0
said run_from_0 0 "| strategy zero3 |" "did not run the preset's zero3"
said run_from_0 0 "^run: read by rank 0 on host .*, sent to 1 other rank ([0-9]* bytes)" \
  "rank 0 does not say how the run travelled"
curve run_from_0 3
same_training run_ref run_from_0 1e-6 2e-6
echo "run_from_0: $(grep -m1 '^run: ' "$scratch/run_from_0.0.out")"

# A DeepSpeed config only rank 0 has gives the strategy on both ranks.
printf '{"zero_optimization": {"stage": 2}, "gradient_clipping": 1.0}\n' > "$scratch/host0/ds.json"
only0=(--deepspeed ds.json)
env_pair ds_from_0
both_exited ds_from_0 0
said ds_from_0 0 "| strategy zero2 |" "did not run zero2"

# Rank 0 cannot read the run (its file is missing): both ranks stop with
# its error, rank 1 saying it is rank 0's.
dir0=$scratch/host1 only0=()
env_pair no_run
both_exited no_run 2
said no_run 0 "cannot read run file 'run.toml': no such file" \
  "rank 0 did not say why"
said no_run 1 "rank 0 (host .*) cannot read the run: cannot read run file 'run.toml': no such file" \
  "rank 1 did not give rank 0's error"
echo "no_run: $(grep -m1 -o 'rank 0 (host.*' "$scratch/no_run.1.out" | cut -c1-120)"
dir0=$PWD dir1=$PWD run0=$SRC/configs/run.toml run1=$SRC/configs/run.toml

# Under mpirun, one program per rank: rank 1's own --set is not read.
mpirun=$(command -v mpirun) || fail "mpirun not found (install openmpi-bin)"
"$mpirun" --allow-run-as-root --oversubscribe --bind-to none \
  -np 1 "$ZTRAIN" "${common[@]}" --set train.out_dir="$scratch/mpi" "$SRC/configs/run.toml" : \
  -np 1 "$ZTRAIN" "${common[@]}" --set train.out_dir="$scratch/mpi" --set model.n_head=2 \
  "$scratch/absent.toml" > "$scratch/mpi.out" 2>&1 || { cat "$scratch/mpi.out" >&2; fail "mpi: MPMD run failed"; }
(cd "$scratch" && "$ZTRAIN" "${common[@]}" \
  --set train.out_dir="$scratch/mpi_ref" "$SRC/configs/run.toml" > "$scratch/mpi_ref.out" 2>&1) ||
  { cat "$scratch/mpi_ref.out" >&2; fail "the world-1 ddp run failed"; }
curve mpi 3
curve mpi_ref 3
same_training mpi_ref mpi 1e-6 2e-6

# both_said NAME PATTERN: both ranks of NAME exited 1 (an error, not a
# config error) and said PATTERN (grep).
both_said() {
  local name=$1 pattern=$2 r s
  for r in 0 1; do
    s=$([ "$r" -eq 0 ] && echo "$s0" || echo "$s1")
    [ "$s" -eq 1 ] || { cat "$scratch/$name.$r.out" >&2; fail "$name: rank $r exited $s, not 1"; }
    said "$name" "$r" "$pattern" "rank $r did not say why"
  done
}

# The installation: rank 1 loads zero2 from its own copy of the plugin
# file. A byte-identical copy elsewhere agrees and trains; a copy with one
# byte more (another build, as far as the bytes go) stops both ranks naming
# the plugin, both files, both digests and both hosts.
plugins=$(dirname "$ZTRAIN")/../lib/ztrain/plugins
mkdir -p "$scratch/same" "$scratch/rebuilt"
cp "$plugins/libztrain_strategy_zero2.so" "$scratch/same/"
cp "$plugins/libztrain_strategy_zero2.so" "$scratch/rebuilt/"
printf 'x' >> "$scratch/rebuilt/libztrain_strategy_zero2.so"
only0=(--strategy zero2)
env_pair plugin_copy --plugin-path "$scratch/same"
both_exited plugin_copy 0
env_pair plugin_rebuilt --plugin-path "$scratch/rebuilt"
both_said plugin_rebuilt "the ranks run different builds: strategy zero2 is '.*/lib/ztrain/plugins/libztrain_strategy_zero2.so' (crc32c [0-9a-f]*, version [0-9.]*) on rank 0 (host .*) but '$scratch/rebuilt/libztrain_strategy_zero2.so' (crc32c [0-9a-f]*, version [0-9.]*) on rank 1 (host .*); install the same"
echo "plugin_rebuilt: $(grep -m1 -o 'the ranks run different builds.*on rank 1 (host [^)]*)' "$scratch/plugin_rebuilt.0.out")"

# The data: each rank reads corpus.txt in its own working directory (as
# hosts without a shared file system would). The same bytes train; one
# byte changed stops both ranks naming the file, both digests and both
# hosts; a rank without the file stops both, naming the path and its host.
mkdir -p "$scratch/host0" "$scratch/host1"
for i in $(seq 1 2000); do echo "line $i of the same corpus"; done > "$scratch/host0/corpus.txt"
cp "$scratch/host0/corpus.txt" "$scratch/host1/corpus.txt"
common+=(--set data.plugin=text --set data.path=corpus.txt --set model.vocab_size=256)
dir0=$scratch/host0 dir1=$scratch/host1
env_pair data_same
both_exited data_same 0
sed -i '1000s/same/SAME/' "$scratch/host1/corpus.txt"
env_pair data_changed
both_said data_changed "the ranks read different files: data file is 'corpus.txt' ([0-9]* bytes, sampled crc32c [0-9a-f]*) on rank 0 (host .*) but 'corpus.txt' ([0-9]* bytes, sampled crc32c [0-9a-f]*) on rank 1 (host .*); give every host the same file"
echo "data_changed: $(grep -m1 -o 'the ranks read different files.*on rank 1 (host [^)]*)' "$scratch/data_changed.0.out")"
rm "$scratch/host1/corpus.txt"
env_pair data_missing
both_exited data_missing 1
said data_missing 1 "corpus.txt.*(on host .*, rank 1)" \
  "rank 1 did not name the path and its host"
said data_missing 0 "another rank cannot read its data" \
  "rank 0 did not say why it stopped"
echo "data_missing: $(grep -m1 -o 'ztrain: error: .*' "$scratch/data_missing.1.out")"

# Weights only rank 0's host has: init_from names init.safetensors in each
# rank's directory, present in host0's only (and rank 1 has no run file
# either). Rank 0 reads the ranges rank
# 1's strategy holds and sends them: under zero2 and zero3 at world 2 that
# is half the master weights, so about half the file's bytes move. Both log
# the losses of a world-1 run from the same file, and the header says how
# the weights travelled. With an identical copy on host1, each rank reads
# the half it holds itself. A stale copy on host1 is refused. With the file
# on host1 only, rank 0 (which would read it) says it has none, naming its
# host.
cp "$scratch/host0/corpus.txt" "$scratch/host1/corpus.txt"
(cd "$scratch/host0" && "$ZTRAIN" "${common[@]}" --set train.out_dir="$scratch/wsrc" \
  "$SRC/configs/run.toml" > "$scratch/wsrc.out" 2>&1) || { cat "$scratch/wsrc.out" >&2; fail "making weights failed"; }
cp "$scratch/wsrc/model.safetensors" "$scratch/host0/init.safetensors"
common+=(--set model.init_from=init.safetensors --set train.log_every=1)
(cd "$scratch/host0" && "$ZTRAIN" "${common[@]}" --set train.out_dir="$scratch/wref" \
  "$SRC/configs/run.toml" > "$scratch/wref.out" 2>&1) || { cat "$scratch/wref.out" >&2; fail "the world-1 run from the weights failed"; }
curve wref 3
# half_of_the_file NAME TEXT: the bytes in rank 0's header after TEXT (as
# "231.53 KiB") are 45-60 % of the model's 118528 fp32 weights.
half_of_the_file() {
  local name=$1 text=$2 bytes
  bytes=$(grep -m1 -o "$text[0-9.]* [KMG]*i*B" "$scratch/$name.0.out" | sed "s/^$text//" |
    awk '{m = $2 == "KiB" ? 1024 : $2 == "MiB" ? 1048576 : 1; printf "%d", $1 * m}')
  [ -n "$bytes" ] || { cat "$scratch/$name.0.out" >&2; fail "$name: the header does not say how the weights travelled"; }
  [ "$bytes" -gt $((474112 * 45 / 100)) ] && [ "$bytes" -lt $((474112 * 60 / 100)) ] ||
    fail "$name: $bytes bytes, not about half of the model's 474112"
}
run1=absent.toml  # rank 1 has neither the run file nor the weights
for strategy in zero2 zero3; do
  only0=(--strategy "$strategy")
  env_pair "weights_from_0_$strategy"
  both_exited weights_from_0_$strategy 0
  half_of_the_file "weights_from_0_$strategy" \
    "weights from init.safetensors (read by rank 0, which sent each other rank the ranges it holds: "
  curve "weights_from_0_$strategy" 3
  same_training wref "weights_from_0_$strategy" 1e-6 2e-6
  echo "weights_from_0_$strategy: $(grep -m1 -o 'weights from init.safetensors.*' "$scratch/weights_from_0_$strategy.0.out")"
done
cp "$scratch/host0/init.safetensors" "$scratch/host1/init.safetensors"
env_pair weights_shared
both_exited weights_shared 0
half_of_the_file weights_shared "weights from init.safetensors (each rank read the ranges it holds: "
curve weights_shared 3
same_training wref weights_shared 1e-6 2e-6
echo "weights_shared: $(grep -m1 -o 'weights from init.safetensors.*' "$scratch/weights_shared.0.out")"
# A checkpoint only rank 0's host has: written by a world-1 run in host0's
# directory (ck/), resumed at world 2 under zero3 with rank 1 in host1,
# which has no ck/. Rank 0 checks it and sends its manifest and rank 1's
# half of the state (weights, m and v); steps 3 and 4 log the losses of the
# uninterrupted world-1 run.
(cd "$scratch/host0" && "$ZTRAIN" "${common[@]}" --set train.steps=4 --set train.checkpoint_every=2 \
  --set train.out_dir=ck "$SRC/configs/run.toml" > "$scratch/ck.out" 2>&1) ||
  { cat "$scratch/ck.out" >&2; fail "the checkpointed world-1 run failed"; }
train_curve "$scratch/host0/ck/metrics.jsonl" | awk '$1 > 2' > "$scratch/ck_tail.curve"
only0=(--strategy zero3 --resume ck/step_2 --set train.steps=4)
env_pair resumed_from_0
both_exited resumed_from_0 0
said resumed_from_0 0 \
  "resuming ck/step_2 at step 2 of 4 (.* read by rank 0 in .*, which sent each other rank the ranges it holds: .* moved" \
  "the resume line does not say how the state travelled"
curve resumed_from_0 2
same_training ck_tail resumed_from_0 1e-6 2e-6
echo "resumed_from_0: $(grep -m1 -o 'resuming .*' "$scratch/resumed_from_0.0.out")"
# With a copy of the checkpoint on host1 too each rank reads its own; a
# copy that differs (its manifest has one byte more) is refused.
cp -r "$scratch/host0/ck" "$scratch/host1/ck"
env_pair resumed_copies
both_exited resumed_copies 0
curve resumed_copies 2
same_training ck_tail resumed_copies 1e-6 2e-6
printf ' ' >> "$scratch/host1/ck/step_2/manifest.json"
env_pair resumed_stale
both_said resumed_stale "the ranks read different files: checkpoint is 'ck/step_2/manifest.json' ([0-9]* bytes, sampled crc32c [0-9a-f]*) on rank 0 (host .*) but 'ck/step_2/manifest.json' ([0-9]* bytes, sampled crc32c [0-9a-f]*) on rank 1 (host .*)"
only0=() run1=$SRC/configs/run.toml
# A stale copy on host1 (its last byte changed) is refused, not used.
printf 'x' | dd of="$scratch/host1/init.safetensors" bs=1 conv=notrunc status=none \
  seek=$(($(stat -c %s "$scratch/host1/init.safetensors") - 1))
env_pair weights_stale
both_said weights_stale "the ranks read different files: init_from is 'init.safetensors' ([0-9]* bytes, sampled crc32c [0-9a-f]*) on rank 0 (host .*) but 'init.safetensors' ([0-9]* bytes, sampled crc32c [0-9a-f]*) on rank 1 (host .*)"
mv "$scratch/host0/init.safetensors" "$scratch/host1/init.safetensors"
env_pair weights_not_on_0
both_exited weights_not_on_0 1
said weights_not_on_0 0 "init_from: no weights at 'init.safetensors' on rank 0 (host .*), which reads them" \
  "rank 0 did not say it has none"

echo "PASS"
