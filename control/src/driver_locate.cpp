// SPDX-License-Identifier: Apache-2.0
// Finding the real NVIDIA driver library, never the shim (driver_locate.hpp).
//
// Everything here runs inside the shim's one-time init, possibly from another
// library's constructor: no logging, no global objects with constructors,
// errors come back as one-line strings.
#include "nvtaskset/driver_locate.hpp"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string_view>
#include <type_traits>

namespace nvtaskset {
namespace {

constexpr const char* kSoname = "libcuda.so.1";
constexpr const char* kDefaultLdCache = "/etc/ld.so.cache";

// Where distributions and container runtimes put the driver when the loader
// cache does not list it (e.g. a container whose cache predates the driver
// injection, or WSL's /usr/lib/wsl/lib).
constexpr const char* kDefaultDirs[] = {
    "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
    "/usr/lib",                  "/usr/local/nvidia/lib64",    "/usr/local/nvidia/lib",
    "/usr/lib/wsl/lib",
};

// The ELF identity this process can load.
#if defined(__x86_64__)
constexpr unsigned kNativeMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr unsigned kNativeMachine = EM_AARCH64;
#else
#error "nvtaskset supports x86_64 and aarch64"
#endif
constexpr unsigned char kNativeClass = sizeof(void*) == 8 ? ELFCLASS64 : ELFCLASS32;

// Notes are tiny (build IDs, ABI tags); a PT_NOTE larger than this is not
// worth reading to look for ours.
constexpr std::size_t kMaxNoteSegment = 64 * 1024;
constexpr unsigned kMaxPhdrs = 4096;
// /etc/ld.so.cache holds a few thousand entries (well under 1 MiB).
constexpr std::size_t kMaxLdCache = 64u * 1024 * 1024;

// --- small I/O helpers --------------------------------------------------------

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

bool pread_exact(int fd, void* buf, std::size_t n, std::uint64_t off) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
    off += static_cast<std::uint64_t>(r);
  }
  return true;
}

template <class T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// --- ELF inspection: header, program headers and PT_NOTE contents only --------

struct ElfInfo {
  bool elf = false;  // a little-endian ELF shared object we could parse
  unsigned char cls = 0;
  unsigned machine = 0;
  bool shim_note = false;
  std::string soname;  // DT_SONAME, "" when none or unreadable
};

// Looks for our note in one PT_NOTE segment's bytes. Each note is a 12-byte
// header (namesz, descsz, type) followed by the name and the descriptor, each
// padded to the segment's alignment (4, or 8 for 8-aligned notes such as
// .note.gnu.property; the same rule glibc's loader applies).
bool notes_have_shim(const unsigned char* p, std::size_t n, std::uint64_t align) {
  const std::size_t a = align == 8 ? 8 : 4;
  const std::string_view want(kShimNoteName, std::strlen(kShimNoteName) + 1);  // with its NUL
  std::size_t off = 0;
  while (n - off >= 12) {
    const std::uint32_t namesz = load<std::uint32_t>(p + off);
    const std::uint32_t descsz = load<std::uint32_t>(p + off + 4);
    const std::size_t name_off = off + 12;
    const std::uint64_t name_end = name_off + ((std::uint64_t{namesz} + a - 1) / a) * a;
    const std::uint64_t desc_end = name_end + ((std::uint64_t{descsz} + a - 1) / a) * a;
    if (name_off + std::uint64_t{namesz} > n) return false;
    if (namesz == want.size() && std::memcmp(p + name_off, want.data(), want.size()) == 0) return true;
    if (desc_end > n) return false;
    off = static_cast<std::size_t>(desc_end);
  }
  return false;
}

// DT_SONAME: the name the loader registers a library under, whatever its
// file is called (a renamed or symlinked copy of the driver is still
// "libcuda.so.1"). The dynamic section's string table is given as a virtual
// address, found in the file through the PT_LOAD segment that holds it.
constexpr std::size_t kMaxDynamicBytes = 64 * 1024;
constexpr std::size_t kMaxSoname = 256;

template <class Phdr>
std::string read_soname(int fd, const std::vector<Phdr>& ph) {
  using Dyn = std::conditional_t<sizeof(Phdr) == sizeof(Elf64_Phdr), Elf64_Dyn, Elf32_Dyn>;
  const Phdr* dyn = nullptr;
  for (const Phdr& h : ph)
    if (h.p_type == PT_DYNAMIC) dyn = &h;
  if (dyn == nullptr || dyn->p_filesz == 0 || dyn->p_filesz > kMaxDynamicBytes) return "";
  std::vector<Dyn> d(static_cast<std::size_t>(dyn->p_filesz) / sizeof(Dyn));
  if (d.empty() || !pread_exact(fd, d.data(), d.size() * sizeof(Dyn), dyn->p_offset)) return "";
  std::uint64_t strtab = 0, soname = 0;
  bool have_soname = false;
  for (const Dyn& e : d) {
    if (e.d_tag == DT_NULL) break;
    if (e.d_tag == DT_STRTAB) strtab = e.d_un.d_ptr;
    if (e.d_tag == DT_SONAME) {
      soname = e.d_un.d_val;
      have_soname = true;
    }
  }
  if (!have_soname) return "";
  for (const Phdr& h : ph) {
    if (h.p_type != PT_LOAD || strtab < h.p_vaddr || strtab - h.p_vaddr >= h.p_filesz) continue;
    const std::uint64_t off = h.p_offset + (strtab - h.p_vaddr) + soname;
    char name[kMaxSoname + 1] = {};
    ssize_t n;
    do {
      n = ::pread(fd, name, kMaxSoname, static_cast<off_t>(off));
    } while (n < 0 && errno == EINTR);
    return n > 0 ? std::string(name, ::strnlen(name, static_cast<std::size_t>(n))) : std::string();
  }
  return "";
}

template <class Ehdr, class Phdr>
void inspect_elf(int fd, ElfInfo& info) {
  Ehdr eh;
  if (!pread_exact(fd, &eh, sizeof eh, 0)) return;
  if (eh.e_type != ET_DYN) return;
  info.elf = true;
  info.machine = eh.e_machine;
  // PN_XNUM (0xffff) moves the count into section 0: never the case for a
  // shared library we would care about; treat as "no note".
  if (eh.e_phoff == 0 || eh.e_phnum == 0 || eh.e_phnum >= PN_XNUM || eh.e_phnum > kMaxPhdrs) return;
  if (eh.e_phentsize != sizeof(Phdr)) return;
  std::vector<Phdr> ph(eh.e_phnum);
  if (!pread_exact(fd, ph.data(), ph.size() * sizeof(Phdr), eh.e_phoff)) return;
  std::vector<unsigned char> buf;
  for (const Phdr& h : ph) {
    if (h.p_type != PT_NOTE || h.p_filesz == 0 || h.p_filesz > kMaxNoteSegment) continue;
    buf.resize(static_cast<std::size_t>(h.p_filesz));
    if (!pread_exact(fd, buf.data(), buf.size(), h.p_offset)) continue;
    if (notes_have_shim(buf.data(), buf.size(), h.p_align)) {
      info.shim_note = true;
      break;
    }
  }
  info.soname = read_soname<Phdr>(fd, ph);
}

ElfInfo inspect(int fd) {
  ElfInfo info;
  unsigned char ident[EI_NIDENT];
  if (!pread_exact(fd, ident, sizeof ident, 0)) return info;
  if (std::memcmp(ident, ELFMAG, SELFMAG) != 0) return info;
  if (ident[EI_DATA] != ELFDATA2LSB) return info;  // x86-64 and aarch64 Linux are little-endian
  info.cls = ident[EI_CLASS];
  if (info.cls == ELFCLASS64) {
    inspect_elf<Elf64_Ehdr, Elf64_Phdr>(fd, info);
  } else if (info.cls == ELFCLASS32) {
    inspect_elf<Elf32_Ehdr, Elf32_Phdr>(fd, info);
  }
  return info;
}

// --- candidates -----------------------------------------------------------------

struct FileId {
  dev_t dev;
  ino_t ino;
  bool operator==(const FileId&) const = default;
};

struct Verdict {
  bool usable = false;
  bool shim = false;   // excluded or carrying the shim's note
  std::string reason;  // why not usable
};

Verdict check_candidate(const std::string& path, const std::vector<FileId>& excluded, FileId* id_out) {
  auto no = [](std::string r, bool shim = false) { return Verdict{false, shim, std::move(r)}; };
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return no(std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return no("not a regular file");
  const FileId id{st.st_dev, st.st_ino};
  if (id_out) *id_out = id;
  for (const FileId& x : excluded)
    if (x == id) return no("it is the nvtaskset shim itself", true);
  const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return no(std::strerror(errno));
  const ElfInfo info = inspect(fd.get());
  if (!info.elf) return no("not an ELF shared library");
  if (info.cls != kNativeClass || info.machine != kNativeMachine) return no("built for another architecture");
  if (info.shim_note) return no("it is a copy of the nvtaskset shim", true);
  return Verdict{true, false, {}};
}

std::vector<FileId> excluded_ids(const std::vector<std::string>& paths) {
  std::vector<FileId> ids;
  for (const std::string& p : paths) {
    struct stat st {};
    if (!p.empty() && ::stat(p.c_str(), &st) == 0) ids.push_back({st.st_dev, st.st_ino});
  }
  return ids;
}

std::string join_dir(std::string_view dir, const char* file) {
  std::string s(dir);
  if (s.empty() || s.back() != '/') s += '/';
  return s + file;
}

// Directories of $LD_LIBRARY_PATH, in order. The loader splits it at ':' and
// ';'. Empty elements (the current directory to the loader) and elements with
// dynamic string tokens ($ORIGIN, $LIB, ...) are skipped: a driver is never
// meant to be found there, and loading one from the working directory would
// be a hazard.
std::vector<std::string> ld_library_path_dirs() {
  std::vector<std::string> dirs;
  // secure_getenv: in a setuid/setcap program (AT_SECURE) the loader ignores
  // LD_LIBRARY_PATH, and so must we, or a user could have such a program load
  // any file as the driver. The same holds for NVTASKSET_REAL_LIBCUDA.
  const char* env = ::secure_getenv("LD_LIBRARY_PATH");
  if (env == nullptr) return dirs;
  std::string_view rest(env);
  while (!rest.empty()) {
    const std::size_t end = rest.find_first_of(":;");
    const std::string_view d = rest.substr(0, end);
    if (!d.empty() && d.find('$') == std::string_view::npos) dirs.emplace_back(d);
    if (end == std::string_view::npos) break;
    rest.remove_prefix(end + 1);
  }
  return dirs;
}

// Calls `use(path)` on each usable candidate in search order until it returns
// true. Returns false with *why set when none was accepted.
bool for_each_usable(const LocateOptions& opts, const std::function<bool(const std::string&)>& use,
                     std::string* why) {
  const std::vector<FileId> excluded = excluded_ids(opts.exclude);

  if (opts.use_env) {
    const char* env = ::secure_getenv(kRealDriverEnv);
    if (env != nullptr && *env != '\0') {
      // The user named exactly this file: no fallback to a search.
      const std::string path(env);
      const Verdict v = check_candidate(path, excluded, nullptr);
      if (!v.usable) {
        if (why) *why = std::string(kRealDriverEnv) + "=" + path + " is unusable: " + v.reason;
        return false;
      }
      if (use(path)) return true;
      return false;  // `use` has set *why (e.g. the dlopen error)
    }
  }

  std::vector<std::string> candidates;
  for (const std::string& d : ld_library_path_dirs()) candidates.push_back(join_dir(d, kSoname));
  const std::string cache = opts.ld_cache_path.empty() ? kDefaultLdCache : opts.ld_cache_path;
  for (std::string& p : ld_cache_lookup(cache, kSoname)) candidates.push_back(std::move(p));
  if (opts.search_dirs.empty()) {
    for (const char* d : kDefaultDirs) candidates.push_back(join_dir(d, kSoname));
  } else {
    for (const std::string& d : opts.search_dirs) candidates.push_back(join_dir(d, kSoname));
  }

  std::vector<FileId> seen;
  bool shims = false;
  for (const std::string& path : candidates) {
    FileId id{};
    const Verdict v = check_candidate(path, excluded, &id);
    if (!v.usable) {
      shims = shims || v.shim;
      continue;
    }
    bool dup = false;
    for (const FileId& s : seen) dup = dup || s == id;
    if (dup) continue;
    seen.push_back(id);
    if (use(path)) return true;
  }
  if (why) {
    std::string dirs;
    if (opts.search_dirs.empty()) {
      dirs = "the usual driver directories";
    } else {
      for (const std::string& d : opts.search_dirs) dirs += (dirs.empty() ? "" : ":") + d;
    }
    *why = std::string("no real ") + kSoname + " found in LD_LIBRARY_PATH, " + cache + " or " + dirs +
           (shims ? " (skipped the nvtaskset shim)" : "") + "; is the NVIDIA driver installed? (" + kRealDriverEnv +
           " names it explicitly)";
  }
  return false;
}

}  // namespace

std::vector<std::string> ld_cache_lookup(const std::string& cache_path, const std::string& soname) {
  std::vector<std::string> out;
  const Fd fd(::open(cache_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return out;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
      static_cast<std::uint64_t>(st.st_size) > kMaxLdCache)
    return out;
  std::vector<unsigned char> data(static_cast<std::size_t>(st.st_size));
  if (!pread_exact(fd.get(), data.data(), data.size(), 0)) return out;
  const unsigned char* d = data.data();
  const std::uint64_t size = data.size();

  // glibc elf/dl-cache.h. Old format: "ld.so-1.7.0" (char[11], padded to 12),
  // uint32 nlibs, then nlibs 12-byte entries; the new format, when present,
  // follows at the next 8-byte boundary. glibc >= 2.32 writes the new format
  // alone by default.
  static constexpr char kOldMagic[] = "ld.so-1.7.0";
  static constexpr char kNewMagic[] = "glibc-ld.so.cache1.1";
  constexpr std::uint64_t kOldHeader = 16, kOldEntry = 12;
  constexpr std::uint64_t kNewHeader = 48, kNewEntry = 24;
  std::uint64_t base = 0;
  if (size >= kOldHeader && std::memcmp(d, kOldMagic, sizeof kOldMagic - 1) == 0) {
    const std::uint64_t nold = load<std::uint32_t>(d + 12);
    base = (kOldHeader + nold * kOldEntry + 7) & ~std::uint64_t{7};
  }
  if (base > size || size - base < kNewHeader || std::memcmp(d + base, kNewMagic, sizeof kNewMagic - 1) != 0)
    return out;
  // New format: magic+version (20 bytes), uint32 nlibs, uint32 len_strings,
  // flags and padding, extension offset, 3 unused words: 48 bytes; then
  // entries {int32 flags; uint32 key, value; uint32 osversion; uint64 hwcap}.
  // key and value are string offsets from the start of the new header.
  const std::uint64_t nlibs = load<std::uint32_t>(d + base + 20);
  if (nlibs > (size - base - kNewHeader) / kNewEntry) return out;
  auto string_at = [&](std::uint32_t off, std::string_view* s) {
    const std::uint64_t start = base + off;
    if (start >= size) return false;
    const void* nul = std::memchr(d + start, 0, static_cast<std::size_t>(size - start));
    if (nul == nullptr) return false;
    *s = std::string_view(reinterpret_cast<const char*>(d + start),
                          static_cast<std::size_t>(static_cast<const unsigned char*>(nul) - (d + start)));
    return true;
  };
  for (std::uint64_t i = 0; i < nlibs; ++i) {
    const unsigned char* e = d + base + kNewHeader + i * kNewEntry;
    std::string_view key, value;
    if (!string_at(load<std::uint32_t>(e + 4), &key) || key != soname) continue;
    if (!string_at(load<std::uint32_t>(e + 8), &value) || value.empty()) continue;
    out.emplace_back(value);
  }
  return out;
}

bool is_shim_library(const std::string& path) {
  const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return false;
  return inspect(fd.get()).shim_note;
}

LibraryKind library_kind(const std::string& path) {
  const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) return LibraryKind::kUnreadable;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return LibraryKind::kOther;
  const ElfInfo info = inspect(fd.get());
  if (info.shim_note) return LibraryKind::kShim;
  if (info.soname.starts_with(kDriverSoname)) return LibraryKind::kDriver;
  return LibraryKind::kOther;
}

std::string locate_real_driver(const LocateOptions& opts, std::string* why) {
  std::string found;
  std::string reason;
  if (for_each_usable(
          opts,
          [&](const std::string& p) {
            found = p;
            return true;
          },
          &reason))
    return found;
  if (why) *why = reason;
  return {};
}

void* open_real_driver(const LocateOptions& opts, std::string* why, std::string* path_out) {
  void* handle = nullptr;
  std::string first_error;
  auto try_open = [&](const std::string& p) {
    handle = ::dlopen(p.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (handle != nullptr) {
      if (path_out) *path_out = p;
      return true;
    }
    // Keep the first failure: it is the driver the loader itself would have
    // picked. Later candidates are still tried.
    if (first_error.empty()) {
      const char* e = ::dlerror();
      first_error = std::string("cannot load ") + p + ": " + (e ? e : "unknown error");
    }
    return false;
  };
  std::string reason;
  if (for_each_usable(opts, try_open, &reason)) return handle;
  if (why) *why = first_error.empty() ? reason : first_error;
  return nullptr;
}

}  // namespace nvtaskset
