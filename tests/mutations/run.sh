#!/usr/bin/env bash
# The mutation check: the suite must catch every deliberate bug kept here.
#
# Each *.patch is one bug, with a header saying what it breaks ("Mutation:")
# and which tests should catch it ("Caught-by:", a ctest -R pattern). This
# script copies the working tree (committed or not, without build
# directories) to a scratch directory, builds it once, checks that the
# named tests pass there, then for each mutation: applies it, rebuilds, runs
# the named tests and, if none fails, the whole suite; then reverts it. It
# prints a table (caught, by which tests, or MISSED) and exits 1 when a
# mutation is missed, does not apply or does not build.
#
# Too slow for every CI run (a few minutes per surviving mutation): run it
# before resolving an issue that touches the math, the strategies or the
# communicators, and keep a mutation here for every new mechanism.
#
# After the table, one line per room (the source folder of the file a
# mutation changes: framework/src/comm, plugins/data/tokens, ...): caught of
# run. --rooms lists, without running anything, how many mutations each
# room holds, every room of framework/src, plugins/ and strategies/
# included, so a room with none shows.
#
# usage: tests/mutations/run.sh [NAME...]   (default: every patch)
#        tests/mutations/run.sh --rooms
#   ZTRAIN_MUTATION_DIR=DIR reuses DIR (and its build) between runs.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)

# room_of FILE: framework/src/ROOM, plugins/KIND/NAME, or FILE's folder.
room_of() {
  case $1 in
    framework/src/*) echo "$1" | cut -d/ -f1-3 ;;
    plugins/*/*/*) echo "$1" | cut -d/ -f1-3 ;;
    *) dirname "$1" ;;
  esac
}
# The room of mutation NAME: that of the first file its patch changes.
room_of_patch() { room_of "$(sed -n 's|^+++ b/||p' "$here/$1.patch" | head -n 1)"; }

if [ "${1:-}" = --rooms ]; then
  declare -A held
  for d in "$src"/framework/src/*/ "$src"/plugins/*/*/ "$src"/strategies/*/; do
    held[$(realpath --relative-to="$src" "$d")]=0
  done
  for p in "$here"/*.patch; do
    r=$(room_of_patch "$(basename "$p" .patch)")
    held[$r]=$((${held[$r]:-0} + 1))
  done
  echo "| room | mutations |"
  echo "|---|---|"
  for r in $(printf '%s\n' "${!held[@]}" | sort); do echo "| $r | ${held[$r]} |"; done
  exit 0
fi
work=${ZTRAIN_MUTATION_DIR:-$(mktemp -d /tmp/ztrain-mutations.XXXXXX)}
tree=$work/src build=$work/build log=$work/logs
mkdir -p "$tree" "$log"

names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for p in "$here"/*.patch; do names+=("$(basename "$p" .patch)"); done
fi

echo "scratch: $work"
# The tree as it is now (uncommitted changes included). Only files whose
# contents differ from the last run's copy are replaced, and they get a new
# mtime: a reused build then rebuilds exactly those. (A plain copy keeps
# the sources' own mtimes, which can be older than the outputs the last
# mutation's rebuild left, and ninja would keep a stale build.)
stage=$work/stage
rm -rf "$stage" && mkdir -p "$stage"
tar -C "$src" --exclude=./.git --exclude='./build*' -cf - . | tar -C "$stage" -xf -
(cd "$stage" && find . -type f) | while IFS= read -r f; do
  cmp -s "$stage/$f" "$tree/$f" || { mkdir -p "$(dirname "$tree/$f")" && cp "$stage/$f" "$tree/$f"; }
done
(cd "$tree" && find . -type f) | while IFS= read -r f; do [ -e "$stage/$f" ] || rm -f "$tree/$f"; done
rm -rf "$stage"
cmake -S "$tree" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release > "$log/configure.log" 2>&1 ||
  { tail -20 "$log/configure.log"; exit 1; }
cmake --build "$build" -j2 > "$log/build.log" 2>&1 || { tail -20 "$log/build.log"; exit 1; }

caught_by() { sed -n 's/^Caught-by: //p' "$here/$1.patch"; }

# Every mutation must name tests that exist, and they must pass before a
# mutation can be said to fail them.
for n in "${names[@]}"; do
  ctest --test-dir "$build" -N -R "$(caught_by "$n")" | grep -q "Total Tests: [1-9]" ||
    { echo "$n: its Caught-by pattern '$(caught_by "$n")' names no test"; exit 1; }
done
union=$(for n in "${names[@]}"; do caught_by "$n"; done | paste -sd'|')
if ! ctest --test-dir "$build" -j2 -R "$union" > "$log/baseline.log" 2>&1; then
  echo "the unmutated tree fails its own tests ($union):"
  grep -E "Failed|\*\*\*" "$log/baseline.log" | head -20
  exit 1
fi

# The tests ctest lists as failed ("(Failed)", "(SEGFAULT)", "(Timeout)"...),
# not the ones it lists as skipped (the GPU tests without a GPU).
failed_tests() {
  grep -v '(Skipped)$' "$1" | sed -n 's/^[[:space:]]*[0-9]* - \(.*\) (.*)$/\1/p' | paste -sd' '
}

declare -A verdict
status=0
for n in "${names[@]}"; do
  patch=$here/$n.patch
  start=$SECONDS
  if ! (cd "$tree" && git apply --check "$patch") 2> "$log/$n.apply.log"; then
    verdict[$n]="DOES NOT APPLY"
    status=1
    continue
  fi
  (cd "$tree" && git apply "$patch")
  if ! cmake --build "$build" -j2 > "$log/$n.build.log" 2>&1; then
    verdict[$n]="DOES NOT BUILD"
    status=1
  elif ! ctest --test-dir "$build" -j2 -R "$(caught_by "$n")" > "$log/$n.named.log" 2>&1; then
    verdict[$n]="caught by $(failed_tests "$log/$n.named.log")"
  elif ! ctest --test-dir "$build" -j2 -E "$(caught_by "$n")" > "$log/$n.suite.log" 2>&1; then
    verdict[$n]="caught (not by its named tests) by $(failed_tests "$log/$n.suite.log")"
  else
    verdict[$n]="MISSED"
    status=1
  fi
  (cd "$tree" && git apply -R "$patch")
  verdict[$n]="${verdict[$n]} [$((SECONDS - start)) s]"
  printf '%-34s %s\n' "$n" "${verdict[$n]}"
done
cmake --build "$build" -j2 > /dev/null 2>&1

echo
echo "| mutation | what it breaks | result |"
echo "|---|---|---|"
for n in "${names[@]}"; do
  echo "| $n | $(sed -n 's/^Mutation: //p' "$here/$n.patch") | ${verdict[$n]} |"
done

declare -A run_in caught_in
for n in "${names[@]}"; do
  r=$(room_of_patch "$n")
  run_in[$r]=$((${run_in[$r]:-0} + 1))
  [[ ${verdict[$n]} == caught* ]] && caught_in[$r]=$((${caught_in[$r]:-0} + 1))
done
echo
echo "| room | caught / run |"
echo "|---|---|"
for r in $(printf '%s\n' "${!run_in[@]}" | sort); do echo "| $r | ${caught_in[$r]:-0} / ${run_in[$r]} |"; done
exit $status
