#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
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
test -f "$prefix/lib/pkgconfig/nvtaskset.pc"
# Only the public API is installed: internals stay in the tree.
test -f "$prefix/include/nvtaskset/control_region.hpp"
for internal in tmd.hpp launch_hook.hpp driver_locate.hpp; do
  if test -e "$prefix/include/nvtaskset/$internal"; then echo "internal header installed: $internal"; exit 1; fi
done
out=$(NVTASKSET_REAL_LIBCUDA="$fake" FAKECUDA_RECORD="$prefix/record" "$prefix/bin/nvtaskset" --no-mps -t 1 \
      "$launcher" --kernels 1 --print-env LD_LIBRARY_PATH)
case "$out" in *"$prefix/lib/nvtaskset"*) ;; *) echo "task did not get the installed shim: $out"; exit 1;; esac
grep -q ' 0xfffffffffffffffd launch$' "$prefix/record" || { echo "mask not applied: $(cat "$prefix/record")"; exit 1; }
# --verify: the installed CLI starts its probe process, which loads the
# installed shim (the stand-in runs the probe kernel).
out=$(NVTASKSET_REAL_LIBCUDA="$fake" "$prefix/bin/nvtaskset" --verify --seed 1) || { echo "--verify failed: $out"; exit 1; }
case "$out" in *"PASS: all 23 partitions"*) ;; *) echo "--verify did not pass: $out"; exit 1;; esac
# Shell completion: installed, and it completes options and the PIDs of
# partitioned tasks.
comp="$prefix/share/bash-completion/completions/nvtaskset"
test -f "$comp" && test -f "$prefix/share/zsh/site-functions/_nvtaskset"
complete_words() {  # the words bash would offer for the command line "$@" (last word: the one being typed)
  bash -c 'source "$0"; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _nvtaskset; printf "%s\n" "${COMPREPLY[@]}"' "$comp" "$@"
}
# Captured first: `complete_words ... | grep -q` under pipefail fails whenever
# grep exits before the writer is done (SIGPIPE), which made this test flaky.
offers() { local words; words=$(complete_words "${@:2}"); grep -qx -- "$1" <<<"$words"; }
offers --system-wide nvtaskset --sys || { echo "completion: no --system-wide"; exit 1; }
offers enable nvtaskset --system-wide e || { echo "completion: no enable"; exit 1; }
offers --verify nvtaskset --ver || { echo "completion: no --verify"; exit 1; }
offers --status nvtaskset --sta || { echo "completion: no --status"; exit 1; }
offers --count nvtaskset --cou || { echo "completion: no --count"; exit 1; }
# Every long option --help names is completed, by bash and by zsh.
longs=$(complete_words nvtaskset --)
for o in $("$prefix/bin/nvtaskset" --help | grep -o -- '--[a-z][a-z-]*' | sort -u); do
  grep -qx -- "$o" <<<"$longs" || { echo "bash completion: no $o"; exit 1; }
  grep -q -- "$o" "$prefix/share/zsh/site-functions/_nvtaskset" || { echo "zsh completion: no $o"; exit 1; }
done
NVTASKSET_REAL_LIBCUDA="$fake" FAKECUDA_RECORD="$prefix/record2" "$prefix/bin/nvtaskset" --no-mps -t 1 \
  "$launcher" --until-file "$prefix/until" --interval-ms 5 --ready-file "$prefix/ready" >/dev/null &
for _ in $(seq 200); do test -f "$prefix/ready" && break; sleep 0.05; done
task=$(cat "$prefix/ready")
pids=$(complete_words nvtaskset -p "")
touch "$prefix/until"; wait
echo "$pids" | grep -qx "$task" || { echo "completion: partitioned pid $task not offered: $pids"; exit 1; }
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
# The same consumer through pkg-config.
flags=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs nvtaskset)
c++ -std=c++20 "$prefix/consumer/main.cpp" -o "$prefix/consumer/pc-consumer" $flags -lpthread -ldl -lrt
"$prefix/consumer/pc-consumer"
echo "install layout: ok"
