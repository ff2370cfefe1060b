#!/usr/bin/env bash
# The symbols a library exports against the committed list of them.
#
# libztrain exports what the SDK promises (ZTRAIN_API) and the host's kit
# (ZTRAIN_KIT), nothing else; libztrain_cuda its entry table and what its
# headers mark ZTRAIN_API; a plugin only its `ztrain_plugin_v1` alias. A
# symbol exported but not in the list (a new export nobody declared, or one
# that lost its hidden visibility) fails, and so does a listed symbol no
# longer exported (the list must say what the library does). Only ztrain's
# own symbols are listed, told by their mangled names (in namespace ztrain,
# or its vtables, type_info, guards and thunks, or extern "C" ztrain_*):
# the standard library's and the CUDA toolkit's template instances, which
# their headers force to default visibility and which vary with the
# optimisation level, are left out.
#
# usage: exported_symbols.sh LIBRARY LIST          check
#        exported_symbols.sh --update LIBRARY LIST  rewrite LIST from LIBRARY
#        exported_symbols.sh --plugins DIR           every plugin in DIR
set -euo pipefail

ours() {
  nm -D --defined-only "$1" | awk '{print $3}' |
    grep -E '^(_Z(TV|TI|TS|TT|GV|Th[n]?[0-9]+_|Tv[n]?[0-9]+_[n]?[0-9]+_)?N?K?6ztrain|ztrain_)' |
    c++filt | sort -u || true
}

if [ "$1" = "--plugins" ]; then
  bad=0
  for lib in "$2"/libztrain_*.so; do
    got=$(ours "$lib" | tr '\n' ' ')
    if [ "$got" != "ztrain_plugin_v1 " ]; then
      echo "exported_symbols: $lib exports '$got'; a plugin exports its ztrain_plugin_v1 alias alone (ztrain_add_plugin builds with hidden visibility)"
      bad=1
    fi
  done
  [ $bad = 0 ] && echo "exported_symbols: every plugin in $2 exports ztrain_plugin_v1 alone"
  exit $bad
fi

if [ "$1" = "--update" ]; then
  lib=$2 list=$3
  { if [ -f "$list" ]; then sed -n '/^#/p' "$list"; fi; ours "$lib"; } > "$list.new"
  mv "$list.new" "$list"
  echo "exported_symbols: $list rewritten from $lib ($(grep -vc '^#' "$list") symbols)"
  exit 0
fi

lib=$1 list=$2
declared=$(mktemp) actual=$(mktemp)
trap 'rm -f "$declared" "$actual"' EXIT
grep -v '^#' "$list" | sort -u > "$declared"
ours "$lib" > "$actual"
added=$(comm -13 "$declared" "$actual")
gone=$(comm -23 "$declared" "$actual")
if [ -n "$added" ]; then
  echo "exported_symbols: $(basename "$lib") exports symbols $list does not declare:"
  echo "$added" | sed 's/^/  + /'
fi
if [ -n "$gone" ]; then
  echo "exported_symbols: $list declares symbols $(basename "$lib") no longer exports:"
  echo "$gone" | sed 's/^/  - /'
fi
if [ -n "$added$gone" ]; then
  echo "exported_symbols: if the change is meant (a new SDK function, marked ZTRAIN_API or ZTRAIN_KIT), rewrite the list with"
  echo "  tests/sdk/exported_symbols.sh --update $lib $list"
  echo "and review its diff: each line is a promise to plugin authors or to the host"
  exit 1
fi
echo "exported_symbols: $(basename "$lib") exports the $(wc -l < "$actual") symbols $list declares"
