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

# One "OBJECT<TAB>HEADER" line per dependency. Paths are taken whole: a
# source or build tree whose path holds spaces (a checkout at "/tmp/a b")
# must not split a header's path into words.
deps() {
  if [ -f "$build/build.ninja" ]; then
    # `ninja -t deps`: "OBJECT: #deps N, deps mtime M (VALID)", then one
    # dependency a line, indented by four spaces, printed as stored (ninja
    # has already undone the depfile's escapes), then a blank line.
    "$make" -C "$build" -t deps | awk '
      /^[^ \t]/ {
        obj = $0
        if (!sub(/: #deps [0-9]+, deps mtime -?[0-9]+ \([A-Za-z]+\)$/, "", obj)) {
          print "no_toolkit_headers: cannot read this line of ninja -t deps: " $0 > "/dev/stderr"; exit 1
        }
        next
      }
      /^    [^ ]/ { dep = $0; sub(/^    /, "", dep); print obj "\t" dep; next }
      /[^ \t]/ { print "no_toolkit_headers: cannot read this line of ninja -t deps: " $0 > "/dev/stderr"; exit 1 }'
  else
    # The compiler's depfiles (make syntax, as gcc and clang write them): the
    # first rule, "OBJECT: DEP DEP \<newline> DEP ...", is the object's; in a
    # dependency a space or tab is escaped by a backslash (backslashes before
    # it doubled), "#" as "\#", "$" as "$$". Rules after the first (-MP's
    # empty ones for each header) add nothing.
    find "$build" -name '*.o.d' -exec awk '
      function flush(   i, n, c, tok, obj, bs, k, have) {
        if (line == "") return
        # The object: up to the first ":" that ends a word.
        if (!match(line, /:([ \t]|$)/)) {
          print "no_toolkit_headers: no rule in " FILENAME ": " line > "/dev/stderr"; err = 1; return
        }
        obj = substr(line, 1, RSTART - 1)
        gsub(/\\ /, " ", obj); gsub(/^[ \t]+|[ \t]+$/, "", obj)
        rest = substr(line, RSTART + 1)
        n = length(rest); tok = ""; have = 0
        for (i = 1; i <= n; ++i) {
          c = substr(rest, i, 1)
          if (c == "\\") {
            bs = 0
            while (i <= n && substr(rest, i, 1) == "\\") { ++bs; ++i }
            c = (i <= n) ? substr(rest, i, 1) : ""
            if (c == " " || c == "\t") {
              for (k = 0; k < int(bs / 2); ++k) tok = tok "\\"
              have = 1
              if (bs % 2) { tok = tok c; continue }
              print obj "\t" tok; tok = ""; have = 0; continue
            }
            if (c == "#") { for (k = 0; k < int(bs / 2); ++k) tok = tok "\\"; tok = tok "#"; have = 1; continue }
            for (k = 0; k < bs; ++k) tok = tok "\\"
            have = 1
            --i
            continue
          }
          if (c == "$" && substr(rest, i + 1, 1) == "$") { tok = tok "$"; ++i; have = 1; continue }
          if (c == " " || c == "\t") { if (have) print obj "\t" tok; tok = ""; have = 0; continue }
          tok = tok c; have = 1
        }
        if (have) print obj "\t" tok
      }
      FNR == 1 { line = ""; done = 0 }
      done { next }
      {
        s = $0
        # A line continues when it ends in an odd number of backslashes.
        t = s; nb = 0
        while (substr(t, length(t), 1) == "\\") { ++nb; t = substr(t, 1, length(t) - 1) }
        if (nb % 2) { line = line substr(s, 1, length(s) - 1) " "; next }
        line = line s
        if (line ~ /[^ \t]/) { flush(); done = 1 }
        line = ""
      }
      END { if (!done) flush(); exit err }' {} +
  fi
}

records=$(mktemp)
trap 'rm -f "$records"' EXIT
# A scan that could not read its input fails here, not as "clean" below.
deps >"$records" || { echo "no_toolkit_headers: reading the dependency records failed"; exit 1; }
awk -F '\t' -v exempt="$exempt" '
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
  }' "$records"
