#!/usr/bin/env bash
# Fuzzes ztrain's parsers with libFuzzer (clang, from Debian), each target
# for a bounded time; not part of CI (the suite replays the corpus instead).
#
# Builds build-fuzz/ with clang, -fsanitize=fuzzer-no-link,address for the
# library and plugins and -fsanitize=fuzzer for the targets, then runs each
# target for SECONDS starting from its committed corpus
# (tests/fuzz/corpus/TARGET; new inputs libFuzzer finds go to a scratch copy,
# not into the repository). Prints, per target, the executions and the
# findings (crash, leak or timeout files: the input that did it). A finding
# is fixed in the code and its input added to tests/fuzz/corpus/TARGET,
# where every CI run replays it.
#
#   tests/fuzz/run.sh [SECONDS] [TARGET...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_config fuzz_deepspeed fuzz_documents fuzz_elf fuzz_hostfile fuzz_manifest fuzz_safetensors fuzz_tokenizer fuzz_tokens)
build=$src/build-fuzz
flags="-fsanitize=fuzzer-no-link,address -fno-omit-frame-pointer -g -O1"
mkdir -p "$build"
CC=clang CXX=clang++ cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DZTRAIN_FUZZ=ON -DZTRAIN_NATIVE=OFF -DZTRAIN_ENABLE_CUDA=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" > "$build/configure.log" 2>&1 ||
  { tail -20 "$build/configure.log"; exit 1; }
cmake --build "$build" -j2 --target "${targets[@]}" tokens > "$build/build.log" 2>&1 ||
  { grep -m5 -A5 "error" "$build/build.log"; exit 1; }
out=$(mktemp -d /tmp/ztrain-fuzz.XXXXXX)
printf "%-18s %12s %9s  %s\n" target executions findings "new corpus inputs"
status=0
for t in "${targets[@]}"; do
  [ -x "$build/bin/$t" ] || { echo "$t: not built ($build/bin/$t)"; status=1; continue; }
  mkdir -p "$out/$t/corpus" "$out/$t/findings"
  cp -r "$here/corpus/$t/." "$out/$t/corpus/"
  before=$(ls "$out/$t/corpus" | wc -l)
  (cd "$out/$t/findings" &&
    ASAN_OPTIONS=detect_leaks=1 "$build/bin/$t" -max_total_time="$seconds" -print_final_stats=1 \
      -timeout=10 -rss_limit_mb=4096 "$out/$t/corpus" > "$out/$t/log" 2>&1) || true
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/$t/log" | tail -n 1)
  findings=$(ls "$out/$t/findings" | grep -E '^(crash|leak|timeout|oom)-' || true)
  n=$(printf '%s' "$findings" | grep -c . || true)
  printf "%-18s %12s %9s  %s\n" "$t" "${execs:-?}" "$n" "$(($(ls "$out/$t/corpus" | wc -l) - before))"
  for f in $findings; do
    echo "  finding: $out/$t/findings/$f"
    grep -m3 -E "ERROR|terminate|what\(\)" "$out/$t/log" | sed 's/^/    /'
    status=1
  done
done
echo "logs and inputs: $out"
exit $status
