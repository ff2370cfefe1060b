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
