#!/usr/bin/env bash
# The default run (configs/run.toml, unchanged but for out_dir) ends within
# 10% of the synthetic source's entropy rate, as the issue promises.
set -euo pipefail
ztrain=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$ztrain" --set train.out_dir="$tmp/run" "$src/configs/run.toml" > "$tmp/out.txt"
summary=$(grep "source entropy" "$tmp/out.txt" | tail -n 1)
echo "$summary"
val=$(sed -n 's/.*| val loss \([0-9.]*\).*/\1/p' <<<"$summary")
entropy=$(sed -n 's/.*source entropy \([0-9.]*\).*/\1/p' <<<"$summary")
if [ -z "$val" ] || [ -z "$entropy" ]; then
  echo "FAIL: no final val loss or entropy in the summary" >&2
  cat "$tmp/out.txt" >&2
  exit 1
fi
if ! awk -v v="$val" -v h="$entropy" 'BEGIN { exit !(v <= 1.10 * h) }'; then
  echo "FAIL: final val loss $val is not within 10% of the entropy rate $entropy" >&2
  exit 1
fi
echo "PASS: val loss $val within 10% of entropy $entropy"
