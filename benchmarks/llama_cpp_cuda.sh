#!/usr/bin/env bash
# Build llama.cpp's llama-bench for NVIDIA sm_90 (H100/H200) from the llama.cpp that
# llama-cpp-python 0.3.36 vendors, on a machine with nvcc and cuBLAS but no GPU, so that the
# comparisons in BENCHMARKS.md run it beside forge on the lent GPU machine (which cannot fetch).
#
#   bash benchmarks/llama_cpp_cuda.sh SDIST_DIR OUT_DIR
#
# SDIST_DIR: the unpacked sdist (pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36).
# Writes OUT_DIR/llama-bench (static ggml/llama; needs libcudart.so.13 and libcublas.so.13 at run
# time). VMM is off because the CUDA driver library (libcuda.so) is absent where this builds;
# NCCL is off (one GPU). About 40 minutes on 2 cores.
set -euo pipefail
src=$1/vendor/llama.cpp
out=$2
build=$(mktemp -d)
cmake -G Ninja -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_NCCL=OFF -DGGML_CUDA_NO_VMM=ON -DGGML_NATIVE=OFF \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
ninja -C "$build" llama-bench
mkdir -p "$out"
strip -o "$out/llama-bench" "$build/bin/llama-bench"
echo "$out/llama-bench"
