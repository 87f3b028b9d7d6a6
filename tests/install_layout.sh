#!/usr/bin/env bash
# `cmake --install` gives bin/nvtaskset + lib/nvtaskset/libcuda.so.1, and the
# installed CLI finds its shim and partitions a task (against the stand-in
# driver); `find_package(nvtaskset)` works from the installed prefix.
set -euo pipefail
build=$1 src=$2 fake=$3 launcher=$4
prefix=$(mktemp -d /tmp/nvtaskset-install-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
test -x "$prefix/bin/nvtaskset"
test -f "$prefix/lib/nvtaskset/libcuda.so.1"
test -f "$prefix/share/man/man1/nvtaskset.1"
test -f "$prefix/lib/cmake/nvtaskset/nvtasksetConfig.cmake"
out=$(NVTASKSET_REAL_LIBCUDA="$fake" FAKECUDA_RECORD="$prefix/record" "$prefix/bin/nvtaskset" --no-mps -t 1 \
      "$launcher" --kernels 1 --print-env LD_LIBRARY_PATH)
case "$out" in *"$prefix/lib/nvtaskset"*) ;; *) echo "task did not get the installed shim: $out"; exit 1;; esac
grep -q ' 0xfffffffffffffffd launch$' "$prefix/record" || { echo "mask not applied: $(cat "$prefix/record")"; exit 1; }
# A consumer project.
mkdir -p "$prefix/consumer"
cat > "$prefix/consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(consumer CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(nvtaskset REQUIRED)
add_executable(consumer main.cpp)
target_link_libraries(consumer PRIVATE nvtaskset::control)
CM
cat > "$prefix/consumer/main.cpp" <<'CPP'
#include <nvtaskset/control_region.hpp>
int main() { return nvtaskset::ctl::region_name(42) == "nvtaskset.42" ? 0 : 1; }
CPP
cmake -S "$prefix/consumer" -B "$prefix/consumer/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/consumer/build" >/dev/null
"$prefix/consumer/build/consumer"
echo "install layout: ok"
