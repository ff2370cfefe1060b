#!/usr/bin/env bash
# The default run (configs/run.toml, unchanged but for out_dir) ends within
# 10% of the synthetic source's entropy rate, as the issue promises.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

"$ZTRAIN" --set train.out_dir="$scratch/run" "$SRC/configs/run.toml" > "$scratch/out.txt"
summary=$(grep "source entropy" "$scratch/out.txt" | tail -n 1)
echo "$summary"
val=$(sed -n 's/.*| val loss \([0-9.]*\).*/\1/p' <<<"$summary")
entropy=$(sed -n 's/.*source entropy \([0-9.]*\).*/\1/p' <<<"$summary")
if [ -z "$val" ] || [ -z "$entropy" ]; then
  cat "$scratch/out.txt" >&2
  fail "no final val loss or entropy in the summary"
fi
awk -v v="$val" -v h="$entropy" 'BEGIN { exit !(v <= 1.10 * h) }' ||
  fail "final val loss $val is not within 10% of the entropy rate $entropy"
echo "PASS: val loss $val within 10% of entropy $entropy"
