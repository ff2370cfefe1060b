#!/usr/bin/env bash
# The installed SDK: `cmake --install` of the build tree into a fresh
# prefix gives the ztrain binary, libztrain, every built-in plugin where
# the installed binary finds it (lib/ztrain/plugins), the presets, the
# public headers (not the host's own, such as safetensors.h; none
# including a third-party or uninstalled header) and the CMake package.
# The example project outside the tree (examples/hybrid_shard) finds it
# with find_package(ztrain), builds its strategy with ztrain_add_strategy() (warnings as errors), and the installed ztrain
# lists it from --plugin-path and trains with it: at world 4 in groups of 2
# (two copies of a ZeRO-3 shard of 2) and in one group of 4 it logs the
# losses and gradient norms of ddp at world 1 (tolerances of
# test_zero_equivalence.sh); a checkpoint it writes (each copy of a shard
# saving half of it) verifies and resumes under ddp at world 1 with the
# uninterrupted losses; a group size that does not divide the world is a
# config error naming it.
#
# usage: test_sdk_install.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

build=$(cd "$(dirname "$ZTRAIN")/.." && pwd)
prefix="$scratch/prefix"
cmake --install "$build" --prefix "$prefix" > "$scratch/install.out" 2>&1 ||
  { cat "$scratch/install.out" >&2; fail "cmake --install failed"; }
for f in bin/ztrain include/ztrain/strategy.h include/ztrain/shard/zero_strategy.h \
  include/ztrain/version.h share/ztrain/configs/run.toml share/ztrain/configs/strategies/zero3.toml \
  lib/ztrain/plugins/libztrain_strategy_zero3.so lib/ztrain/plugins/libztrain_model_transformer.so; do
  [ -e "$prefix/$f" ] || fail "not installed: $f"
done
config=$(find "$prefix" -name ztrainConfig.cmake | head -n 1)
[ -n "$config" ] && [ -f "$(dirname "$config")/ztrainConfigVersion.cmake" ] &&
  [ -f "$(dirname "$config")/ZtrainPlugin.cmake" ] || fail "no CMake package installed"
[ ! -e "$prefix/include/ztrain/safetensors.h" ] || fail "a host-only header is installed"
# The public headers stand alone: no third-party header (Boost, toml++, ...)
# and no header of the host or the kit (src/) reached from them.
if grep -rnE '#include [<"](boost|toml|nlohmann|tbb|oneapi|gloo|mpi)' "$prefix/include/ztrain"; then
  fail "an installed public header includes a third-party header"
fi
if grep -rnE '#include "(core|kit|kernels|shard|io|comm|loader|config|job|checkpoint|train|commands|cuda)/' \
  "$prefix/include/ztrain"; then
  fail "an installed public header includes a header that is not installed"
fi
find "$prefix/lib/ztrain/plugins" -name '*bad_abi*' | grep -q . && fail "a test plugin is installed"
echo "installed: binary, library, plugins, presets, public headers, $(basename "$(dirname "$config")") package"

"$prefix/bin/ztrain" plugins > "$scratch/plugins.out" 2>&1 || { cat "$scratch/plugins.out" >&2; fail "ztrain plugins failed"; }
grep -q "file: $prefix/lib/ztrain/plugins/libztrain_strategy_zero2.so" "$scratch/plugins.out" ||
  { cat "$scratch/plugins.out" >&2; fail "the installed ztrain does not find its plugins"; }

# example_plugin PROJECT LIBRARY: examples/PROJECT built against the
# installed SDK (warnings as errors); prints the path of the LIBRARY it made.
example_plugin() {
  local build="$scratch/$1_build" plugin
  cmake -S "$SRC/examples/$1" -B "$build" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS="-Wall -Wextra -Werror" > "$scratch/$1.out" 2>&1 &&
    cmake --build "$build" >> "$scratch/$1.out" 2>&1 || { cat "$scratch/$1.out" >&2; fail "the example project $1 does not build"; }
  plugin=$(find "$build" -name "$2" | head -n 1)
  [ -n "$plugin" ] || fail "the example project $1 made no plugin"
  echo "$plugin"
}
plugin=$(example_plugin hybrid_shard libztrain_strategy_hybrid_shard.so)
plugins=$(dirname "$plugin")
"$prefix/bin/ztrain" plugins --plugin-path "$plugins" > "$scratch/plugins.out" 2>&1 ||
  { cat "$scratch/plugins.out" >&2; fail "ztrain plugins --plugin-path failed"; }
grep -q "file: $plugin" "$scratch/plugins.out" || { cat "$scratch/plugins.out" >&2; fail "the example plugin is not listed"; }
echo "the example's plugin is listed: $plugin"

ZTRAIN="$prefix/bin/ztrain"
steps=8
base=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set train.steps="$steps" --set train.log_every=1 --set train.eval_every=0
  --set device.threads=1 --set train.save_final=false --plugin-path "$plugins")
small=(--set strategy.param_persistence_threshold=0 --set strategy.prefetch_bucket_size=20000
  --set strategy.reduce_bucket_size=5000)
train_run ddp_w1 1 8 1
train_run hybrid_w4_g2 4 2 1 --strategy hybrid_shard --set strategy.shard_group_size=2 "${small[@]}" \
  --set train.checkpoint_every=4
grep -q "state sharded within groups of 2 ranks, replicated across 2 groups" "$scratch/hybrid_w4_g2.out" ||
  { cat "$scratch/hybrid_w4_g2.out" >&2; fail "the run header does not say how the state is sharded"; }
train_run hybrid_w4_g4 4 1 2 --strategy hybrid_shard --set strategy.shard_group_size=4 "${small[@]}"
same_training ddp_w1 hybrid_w4_g2 1e-6 2e-6
same_training ddp_w1 hybrid_w4_g4 1e-6 2e-6

"$ZTRAIN" checkpoint info "$scratch/hybrid_w4_g2/step_4" > "$scratch/info.out" 2>&1 ||
  { cat "$scratch/info.out" >&2; fail "the hybrid checkpoint does not verify"; }
# A resume keeps the checkpoint's run but for what the command line
# changes: here the strategy, to ddp on one rank.
"$ZTRAIN" "${base[@]}" --strategy ddp --set train.micro_batch_size=8 --set train.grad_accum=1 \
  --set train.out_dir="$scratch/resumed" --resume "$scratch/hybrid_w4_g2/step_4" \
  "$SRC/configs/run.toml" > "$scratch/resumed.out" 2>&1 ||
  { cat "$scratch/resumed.out" >&2; fail "resuming the hybrid checkpoint under ddp failed"; }
curve resumed 4
tail -n 4 "$scratch/ddp_w1.curve" > "$scratch/ddp_w1_last.curve"
same_training ddp_w1_last resumed 1e-6 2e-6

if on_ranks 2 "$ZTRAIN" "${base[@]}" --strategy hybrid_shard --set strategy.shard_group_size=3 \
  --set train.out_dir="$scratch/bad" "$SRC/configs/run.toml" > "$scratch/bad.out" 2>&1; then
  fail "a group size that does not divide the world was accepted"
fi
grep -q "shard_group_size = 3 does not divide the 2 ranks" "$scratch/bad.out" ||
  { cat "$scratch/bad.out" >&2; fail "the error does not name shard_group_size"; }
echo "hybrid_shard: equivalent to ddp at world 4 in groups of 2 and of 4; its checkpoint resumes under ddp"

# A schedule plugin outside the tree (examples/zero_bubble_schedule): built
# against the installed SDK, listed, and its plan checked and timed by the
# installed ztrain, idling less than 1F1B's on the same clock.
zb_plugin=$(example_plugin zero_bubble_schedule libztrain_schedule_zero_bubble.so)
"$ZTRAIN" plugins --plugin-path "$(dirname "$zb_plugin")" > "$scratch/zb_plugins.out" 2>&1 ||
  { cat "$scratch/zb_plugins.out" >&2; fail "ztrain plugins --plugin-path (schedule) failed"; }
grep -q "^schedule zero_bubble 0.1.0" "$scratch/zb_plugins.out" ||
  { cat "$scratch/zb_plugins.out" >&2; fail "the schedule plugin is not listed"; }
for s in 1f1b zero_bubble; do
  "$ZTRAIN" schedule "$s" --stages 4 --micro-batches 8 --plugin-path "$(dirname "$zb_plugin")" \
    > "$scratch/$s.plan" 2>&1 || { cat "$scratch/$s.plan" >&2; fail "ztrain schedule $s failed"; }
done
grep -q "^  stage 0: F0 F1 F2 F3 I0 F4 I1" "$scratch/zero_bubble.plan" ||
  { cat "$scratch/zero_bubble.plan" >&2; fail "the plugin's plan is not the one printed"; }
idle() { sed -n 's/^  the most idle stage idles \([0-9.]*\) %.*/\1/p' "$scratch/$1.plan"; }
awk -v z="$(idle zero_bubble)" -v o="$(idle 1f1b)" 'BEGIN { exit !(z != "" && o != "" && z + 0 < o + 0) }' ||
  fail "zero_bubble idles $(idle zero_bubble) % against 1f1b's $(idle 1f1b) %"
echo "zero_bubble (a schedule plugin): idles $(idle zero_bubble) % of the step against 1f1b's $(idle 1f1b) %"
# And a run takes it by name ([parallel] pipeline_schedule), checks its
# plan and trains what 1f1b trains.
for s in 1f1b zero_bubble; do
  "$ZTRAIN" --nproc 2 --plugin-path "$(dirname "$zb_plugin")" --model gpt2-tiny \
    --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32 --set model.vocab_size=256 \
    --set train.steps=4 --set train.log_every=1 --set train.eval_every=0 --set train.save_final=false \
    --set train.micro_batch_size=2 --set train.grad_accum=4 --set parallel.pipeline=2 \
    --set parallel.pipeline_schedule="$s" --set train.out_dir="$scratch/zb_run_$s" \
    "$SRC/configs/run.toml" > "$scratch/zb_run_$s.out" 2>&1 ||
    { cat "$scratch/zb_run_$s.out" >&2; fail "a pipeline run with schedule $s failed"; }
  grep -o '"loss": [^,]*, "lr": [^,]*, "grad_norm": [^,]*' "$scratch/zb_run_$s/metrics.jsonl" \
    > "$scratch/zb_run_$s.curve"
done
grep -q "zero_bubble over 4 micro-batches" "$scratch/zb_run_zero_bubble.out" ||
  { cat "$scratch/zb_run_zero_bubble.out" >&2; fail "the run does not name the plugin's schedule"; }
cmp -s "$scratch/zb_run_1f1b.curve" "$scratch/zb_run_zero_bubble.curve" ||
  { paste "$scratch/zb_run_1f1b.curve" "$scratch/zb_run_zero_bubble.curve" >&2
    fail "the zero_bubble plugin's run does not train what 1f1b trains"; }
echo "zero_bubble (a schedule plugin) runs a pipeline: the same losses and norms as 1f1b"
