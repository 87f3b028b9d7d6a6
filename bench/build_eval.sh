#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds everything bench/run_eval.sh runs on a GPU machine into one directory
# (default .dev/eval), to be carried there:
#   DIR/cuda/{first_kernel,launch_latency,gpuwork,persistent,copy_pipeline}   the CUDA programs of bench/cuda/ (nvcc)
#   DIR/nvt/bin/nvtaskset, DIR/nvt/lib/nvtaskset/                nvtaskset and its shim (stripped copies
#   DIR/nvt/bench/{bench_startup,bench_persistent}              of a CMake build, same layout as install)
#
#   bench/build_eval.sh [DIR] [BUILD_DIR]     BUILD_DIR: a configured CMake build (default build)
# Environment: NVCC (default /usr/local/cuda/bin/nvcc), CUDA_ARCH (default sm_90: H100/H200).
# The CUDA programs are not part of the CMake build because CI has no CUDA toolkit.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.dev/eval}
BUILD=${2:-build}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
ARCH=${CUDA_ARCH:-sm_90}
mkdir -p "$DIR/cuda" "$DIR/nvt/bin" "$DIR/nvt/lib" "$DIR/nvt/bench"
flags=(-arch="$ARCH" -O2 -std=c++17 -lineinfo)
"$NVCC" "${flags[@]}" -o "$DIR/cuda/first_kernel" bench/cuda/first_kernel.cu
"$NVCC" "${flags[@]}" -o "$DIR/cuda/launch_latency" bench/cuda/launch_latency.cu
"$NVCC" "${flags[@]}" -o "$DIR/cuda/gpuwork" bench/cuda/gpuwork.cu -lcuda
"$NVCC" "${flags[@]}" -o "$DIR/cuda/persistent" bench/cuda/persistent.cu
"$NVCC" "${flags[@]}" -o "$DIR/cuda/copy_pipeline" bench/cuda/copy_pipeline.cu
cmake --build "$BUILD" --target nvtaskset nvtaskset_shim bench_startup bench_persistent
install -m 755 -s "$BUILD/bin/nvtaskset" "$DIR/nvt/bin/nvtaskset"
rm -rf "$DIR/nvt/lib/nvtaskset"
cp -a "$BUILD/lib/nvtaskset" "$DIR/nvt/lib/nvtaskset"
strip --strip-unneeded "$DIR/nvt/lib/nvtaskset/libcuda.so.1"
install -m 755 -s "$BUILD/bench/bench_startup" "$DIR/nvt/bench/bench_startup"
install -m 755 -s "$BUILD/bench/bench_persistent" "$DIR/nvt/bench/bench_persistent"
du -sh "$DIR"
echo "built into $DIR; on the GPU machine: bench/run_eval.sh --quick $DIR (carry $DIR)"
