#!/usr/bin/env bash
# The largest Llama this machine trains, per strategy (issue 34), on
# configs/examples/llama_nvme.toml's shape (3072 wide, bf16, 1 x 128
# tokens a step) with only n_layer varied:
#  1. the drive under NVME_DIR: sequential write and read bandwidth with
#     O_DIRECT (dd, 4 GiB in 16 MiB blocks), the yardstick for the disk
#     bound;
#  2. for zero3, zero3_offload (parameters in host memory) and zero3_nvme
#     (the example's [strategy]: nvme_offload with parameters and optimizer
#     state in swap files, sub_group_size "auto"), the largest n_layer
#     whose `ztrain estimate` fits this machine: the device and host tiers
#     (on the cpu device both are RAM) within the memory available now
#     (MemAvailable) less 1 GiB, and the nvme tier within NVME_DIR's free
#     space less 2 GiB (measured: a zero3 run whose estimate left 1.5 GiB
#     of MemTotal free was killed by the kernel, other processes holding
#     2 GiB);
#  3. each of those trained for STEPS steps at world 1 (2 threads): step
#     time from metrics.jsonl, peak RSS (VmHWM), and the bytes the process
#     read and wrote per step (/proc/PID/io, which counts O_DIRECT transfers,
#     sampled as each step is logged); two disk bounds: serial, read bytes
#     over the read bandwidth plus written bytes over the write bandwidth
#     (as if the drive did one at a time), and overlapped, the larger of
#     the two (as if it did both at once at those rates); the step's ratio
#     to each is printed. (Measured: a step below the serial bound, so this
#     drive reads and writes at once.)
# A step is timed only after the first (the first step's figures include
# the parameter gathers' first reads, traced before any prefetch).
#
#   bench/bench_largest.sh [BUILD_DIR] [NVME_DIR] [STEPS] [STRATEGIES]
#   (STRATEGIES: comma-separated, default zero3_nvme,zero3,zero3_offload)
set -euo pipefail
build=${1:-build}
nvme=${2:-/var/tmp/ztrain-largest}
steps=${3:-3}
strategies=${4:-zero3_nvme,zero3,zero3_offload}
src=$(cd "$(dirname "$0")/.." && pwd)
ztrain=$(realpath "$build/bin/ztrain")
config=$src/configs/examples/llama_nvme.toml
mkdir -p "$nvme"
out=$(mktemp -d)
trap 'rm -rf "$out" "$nvme/bench_largest.dd"' EXIT

# 1. The drive.
dd_rate() {  # dd_rate DD-ARGS...: bytes per second dd reports
  dd "$@" 2>&1 | awk '/copied/ { for (i = 1; i <= NF; ++i) if ($i == "s,") print $1 / $(i - 1) }'
}
write_bw=$(dd_rate if=/dev/zero of="$nvme/bench_largest.dd" bs=16M count=256 oflag=direct)
read_bw=$(dd_rate if="$nvme/bench_largest.dd" of=/dev/null bs=16M iflag=direct)
rm -f "$nvme/bench_largest.dd"
ram=$(awk '/^MemAvailable:/ { print $2 * 1024 }' /proc/meminfo)
free_disk=$(df -B1 --output=avail "$nvme" | tail -n 1)
ram_limit=$(awk -v r="$ram" 'BEGIN { printf "%.0f", r - 2^30 }')
disk_limit=$(awk -v f="$free_disk" 'BEGIN { printf "%.0f", f - 2 * 2^30 }')
printf 'drive under %s: write %.2f GB/s, read %.2f GB/s; available RAM %.2f GiB, free disk %.2f GiB\n' \
  "$nvme" "$(awk -v b="$write_bw" 'BEGIN { print b / 1e9 }')" \
  "$(awk -v b="$read_bw" 'BEGIN { print b / 1e9 }')" \
  "$(awk -v b="$ram" 'BEGIN { print b / 2^30 }')" "$(awk -v b="$free_disk" 'BEGIN { print b / 2^30 }')"

run_args=()
set_args() {  # set_args STRATEGY N_LAYER: the run's options, into run_args
  run_args=(--set model.n_layer="$2" --set device.threads=2)
  case $1 in
    zero3_offload) run_args+=(--strategy zero3_offload --set strategy.offload_param.device=cpu) ;;
    # The example's own [strategy]: the zero3_nvme preset's plugin with the
    # parameters on disk too and a read buffer that holds a block.
    zero3_nvme) run_args+=(--set strategy.offload_optimizer.nvme_path="$nvme"
      --set strategy.offload_param.nvme_path="$nvme") ;;
    *) run_args+=(--strategy "$1") ;;
  esac
}

# 2. The largest n_layer each strategy's estimate fits.
fits() {  # fits STRATEGY N_LAYER
  local e
  set_args "$1" "$2"
  e=$("$ztrain" estimate "${run_args[@]}" "$config") || return 1
  sed -n 's/.*(llama, \([0-9]*\) params).*/\1/p' <<< "$e" > "$out/$1.$2.params"
  awk -v ram="$ram_limit" -v disk="$disk_limit" '
    $2 == "total" && ($1 == "device" || $1 == "host") { mem += $3 }
    $2 == "total" && $1 == "nvme" { nv = $3 }
    END { exit !(mem <= ram && nv <= disk) }' <<< "$e"
}
largest() {  # largest STRATEGY: bisection over n_layer in [1, 256]
  local lo=0 hi=257 mid
  while [ $((hi - lo)) -gt 1 ]; do
    mid=$(((lo + hi) / 2))
    if fits "$1" "$mid"; then lo=$mid; else hi=$mid; fi
  done
  echo "$lo"
}

# 3. Train each for STEPS steps, sampling the process's I/O at each step.
train() {  # train STRATEGY N_LAYER
  local name=$1 dir=$out/$1 pid logged=0 n io hwm=0
  set_args "$1" "$2"
  "$ztrain" "${run_args[@]}" --set train.steps="$steps" --set train.out_dir="$dir" \
    "$config" > "$out/$name.log" 2>&1 &
  pid=$!
  : > "$out/$name.io"
  while kill -0 "$pid" 2> /dev/null; do
    io=$(awk '/^read_bytes|^write_bytes/ { printf "%s ", $2 }' "/proc/$pid/io" 2> /dev/null || true)
    hwm=$(awk -v h="$hwm" '/^VmHWM/ { h = $2 * 1024 } END { print h }' "/proc/$pid/status" 2> /dev/null || echo "$hwm")
    n=$(grep -c '"split": "train"' "$dir/metrics.jsonl" 2> /dev/null || true)
    if [ "${n:-0}" -gt "$logged" ] && [ -n "$io" ]; then
      echo "$n $io" >> "$out/$name.io"
      logged=$n
    fi
    sleep 0.5
  done
  wait "$pid" || { cat "$out/$name.log"; echo "$name: training failed" >&2; return 1; }
  echo "$hwm" > "$out/$name.hwm"
}

IFS=, read -r -a names <<< "$strategies"
declare -A layers
for s in "${names[@]}"; do
  layers[$s]=$(largest "$s")
  echo "$s: largest n_layer that fits: ${layers[$s]}"
done
failed=()
for s in "${names[@]}"; do train "$s" "${layers[$s]}" || failed+=("$s"); done

printf '\n| strategy | n_layer | parameters | step (s) | peak RSS (GiB) | read/step (GB) | written/step (GB) | disk bound, serial / overlapped (s) | step / bound |\n'
printf '|---|---|---|---|---|---|---|---|---|\n'
for s in "${names[@]}"; do
  if [[ " ${failed[*]} " == *" $s "* ]]; then
    echo "| $s | ${layers[$s]} | failed (its log is above) |"
    continue
  fi
  params=$(cat "$out/$s.${layers[$s]}.params")
  step=$(grep '"split": "train"' "$out/$s/metrics.jsonl" | tail -n +2 |
    sed -n 's/.*"step_time_s": \([0-9.e+-]*\).*/\1/p' | awk '{ s += $1; n++ } END { print s / n }')
  # Bytes per step: between the first logged step and the last.
  read -r n1 r1 w1 < <(head -n 1 "$out/$s.io")
  read -r n2 r2 w2 < <(tail -n 1 "$out/$s.io")
  awk -v s="$s" -v l="${layers[$s]}" -v p="$params" -v t="$step" -v hwm="$(cat "$out/$s.hwm")" \
    -v n=$((n2 - n1)) -v r=$((r2 - r1)) -v w=$((w2 - w1)) -v rb="$read_bw" -v wb="$write_bw" 'BEGIN {
      rs = n > 0 ? r / n : 0; ws = n > 0 ? w / n : 0
      serial = rs / rb + ws / wb; overlapped = (rs / rb > ws / wb ? rs / rb : ws / wb)
      ratio = (serial > 0.5 ? sprintf("%.2f / %.2f", t / serial, t / overlapped) : "-")
      printf "| %s | %d | %.2fB | %.1f | %.1f | %.1f | %.1f | %.1f / %.1f | %s |\n", s, l, p / 1e9,
        t, hwm / 2^30, rs / 1e9, ws / 1e9, serial, overlapped, ratio }'
done
