#!/usr/bin/env bash
# The GPU check: what a person with one NVIDIA GPU runs in one go (about
# 5-8 minutes with the build in place) to see ztrain's CUDA backend work
# there. It runs
#   1. every GPU test (the cuda device, every cuda kernel against its cpu
#      reference, the nccl communicator; tests/cuda),
#   2. every strategy at world 1 on the GPU against the same run on the
#      CPU (losses and gradient norms, fp32 and bf16),
#   3. the kernels' throughput at GPT-2 124M's shapes (bench_cuda_kernels),
#   4. training figures (bench/bench_gpu_train.sh): MFU of gpt2-124m and a
#      350M shape in bf16, zero3_offload against zero3, and the largest
#      Llama-shaped model each of zero3 and zero3_offload fits,
#   5. on the machine's CPU cores, where it has 8 or more, pipeline 2's
#      and 4's idle time per stage against (P-1)/(M+P-1)
#      (bench/bench_pipeline.sh's idle part: pipeline 4 needs 4 free cores,
#      which the 2-core development machines lack),
# and prints one table at the end.
#
# usage: bench/gpu_check.sh [BUILD_DIR] [PEAK_BF16_TFLOPS]
#   BUILD_DIR: a build with the CUDA backend (default: build-gpu, configured
#   and built here if it holds no ztrain yet); a directory holding bin/ and
#   lib/ (a bundle made by bench/gpu_bundle.sh) works too.
#   PEAK_BF16_TFLOPS: the card's dense bf16 peak (default 989: H100/H200 SXM).
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build-gpu}
peak=${2:-989}
rows=()
row() { rows+=("| $1 | $2 | $3 |"); }

if [ ! -x "$build/bin/ztrain" ]; then
  echo "== building $build (Release, CUDA for sm_80/sm_90)"
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZTRAIN_NATIVE=OFF > "$build.log" 2>&1 &&
    cmake --build "$build" -j "$(nproc)" >> "$build.log" 2>&1 ||
    { tail -30 "$build.log"; echo "the build failed (log: $build.log)"; exit 1; }
fi
bin=$build/bin
if [ ! -x "$bin/test_cuda_kernels" ]; then
  echo "$build has no GPU tests: the CUDA toolkit was not found when it was configured" >&2
  exit 1
fi
command -v nvidia-smi > /dev/null &&
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
scratch=$(mktemp -d "${TMPDIR:-/tmp}/ztrain-gpu-check.XXXXXX")
# zero3_nvme's swap files need a real disk (/tmp may be tmpfs):
# ZTRAIN_NVME_DIR, else beside the build.
nvme=$(mktemp -d "${ZTRAIN_NVME_DIR:-$build}/nvme-check.XXXXXX")
trap 'rm -rf "$scratch" "$nvme"' EXIT

# 1. The GPU tests.
for t in test_cuda_device test_cuda_kernels test_nccl; do
  [ -x "$bin/$t" ] || continue
  start=$(date +%s.%N)
  "$bin/$t" > "$scratch/$t.log" 2>&1
  rc=$?
  secs=$(echo "$(date +%s.%N) - $start" | bc)
  summary=$(grep -E "test cases:|skipped:" "$scratch/$t.log" | tail -1 | sed 's/\[doctest\] //')
  case $rc in
    0) row "$t" "passed" "$summary (${secs%.*} s)" ;;
    77) row "$t" "SKIPPED" "$summary" ;;
    *) row "$t" "FAILED (exit $rc)" "$summary"; sed -n '1,60p' "$scratch/$t.log" ;;
  esac
done

# 2. Every strategy at world 1: the GPU run against the CPU run.
base=(--model gpt2-tiny --set train.steps=8 --set train.global_batch_size=8
  --set train.micro_batch_size=4 --set train.eval_every=0 --set train.save_final=false
  --set train.log_every=1 --set device.threads=4)
curve() {
  grep '"split": "train"' "$1" |
    sed -n 's/.*"step": \([0-9]*\),.*"loss": \([^,]*\),.*"grad_norm": \([^,]*\),.*/\1 \2 \3/p'
}
# worst REF OTHER: the largest relative loss and norm differences.
worst() {
  awk 'NR == FNR { l[FNR] = $2; g[FNR] = $3; n = FNR; next }
       { dl = l[FNR] - $2; if (dl < 0) dl = -dl; dl /= (l[FNR] < 0 ? -l[FNR] : l[FNR])
         dg = g[FNR] - $3; if (dg < 0) dg = -dg; dg /= (g[FNR] < 0 ? -g[FNR] : g[FNR])
         if (dl > ml) ml = dl; if (dg > mg) mg = dg }
       END { if (FNR != n || n == 0) print "misaligned"; else printf "%.2g %.2g", ml, mg }' "$1" "$2"
}
for precision in fp32 bf16; do
  # Tolerances: the GPU sums in other orders (fp32), and a bf16 run's
  # GEMMs take activations rounded to bf16 where the CPU keeps fp32.
  tol=$([ $precision = fp32 ] && echo 1e-4 || echo 2e-2)
  "$bin/ztrain" "${base[@]}" --set train.precision=$precision --set device.kind=cpu \
    --set train.out_dir="$scratch/cpu-$precision" \
    "$src/configs/run.toml" > "$scratch/cpu-$precision.out" 2>&1 ||
    { row "cpu reference $precision" "FAILED" "$(tail -1 "$scratch/cpu-$precision.out")"; continue; }
  curve "$scratch/cpu-$precision/metrics.jsonl" > "$scratch/cpu-$precision.curve"
  for s in ddp zero1 zero2 zero3 zero2_offload zero3_offload cpu_offload zero3_nvme; do
    name=$s-$precision
    extra=()
    [ "$s" != zero3_nvme ] || extra=(--set strategy.offload_optimizer.nvme_path="$nvme")
    if ! "$bin/ztrain" "${base[@]}" --set train.precision=$precision --set device.kind=cuda \
      --strategy "$s" "${extra[@]}" --set train.out_dir="$scratch/$name" "$src/configs/run.toml" \
      > "$scratch/$name.out" 2>&1; then
      row "$s world 1 $precision" "FAILED" "$(grep -m1 -i error "$scratch/$name.out" | cut -c1-150)"
      continue
    fi
    curve "$scratch/$name/metrics.jsonl" > "$scratch/$name.curve"
    set -- $(worst "$scratch/cpu-$precision.curve" "$scratch/$name.curve")
    if [ "$1" = misaligned ]; then
      row "$s world 1 $precision" "FAILED" "logged other steps than the cpu run"
    elif awk -v a="$1" -v b="$2" -v t="$tol" 'BEGIN { exit !(a <= t && b <= 5 * t) }'; then
      row "$s world 1 $precision" "passed" "vs cpu: loss $1, norm $2 (tolerance $tol)"
    else
      row "$s world 1 $precision" "FAILED" "vs cpu: loss $1, norm $2 (tolerance $tol)"
    fi
  done
done

# 3. Kernel throughput.
if [ -x "$bin/bench_cuda_kernels" ]; then
  "$bin/bench_cuda_kernels" "$peak" > "$scratch/bench.log" 2>&1
  while IFS= read -r line; do
    case $line in
      "| op "* | "|---"*) ;;
      "| "*) IFS='|' read -r _ op shape ms rate _ <<< "$line"
        row "bench:${op% }" "${ms# } ms" "${rate# }${shape:+ (${shape# })}" ;;
    esac
  done < "$scratch/bench.log"
fi

# 4. Training figures (their rows come ready-made).
if [ -x "$src/bench/bench_gpu_train.sh" ]; then
  while IFS= read -r line; do
    case $line in "| "*) rows+=("$line") ;; esac
  done < <("$src/bench/bench_gpu_train.sh" "$build" "$peak" 2>&1)
fi

# 5. Pipeline idle time on the CPU cores.
if [ -x "$src/bench/bench_pipeline.sh" ] && [ "$(nproc)" -ge 8 ]; then
  if "$src/bench/bench_pipeline.sh" "$build" 6 idle > "$scratch/pipeline.log" 2>&1; then
    while read -r stages schedule m rest; do
      case $stages in [0-9]*) ;; *) continue ;; esac
      read -ra f <<< "$rest"  # the shares per stage, the formula, last/first
      n=${#f[@]}
      row "pipeline $stages $schedule M=$m idle (cpu)" "${f[*]:0:n-2}" \
        "formula ${f[n-2]}, last stage's compute / first's ${f[n-1]}"
    done < "$scratch/pipeline.log"
  else
    row "pipeline idle (cpu)" "FAILED" "$(tail -1 "$scratch/pipeline.log" | cut -c1-150)"
  fi
fi

echo
echo "| check | result | detail |"
echo "|---|---|---|"
printf '%s\n' "${rows[@]}"
! printf '%s\n' "${rows[@]}" | grep -q FAILED
