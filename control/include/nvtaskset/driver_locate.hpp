// SPDX-License-Identifier: Apache-2.0
// Finding the real NVIDIA driver library, never the shim.
//
// The shim is itself named libcuda.so.1, so dlopen("libcuda.so.1") would
// return the shim. The real driver is searched, in order (the loader's own
// order, so the driver found is the one the program would have loaded):
//   1. $NVTASKSET_REAL_LIBCUDA, if set (an error if it is unusable: the user
//      asked for exactly that file);
//   2. libcuda.so.1 in each directory of $LD_LIBRARY_PATH, in order (e.g. the
//      CUDA forward-compatibility driver; the shim's own directory, which the
//      CLI puts first, is skipped like any shim); empty elements and elements
//      with $ORIGIN-style tokens are ignored;
//   3. every libcuda.so.1 entry of the loader cache (/etc/ld.so.cache);
//   4. the usual driver directories (distribution multiarch dirs, /usr/lib64,
//      /usr/local/nvidia/lib64, /usr/lib/wsl/lib, ...).
// Only files named libcuda.so.1 (or what the variable names) are considered:
// no unversioned libcuda.so symlink is needed. A candidate is skipped when it
// is the same file as any shim (same device and inode as an excluded path) or
// carries the shim's ELF note (kShimNoteName), so a second copy of the shim is
// never mistaken for the driver, and never dlopen()ed to find out; also when
// it is not an ELF shared library for this machine (a 32-bit driver listed in
// the cache). open_real_driver() tries the next usable candidate when dlopen()
// fails, except for $NVTASKSET_REAL_LIBCUDA.
#pragma once

#include "nvtaskset/options.hpp"

#include <string>
#include <vector>

namespace nvtaskset {

inline constexpr const char* kRealDriverEnv = option(Option::kRealLibcuda).name;
// The ELF note owner name the shim carries (section .note.nvtaskset).
inline constexpr const char* kShimNoteName = "nvtaskset";

struct LocateOptions {
  // Paths of shim copies to skip (compared by device and inode).
  std::vector<std::string> exclude;
  // Overrides for tests; empty means the real defaults.
  std::string ld_cache_path;             // default /etc/ld.so.cache
  std::vector<std::string> search_dirs;  // default: the usual driver directories
  bool use_env = true;                   // honour NVTASKSET_REAL_LIBCUDA
};

// All entries for `soname` in a glibc loader cache file (new format,
// "glibc-ld.so.cache1.1", alone or after the old format), in cache order.
// Returns an empty list for a missing or malformed file.
std::vector<std::string> ld_cache_lookup(const std::string& cache_path, const std::string& soname);

// True when the ELF file at `path` carries the shim's note.
bool is_shim_library(const std::string& path);

// What a library file is, by its contents, never its name: the shim (its
// note), a CUDA driver (DT_SONAME "libcuda.so..."; a symlink or a renamed
// copy of the driver is still one), something else, or unreadable.
inline constexpr const char* kDriverSoname = "libcuda.so";
enum class LibraryKind { kShim, kDriver, kOther, kUnreadable };
LibraryKind library_kind(const std::string& path);

// The first usable real-driver path, or "" with *why set to a one-line reason.
std::string locate_real_driver(const LocateOptions& opts, std::string* why);

// dlopen()s the real driver (RTLD_NOW | RTLD_GLOBAL). Returns nullptr with
// *why set on failure.
void* open_real_driver(const LocateOptions& opts, std::string* why, std::string* path_out = nullptr);

}  // namespace nvtaskset
