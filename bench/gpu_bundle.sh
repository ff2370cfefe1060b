#!/usr/bin/env bash
# Packs what bench/gpu_check.sh needs into one archive for a GPU machine
# that has the NVIDIA driver and CUDA's libraries but not this project's
# Debian dependencies: ztrain, its plugins, libztrain_cuda, the GPU tests
# and bench_cuda_kernels, every shared library they load that is neither
# the C/C++ runtime nor CUDA's (those must come from the GPU machine), the
# configs, and run.sh, which finds CUDA's libraries there and runs the
# check. The build is made portable (ZTRAIN_NATIVE=OFF: no -march=native)
# since the GPU machine's CPU may differ.
#
# usage: bench/gpu_bundle.sh [BUILD_DIR] [OUT_DIR]
#   BUILD_DIR: default build-portable (configured and built when it holds
#   no ztrain); OUT_DIR: default .gpu_bundle (holds ztrain-gpu.tar.xz).
# On the GPU machine:
#   mkdir -p /tmp/z && tar xJf ztrain-gpu.tar.xz -C /tmp/z && /tmp/z/run.sh
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath -m "${1:-$src/build-portable}")
out=$(realpath -m "${2:-$src/.gpu_bundle}")
if [ ! -x "$build/bin/ztrain" ]; then
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZTRAIN_NATIVE=OFF
  cmake --build "$build" -j "$(nproc)"
fi
[ -f "$build/lib/libztrain_cuda.so" ] || { echo "$build has no CUDA backend" >&2; exit 1; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/deps" "$stage/bench"
for b in ztrain test_cuda_device test_cuda_kernels test_nccl bench_cuda_kernels; do
  [ -x "$build/bin/$b" ] && cp "$build/bin/$b" "$stage/bin/"
done
cp -a "$build"/lib/libztrain*.so* "$stage/lib/"
mkdir -p "$stage/lib/ztrain" && cp -a "$build/lib/ztrain/plugins" "$stage/lib/ztrain/"
cp -a "$src/configs" "$stage/"
cp "$src/bench/gpu_check.sh" "$src/bench/bench_gpu_train.sh" "$src/bench/bench_pipeline.sh" \
  "$stage/bench/"
# Every library the binaries and plugins load, but the C and C++ runtimes
# (the GPU machine's own, which are at least as new) and CUDA's.
for f in "$stage"/bin/* "$stage"/lib/*.so "$stage"/lib/ztrain/plugins/*.so; do ldd "$f"; done |
  awk '/=> \// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*)\.so' |
  grep -v -E '/lib(cuda|cudart|cublas|cublasLt|nccl)\.so' | grep -v -F "$build" |
  while read -r lib; do cp -L "$lib" "$stage/deps/"; done
cat > "$stage/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs bench/gpu_check.sh from this bundle: its libraries first, then the
# directories holding this machine's CUDA runtime, cuBLASLt and NCCL.
here=$(cd "$(dirname "$0")" && pwd)
dirs=$here/lib:$here/deps
for f in libcudart.so.13 libcublasLt.so.13 libnccl.so.2; do
  d=$(find /usr/local /usr/lib /opt -name "$f" 2>/dev/null | head -1)
  [ -n "$d" ] && dirs=$dirs:$(dirname "$d") || echo "run.sh: $f not found on this machine" >&2
done
export LD_LIBRARY_PATH=$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
exec "$here/bench/gpu_check.sh" "$here" "$@"
RUN
chmod +x "$stage/run.sh"
mkdir -p "$out"
tar cJf "$out/ztrain-gpu.tar.xz" -C "$stage" .
ls -la "$out/ztrain-gpu.tar.xz"
