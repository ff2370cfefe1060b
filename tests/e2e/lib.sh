# Sourced by every end-to-end script (with the script's own arguments):
# ZTRAIN (the binary) and SRC (the source tree) from the command line, a
# scratch directory removed on exit, and fail() naming the script.
test_name=$(basename "${BASH_SOURCE[1]}" .sh)
ZTRAIN=$(realpath "${1:?usage: $test_name.sh ZTRAIN_BINARY SOURCE_DIR}")
SRC=$(realpath "${2:?usage: $test_name.sh ZTRAIN_BINARY SOURCE_DIR}")
scratch=$(mktemp -d)
# Processes a script starts in the background (spawn), killed if still
# alive when it exits, however it exits.
spawned=()
# Directories made on the build tree's disk (disk_dir), removed on exit too.
disk_dirs=()
trap 'for p in "${spawned[@]}"; do kill -9 "$p" 2> /dev/null || true; done; rm -rf "$scratch" "${disk_dirs[@]}"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../support/ports.sh"
# Every mpirun the script starts, itself or through ztrain's launcher, keeps
# its session directory under the script's scratch: Open MPI 4 makes the
# shared default (/tmp/ompi.<host>.<uid>) by checking, then creating, and
# of two mpiruns of two scripts starting at once under ctest -j the second
# can fail ("A call to mkdir ... File exists"). (test_multihost's hosts
# each keep theirs under a TMPDIR of their own in the same scratch.)
export OMPI_MCA_orte_tmpdir_base="$scratch/ompi"

# disk_dir VAR: sets VAR to a new directory on the build tree's disk (not
# /tmp, which may be tmpfs: swap files need a real disk), removed on exit.
disk_dir() {
  local dir
  dir=$(mktemp -d "$PWD/$test_name.XXXXXX")
  disk_dirs+=("$dir")
  printf -v "$1" '%s' "$dir"
}

# Each script works in a directory of its own on the build tree's disk, so
# that a run taking the default out_dir (runs/default: a refusal that comes
# after the out_dir is claimed) never meets another script's run there
# under ctest -j. build_tests: the directory ctest started it in.
build_tests=$PWD
disk_dir own_dir
cd "$own_dir"

# fail MESSAGE: ends the test, first printing the end of what the
# processes it ran printed (the newest $scratch/*.out files), so that a
# failure in CI shows every rank's own account.
fail() {
  local f
  for f in $(ls -t "$scratch"/*.out 2> /dev/null | head -n 8); do
    echo "--- last lines of $(basename "$f"):" >&2
    tail -n 25 "$f" >&2
  done
  echo "FAIL ($test_name): $*" >&2
  exit 1
}

# reserve_port: sets $port to a free port that no other process can take
# while this script runs (tests/support/hold_port.cpp holds it; a ztrain
# rank 0 can still listen on it).
reserve_port() {
  hold_port "$(dirname "$ZTRAIN")/ztrain_test_hold_port" "$(mktemp "$scratch/port.XXXXXX")"
  [ -n "$port" ] || fail "no port to reserve (is ztrain_test_hold_port built beside ztrain?)"
}

# exit_within PID SECONDS: waits for PID (a child) at most SECONDS; sets
# $status to its exit status, or fails the test if it is still running.
exit_within() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    if ! kill -0 "$1" 2> /dev/null; then
      status=0
      wait "$1" || status=$?
      return
    fi
    sleep 0.1
  done
  fail "process $1 was still running after $2 s"
}

# until_step FILE N: waits (up to 120 s) until FILE, a run's console
# output, has logged step N; fails the test otherwise.
until_step() { until_printed "$1" "^step $2/"; }

# until_printed FILE TEXT: waits until FILE holds TEXT (a grep pattern), up
# to 120 s, or fails the test naming what did not come.
until_printed() {
  local i
  for ((i = 0; i < 1200; i++)); do
    grep -q "$2" "$1" 2> /dev/null && return
    sleep 0.1
  done
  fail "$(basename "$1"): \"$2\" not printed within 120 s"
}

# until_exists PATH: waits until PATH exists, up to 120 s, or fails the test.
until_exists() {
  local i
  for ((i = 0; i < 1200; i++)); do
    [ -e "$1" ] && return
    sleep 0.1
  done
  fail "$1 did not appear within 120 s"
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

# train_curve METRICS_JSONL: "step loss grad_norm" of every training line
# (grad_norm is null on a skipped step).
train_curve() {
  [ -f "$1" ] || fail "no metrics file $1"
  metrics_fields "$1" train step loss grad_norm
}

# metrics_fields FILE SPLIT KEY...: the KEYs of every line of FILE (a
# metrics.jsonl) whose "split" is SPLIT ("any": every line), one line each,
# space-separated, in file order; a line lacking a KEY is left out. null
# prints as null, booleans as true and false, numbers as Python writes
# them (the shortest form that reads back as the same double).
metrics_fields() {
  python3 - "$@" << 'PY' || fail "$1 is not one JSON object per line"
import json, sys
path, split, keys = sys.argv[1], sys.argv[2], sys.argv[3:]
def text(v):
    return "null" if v is None else "true" if v is True else "false" if v is False else str(v)
for line in open(path):
    r = json.loads(line)
    if (split == "any" or r.get("split") == split) and all(k in r for k in keys):
        print(" ".join(text(r[k]) for k in keys))
PY
}

# curve NAME: $scratch/NAME/metrics.jsonl's curve into $scratch/NAME.curve,
# which must hold STEPS lines when a second argument gives them.
curve() {
  train_curve "$scratch/$1/metrics.jsonl" > "$scratch/$1.curve"
  if [ -n "${2:-}" ] && [ "$(wc -l < "$scratch/$1.curve")" -ne "$2" ]; then
    fail "$1 logged $(wc -l < "$scratch/$1.curve") training steps, not $2"
  fi
}

# chat_model DIR: a small Llama (2 blocks of 64, grouped key/value heads,
# 2048 tokens, 128 positions) trained one step and saved to DIR as a
# Hugging Face directory with the byte-level test tokenizer and Qwen2.5's
# chat template: the base the fine-tuning tests start from.
chat_model() {
  "$ZTRAIN" --model llama-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.n_head=4 \
    --set model.n_kv_head=2 --set model.vocab_size=2048 --set model.seq_len=128 --set train.steps=1 \
    --set train.eval_every=0 --set device.threads=1 --set train.out_dir="$1" \
    --set train.save_final=true "$SRC/configs/run.toml" > "$scratch/chat_model.out" 2>&1 ||
    fail "training the base model failed"
  cp "$SRC/tests/data/tokenizers/byte_level.json" "$1/tokenizer.json"
  cp "$SRC/tests/data/chat_templates/qwen2_5.jinja" "$1/chat_template.jinja"
}

# toml_run TOML NAME RANKS MICRO ACCUM [ARGS...]: ztrain over run file
# TOML on RANKS ranks into $scratch/NAME (output in $scratch/NAME.out) with
# that micro-batch and accumulation, then ARGS, and its curve, which must
# hold $steps steps.
toml_run() {
  local toml=$1 name=$2 np=$3 micro=$4 accum=$5
  shift 5
  on_ranks "$np" "$ZTRAIN" --set train.micro_batch_size="$micro" --set train.grad_accum="$accum" \
    --set train.out_dir="$scratch/$name" "$@" "$toml" > "$scratch/$name.out" 2>&1 ||
    { cat "$scratch/$name.out" >&2; fail "run $name failed"; }
  curve "$name" "$steps"
}

# train_run NAME RANKS MICRO ACCUM [ARGS...]: the calling script's
# ${base[@]} with that micro-batch and accumulation, then ARGS, on RANKS
# ranks over configs/run.toml into $scratch/NAME (output in
# $scratch/NAME.out), and its curve, which must hold $steps steps.
train_run() {
  local name=$1 np=$2 micro=$3 accum=$4
  shift 4
  on_ranks "$np" "$ZTRAIN" "${base[@]}" --set train.micro_batch_size="$micro" \
    --set train.grad_accum="$accum" --set train.out_dir="$scratch/$name" "$@" "$SRC/configs/run.toml" \
    > "$scratch/$name.out" 2>&1 || { cat "$scratch/$name.out" >&2; fail "run $name failed"; }
  curve "$name" "$steps"
}

# same_column COLUMN WHAT REF NAME TOLERANCE: column COLUMN of
# $scratch/NAME.curve must be within TOLERANCE (relative) of REF's, step by
# step; both must log the same steps.
same_column() {
  local col=$1 what=$2 ref=$3 other=$4 tol=$5 result
  [ -s "$scratch/$ref.curve" ] && [ -s "$scratch/$other.curve" ] ||
    fail "$other or $ref logged no training steps"
  # Prints "misaligned", or the largest difference (as %.3g), the step it
  # is at, and whether it is within the tolerance.
  result=$(awk -v col="$col" -v tol="$tol" '
      NR == FNR { step[FNR] = $1; v[FNR] = $col; n = FNR; next }
      { if ($1 != step[FNR]) bad = 1
        if ($col == v[FNR]) d = 0
        else if ($col == "null" || v[FNR] == "null") d = 1e300
        else { d = v[FNR] - $col; if (d < 0) d = -d; a = v[FNR] < 0 ? -v[FNR] : v[FNR]; if (a > 0) d /= a }
        if (d > m || at == "") { m = d; at = $1 } }
      END { if (bad || FNR != n) print "misaligned"
            else printf "%.3g %s %s", m, at, (m <= tol ? "ok" : "over") }' \
    "$scratch/$ref.curve" "$scratch/$other.curve")
  [ "$result" != misaligned ] || fail "$other and $ref do not log the same steps"
  set -- $result
  echo "$other: largest relative $what difference to $ref: $1 (step $2)"
  [ "$3" = ok ] || fail "$other's $what differs from $ref's by $1 at step $2 (> $tol)"
}

# same_losses REF NAME TOLERANCE, same_norms REF NAME TOLERANCE: losses or
# gradient norms of $scratch/NAME.curve against REF's.
same_losses() { same_column 2 loss "$@"; }
same_norms() { same_column 3 "gradient norm" "$@"; }
# same_training REF NAME LOSS_TOLERANCE NORM_TOLERANCE: both.
same_training() {
  same_losses "$1" "$2" "$3"
  same_norms "$1" "$2" "$4"
}

# comm_bytes NAME KIND: the bytes all ranks sent for collectives of KIND in
# the last logged training step of $scratch/NAME/metrics.jsonl.
comm_bytes() {
  python3 - "$scratch/$1/metrics.jsonl" "$2" << 'PY'
import json, sys
last = None
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("split") == "train":
        last = r
kind = (last or {}).get("comm", {}).get(sys.argv[2])
if kind is not None:
    print(kind["bytes"])
PY
}

# check_bytes NAME KIND BYTES: exactly BYTES (summed over ranks) for KIND.
check_bytes() {
  local got
  got=$(comm_bytes "$1" "$2")
  [ -n "$got" ] || fail "$1: no $2 bytes in the metrics"
  [ "$got" -eq 0 ] && [ "$3" -eq 0 ] ||
    echo "$1: $2 sent $got bytes over all ranks in the last step (theory $3)"
  [ "$got" -eq "$3" ] || fail "$1: $2 sent $got bytes in a step, the theory says $3"
}
