# Sourced by every end-to-end script (with the script's own arguments):
# ZTRAIN (the binary) and SRC (the source tree) from the command line, a
# scratch directory removed on exit, and fail() naming the script.
name=$(basename "${BASH_SOURCE[1]}" .sh)
ZTRAIN=$(realpath "${1:?usage: $name.sh ZTRAIN_BINARY SOURCE_DIR}")
SRC=$(realpath "${2:?usage: $name.sh ZTRAIN_BINARY SOURCE_DIR}")
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

fail() {
  echo "FAIL ($name): $*" >&2
  exit 1
}

# on_ranks N CMD...: CMD itself for N = 1, else N ranks of it under mpirun
# with what a shared, possibly oversubscribed machine needs; ZTRAIN_TEST_*
# variables (test hooks) travel to every rank.
on_ranks() {
  local np=$1 mpirun forward=()
  shift
  if [ "$np" -eq 1 ]; then
    "$@"
    return
  fi
  mpirun=$(command -v mpirun) || fail "mpirun not found (install openmpi-bin)"
  for v in $(compgen -e | grep '^ZTRAIN_TEST_' || true); do forward+=(-x "$v"); done
  "$mpirun" --allow-run-as-root --oversubscribe --bind-to none "${forward[@]}" -np "$np" "$@"
}

# train_losses METRICS_JSONL: "step loss" of every training line.
train_losses() {
  grep '"split": "train"' "$1" | sed -n 's/.*"step": \([0-9]*\).*"loss": \([-0-9.e+]*\).*/\1 \2/p'
}

# same_losses REF NAME TOLERANCE: the losses (column 2, line by line) of
# $scratch/NAME.losses must be within TOLERANCE (relative) of REF's.
same_losses() {
  local ref=$1 other=$2 tol=$3 worst
  worst=$(awk 'NR == FNR { a[FNR] = $2; next }
      { d = a[FNR] - $2; if (d < 0) d = -d; r = d / a[FNR]; if (r > m) m = r }
      END { printf "%.3g", m }' "$scratch/$ref.losses" "$scratch/$other.losses")
  echo "$other: largest relative loss difference to $ref: $worst"
  awk -v m="$worst" -v t="$tol" 'BEGIN { exit !(m <= t) }' ||
    fail "$other differs from $ref by $worst (> $tol)"
}
