#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# no_toolkit_headers.sh BUILD_DIR MAKE_PROGRAM
#
# Fails if any object of the build included a header of a CUDA toolkit:
# building nvtaskset must need none (cudaapi/ declares the driver API it uses).
# Reads the headers each object really included, as the compiler reported them
# (ninja's dependency log, or the .d files the Makefile generator keeps), so a
# cuda.h reached through the default include path (/usr/include/cuda.h from a
# distribution package) counts as much as one under /usr/local/cuda. The one
# exception is the check that compares our declarations with cuda.h.
set -eu
build=$1
make=$2
exempt='nvtaskset_cuda_api_check.dir/'

# One "OBJECT HEADER" line per dependency.
deps() {
  if [ -f "$build/build.ninja" ]; then
    "$make" -C "$build" -t deps | awk '
      /^[^ \t]/ { obj = $1; sub(/:$/, "", obj); next }
      NF { print obj, $1 }'
  else
    find "$build" -name '*.o.d' -exec awk '
      FNR == 1 { obj = "" }
      { for (i = 1; i <= NF; ++i) {
          if ($i == "\\") continue
          if (obj == "" && $i ~ /:$/) { obj = $i; sub(/:$/, "", obj); continue }
          if (obj != "") print obj, $i } }' {} +
  fi
}

deps | awk -v exempt="$exempt" '
  index($1, exempt) { next }
  { objects[$1] = 1 }
  $2 ~ /cuda_driver_api\.hpp$/ { ours[$1] = 1 }
  # cuda.h, cuda_runtime.h, cudaTypedefs.h, ... (not the unrelated
  # linux/cuda.h and boost/predef/language/cuda.h); anything in a directory
  # named cuda or cuda-X.Y; the toolkit layout targets/<arch>/include.
  ($2 ~ /(^|\/)cuda[^\/]*\.h$/ && $2 !~ /\/(linux|boost\/predef\/language)\/cuda\.h$/) ||
  $2 ~ /\/cuda(-[0-9][0-9.]*)?\// || $2 ~ /\/targets\/[^\/]+\/include\// {
    print "no_toolkit_headers: " $1 " includes " $2; bad = 1
  }
  END {
    n = 0; for (o in objects) ++n
    m = 0; for (o in ours) ++m
    # Nothing read, or no object using our declarations: the scan saw nothing
    # it could judge, which must not pass as "clean".
    if (n == 0) { print "no_toolkit_headers: no dependency records found (build first)"; exit 1 }
    if (m == 0) { print "no_toolkit_headers: no object includes cuda_driver_api.hpp: the scan cannot be right"; exit 1 }
    if (bad) { print "no_toolkit_headers: the build used CUDA toolkit headers (see above)"; exit 1 }
    printf "no_toolkit_headers: %d objects, none includes a CUDA toolkit header; %d use cuda_driver_api.hpp\n", n, m
  }'
