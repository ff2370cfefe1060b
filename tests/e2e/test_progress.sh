#!/usr/bin/env bash
# The progress bar on every launch: on a pseudo-terminal (util-linux
# `script`), one process and two ranks under --nproc (mpirun's pipes between
# rank 0 and the terminal) draw the bar and keep each printed step's line
# above it; off a terminal there is no bar, only the lines.
#
# usage: test_progress.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
command -v script > /dev/null || { echo "SKIP: no script(1) (util-linux)"; exit 0; }

args=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set train.steps=8 --set train.log_every=4 --set train.eval_every=0 --set device.threads=1)
on_pty() {  # on_pty NAME ZTRAIN_ARGS...: runs ztrain on a pseudo-terminal, output in $scratch/NAME.out
  local name=$1
  shift
  local cmd
  printf -v cmd '%q ' "$ZTRAIN" "$@"
  script -qefc "$cmd" "$scratch/$name.out" > /dev/null 2>&1 ||
    fail "$name: ztrain on a pseudo-terminal failed"
}
check_bar() {  # check_bar NAME: the bar drawn, every printed step kept as a line of its own
  python3 - "$scratch/$1.out" "$1" <<'PY' || fail "$1: the bar or the kept lines are wrong"
import re, sys
text = open(sys.argv[1], encoding="utf-8", errors="replace").read()
bars = re.findall(r"\[#*\.*\] (\d+)/8  loss", text)
assert set(range(1, 9)) <= set(map(int, bars)), bars
# Each printed step is a whole line, the bar cleared before it.
for step in (1, 4, 8):
    assert re.search(r"\x1b\[2Kstep %d/8 \| loss" % step, text), "step %d not kept" % step
# The final summary comes after the bar is cleared, on a line of its own.
assert re.search(r"\x1b\[2Kdone: 8 steps", text), "summary"
print(sys.argv[2] + ": bar at steps", sorted(set(map(int, bars))), "; steps 1, 4, 8 kept above it")
PY
}
on_pty single "${args[@]}" --set train.out_dir="$scratch/single" "$SRC/configs/run.toml"
check_bar single
on_pty nproc --nproc 2 "${args[@]}" --set train.out_dir="$scratch/nproc" "$SRC/configs/run.toml"
check_bar nproc

"$ZTRAIN" --nproc 2 "${args[@]}" --set train.out_dir="$scratch/plain" "$SRC/configs/run.toml" \
  > "$scratch/plain.out" 2>&1 || fail "the run off a terminal failed"
if grep -q $'\033\[2K' "$scratch/plain.out"; then fail "a bar was drawn off a terminal"; fi
grep -q "^step 4/8 | loss" "$scratch/plain.out" || fail "off a terminal, step 4's line is missing"
echo "off a terminal: no bar, the step lines"
echo "PASS"
