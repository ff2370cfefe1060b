#!/usr/bin/env bash
# The installed SDK: `cmake --install` of the build tree into a fresh
# prefix gives the ztrain binary, libztrain, every built-in plugin where
# the installed binary finds it (lib/ztrain/plugins), the presets, the
# public headers (not the host's own, such as safetensors.h) and the CMake
# package. A project outside the tree (tests/sdk) finds it with
# find_package(ztrain), builds a strategy with ztrain_add_strategy(), and
# the installed ztrain lists it from --plugin-path and trains with it: the
# losses of the installed zero2, whose source it is.
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
find "$prefix/lib/ztrain/plugins" -name '*bad_abi*' | grep -q . && fail "a test plugin is installed"
echo "installed: binary, library, plugins, presets, public headers, $(basename "$(dirname "$config")") package"

"$prefix/bin/ztrain" plugins > "$scratch/plugins.out" 2>&1 || { cat "$scratch/plugins.out" >&2; fail "ztrain plugins failed"; }
grep -q "file: $prefix/lib/ztrain/plugins/libztrain_strategy_zero2.so" "$scratch/plugins.out" ||
  { cat "$scratch/plugins.out" >&2; fail "the installed ztrain does not find its plugins"; }

sdk="$scratch/sdk_build"
cmake -S "$SRC/tests/sdk" -B "$sdk" -DCMAKE_PREFIX_PATH="$prefix" -DZTRAIN_SOURCE="$SRC" \
  -DCMAKE_BUILD_TYPE=Release > "$scratch/sdk.out" 2>&1 &&
  cmake --build "$sdk" >> "$scratch/sdk.out" 2>&1 || { cat "$scratch/sdk.out" >&2; fail "the SDK project does not build"; }
plugin=$(find "$sdk" -name 'libztrain_strategy_zero2.so' | head -n 1)
[ -n "$plugin" ] || fail "the SDK project made no plugin"
"$prefix/bin/ztrain" plugins --plugin-path "$(dirname "$plugin")" > "$scratch/plugins.out" 2>&1 ||
  { cat "$scratch/plugins.out" >&2; fail "ztrain plugins --plugin-path failed"; }
grep -q "file: $plugin" "$scratch/plugins.out" || { cat "$scratch/plugins.out" >&2; fail "the SDK plugin is not listed"; }
echo "the SDK project's plugin is listed: $plugin"

steps=6
base=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set train.steps="$steps" --set train.log_every=1 --set train.eval_every=0
  --set device.threads=1 --set train.save_final=false --strategy zero2)
"$prefix/bin/ztrain" "${base[@]}" --set train.out_dir="$scratch/installed" "$SRC/configs/run.toml" \
  > "$scratch/installed.out" 2>&1 || { cat "$scratch/installed.out" >&2; fail "the installed ztrain does not train"; }
"$prefix/bin/ztrain" -v --plugin-path "$(dirname "$plugin")" "${base[@]}" --set train.out_dir="$scratch/sdk_run" \
  "$SRC/configs/run.toml" > "$scratch/sdk_run.out" 2>&1 || { cat "$scratch/sdk_run.out" >&2; fail "training with the SDK plugin failed"; }
grep -q "$plugin" "$scratch/sdk_run.out" || fail "the run did not load the SDK plugin"
curve installed "$steps"
curve sdk_run "$steps"
same_training installed sdk_run 0 0
