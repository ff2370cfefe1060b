# Dependencies, each found the standard way (DESIGN.md: Debian 12 packages).
find_package(Boost 1.74 REQUIRED COMPONENTS program_options)
find_package(TBB REQUIRED)
find_package(tomlplusplus REQUIRED)
find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(MPI REQUIRED COMPONENTS CXX)
# gloo (libgloo-dev): the collectives of torchrun-style launches.
find_package(Gloo REQUIRED)

# jemalloc is the allocator of the ztrain executable (framework/app/
# malloc_conf.cpp says why); Debian ships no CMake config, only pkg-config.
find_package(PkgConfig REQUIRED)
pkg_check_modules(JEMALLOC REQUIRED IMPORTED_TARGET jemalloc)
# liburing: the NVMe tier's asynchronous direct I/O (shard/aio.h).
pkg_check_modules(LIBURING REQUIRED IMPORTED_TARGET liburing)
# PCRE2 (libpcre2-dev): the tokenizers' split patterns, with Unicode classes.
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
# SentencePiece (libsentencepiece-dev): Llama 2's tokenizer.model files, run
# by SentencePiece itself.
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)
# Protocol Buffers (libprotobuf-dev, protobuf-compiler): TensorBoard's event
# records, encoded by the library from framework/proto/ (lite runtime).
find_package(Protobuf 3.12 REQUIRED)

# OpenBLAS ships a config file with variables only; wrap it in a target.
# libztrain takes only its headers: it opens the library itself at load
# time, after choosing its kernels (framework/src/kernels/cpu/blas.h says
# why).
find_package(OpenBLAS CONFIG REQUIRED)
if(NOT TARGET ztrain_openblas_headers)
  add_library(ztrain_openblas_headers INTERFACE IMPORTED)
  target_include_directories(ztrain_openblas_headers INTERFACE ${OpenBLAS_INCLUDE_DIRS})
endif()

# CUDA and NCCL are optional: with the toolkit (nvcc and the libraries)
# the CUDA backend, framework/cuda, is built; without it, everything else.
set(ZTRAIN_HAVE_CUDA OFF)
set(ZTRAIN_HAVE_NCCL OFF)
if(ZTRAIN_ENABLE_CUDA)
  find_package(CUDAToolkit QUIET)
  include(CheckLanguage)
  check_language(CUDA)
  if(CUDAToolkit_FOUND AND CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    # CMake 3.25's NVIDIA rules stop at C++17; nvcc 12 and later take
    # C++20, which the SDK headers the CUDA sources include need.
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(ZTRAIN_HAVE_CUDA ON)
    find_library(ZTRAIN_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
    if(ZTRAIN_NCCL_LIBRARY)
      set(ZTRAIN_HAVE_NCCL ON)
    endif()
  endif()
endif()
message(STATUS "ztrain: CUDA toolkit ${ZTRAIN_HAVE_CUDA} (${CUDAToolkit_VERSION}), NCCL ${ZTRAIN_HAVE_NCCL}")
