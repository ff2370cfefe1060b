#!/usr/bin/env bash
# The CPU AdamW against PyTorch's and DeepSpeed's on this CPU, alternating
# rounds in one script: ztrain's bench_adamw (the fast kernel, fp32 and
# writing bf16 working copies, the reference, and the stream bandwidth it
# measures) against torch.optim.AdamW (fused, foreach) and DeepSpeedCPUAdam
# over the same number of fp32 elements and threads, both with huge pages.
# Prints ns per element per round, the ratios of the better rounds, and
# each side's bandwidth as a share of the stream's (the memory bound).
#
#   bench/bench_adamw.sh [BUILD_DIR] [PYTHON] [N] [ROUNDS]
# PYTHON: an interpreter with torch and deepspeed (e.g. a venv's python).
set -euo pipefail
build=${1:-build}
python=${2:-python3}
n=${3:-1e8}
rounds=${4:-2}
src=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for r in $(seq "$rounds"); do
  "$build/bin/bench_adamw" --n "$n" --threads 2 --rounds 3 > "$out/ztrain.$r"
  # THP_MEM_ALLOC_ENABLE: PyTorch's own switch for huge pages on large CPU
  # tensors, as the cpu device advises them for its large blocks.
  THP_MEM_ALLOC_ENABLE=1 "$python" "$src/bench/adamw_peers.py" --n "$n" --threads 2 > "$out/peers.$r"
  echo "round $r:"
  sed 's/^/  ztrain: /' "$out/ztrain.$r"
  sed 's/^/  peer (ns\/element): /' "$out/peers.$r"
done
best() { sort -g | head -n 1; }
# The peers move 28 bytes per element and leave the gradient alone: the
# kernel as the sharded strategies run it.
ours=$(for r in $(seq "$rounds"); do sed -n 's/^fast kernel, fp32, g kept (28 B) *\([0-9.]*\) ns.*/\1/p' "$out/ztrain.$r"; done | best)
# The bandwidth bound: the best round's stream (bench_adamw's own loop
# over the same arrays, 32 B per element) against the 28 B per element
# each side must move; at 100 % a kernel cannot go faster on this memory.
stream=$(for r in $(seq "$rounds"); do sed -n 's/^stream .*, \([0-9.]*\) GB\/s$/\1/p' "$out/ztrain.$r"; done | sort -g | tail -n 1)
share() { awk -v ns="$1" -v s="$stream" 'BEGIN { printf "%.1f GB/s, %.0f%% of the stream'"'"'s %.1f GB/s", 28 / ns, 100 * 28 / ns / s, s }'; }
echo "ztrain: $ours ns/element, $(share "$ours")"
for peer in fused foreach deepspeed; do
  theirs=$(for r in $(seq "$rounds"); do awk -v p="$peer" '$1 == p { print $2 }' "$out/peers.$r"; done | best)
  [ -n "$theirs" ] || continue
  awk -v a="$ours" -v b="$theirs" -v p="$peer" \
    'BEGIN { printf "ztrain %.3f ns/element against %s %.3f: %.2fx faster\n", a, p, b, b / a }'
  echo "  $peer: $(share "$theirs")"
done
