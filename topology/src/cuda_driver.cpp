// SPDX-License-Identifier: Apache-2.0
// Opening the real driver and asking it about devices.
#include "nvtaskset/cuda_driver.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <stdexcept>

#include <dlfcn.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cuda_api.hpp"

namespace nvtaskset::topo {

namespace {

constexpr const char* kMpsPipeEnv = "CUDA_MPS_PIPE_DIRECTORY";

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string trim(std::string_view s) {
  auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return "";
  auto e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

// "580.159.04" from the driver file name (libcuda.so.580.159.04, what the
// libcuda.so.1 symlink points to), else from the kernel module's version line.
std::string find_driver_release(const std::string& library_path) {
  static const std::regex name_re(R"(libcuda\.so\.([0-9]+\.[0-9]+(\.[0-9]+)?)$)");
  std::smatch m;
  std::error_code ec;
  std::string real = library_path;
  if (!library_path.empty()) {
    auto canon = std::filesystem::canonical(library_path, ec);
    if (!ec) real = canon.string();
  }
  const std::string base = std::filesystem::path(real).filename().string();
  if (std::regex_search(base, m, name_re)) return m[1];
  std::ifstream in("/proc/driver/nvidia/version");
  std::string line;
  static const std::regex mod_re(R"(Kernel Module\s+([0-9]+\.[0-9]+(\.[0-9]+)?))");
  if (in && std::getline(in, line) && std::regex_search(line, m, mod_re)) return m[1];
  return "";
}

}  // namespace

struct CudaDriver::Impl {
  Api api;
  std::string path;
  std::string release;
  int version = 0;
  bool had_pipe_env = false;
  std::string saved_pipe_env;
  bool env_overridden = false;
  std::string private_dir;
  bool wedged = false;
};

CudaDriver::CudaDriver(const DriverOptions& opts) : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  SymbolResolver resolve = opts.resolver;
  if (resolve) {
    I.path = opts.library_path;
  } else {
    std::string why;
    void* handle = open_real_driver(opts.locate, &why, &I.path);
    if (!handle) throw std::runtime_error("no CUDA driver found: " + why);
    // Never dlclose(): the driver keeps our launch callback and its own
    // atexit handlers.
    resolve = [handle](const char* name) { return ::dlsym(handle, name); };
  }
  spdlog::debug("CUDA driver: {}", I.path.empty() ? "(resolver)" : I.path);

  auto get = [&](auto& fn, std::initializer_list<const char*> names, bool required) {
    for (const char* n : names) {
      if (void* p = resolve(n)) {
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
        return;
      }
    }
    if (required)
      throw std::runtime_error(fmt::format("CUDA driver {} lacks {} (driver too old?)", I.path, *names.begin()));
  };
  Api& a = I.api;
  get(a.cuInit, {"cuInit"}, true);
  get(a.cuDriverGetVersion, {"cuDriverGetVersion"}, true);
  get(a.cuGetErrorName, {"cuGetErrorName"}, true);
  get(a.cuDeviceGetCount, {"cuDeviceGetCount"}, true);
  get(a.cuDeviceGet, {"cuDeviceGet"}, true);
  get(a.cuDeviceGetName, {"cuDeviceGetName"}, true);
  get(a.cuDeviceGetUuid, {"cuDeviceGetUuid_v2", "cuDeviceGetUuid"}, true);
  get(a.cuDeviceGetAttribute, {"cuDeviceGetAttribute"}, true);
  get(a.cuDevicePrimaryCtxRetain, {"cuDevicePrimaryCtxRetain"}, true);
  get(a.cuDevicePrimaryCtxRelease, {"cuDevicePrimaryCtxRelease_v2"}, true);
  get(a.cuCtxPushCurrent, {"cuCtxPushCurrent_v2"}, true);
  get(a.cuCtxPopCurrent, {"cuCtxPopCurrent_v2"}, true);
  get(a.cuModuleLoadDataEx, {"cuModuleLoadDataEx"}, true);
  get(a.cuModuleUnload, {"cuModuleUnload"}, true);
  get(a.cuModuleGetFunction, {"cuModuleGetFunction"}, true);
  get(a.cuFuncSetAttribute, {"cuFuncSetAttribute"}, true);
  get(a.cuOccupancyMaxActiveBlocksPerMultiprocessor, {"cuOccupancyMaxActiveBlocksPerMultiprocessor"}, true);
  get(a.cuMemAlloc, {"cuMemAlloc_v2"}, true);
  get(a.cuMemFree, {"cuMemFree_v2"}, true);
  get(a.cuMemAllocHost, {"cuMemAllocHost_v2"}, true);
  get(a.cuMemFreeHost, {"cuMemFreeHost"}, true);
  get(a.cuMemcpyHtoDAsync, {"cuMemcpyHtoDAsync_v2"}, true);
  get(a.cuMemcpyDtoHAsync, {"cuMemcpyDtoHAsync_v2"}, true);
  get(a.cuStreamCreate, {"cuStreamCreate"}, true);
  get(a.cuStreamDestroy, {"cuStreamDestroy_v2"}, true);
  get(a.cuStreamQuery, {"cuStreamQuery"}, true);
  get(a.cuLaunchKernel, {"cuLaunchKernel"}, true);
  get(a.cuGetExportTable, {"cuGetExportTable"}, true);
  get(a.cuLaunchKernelEx, {"cuLaunchKernelEx"}, false);
  get(a.cuOccupancyMaxActiveClusters, {"cuOccupancyMaxActiveClusters"}, false);
  get(a.cuDeviceGetPCIBusId, {"cuDeviceGetPCIBusId"}, false);

  if (opts.private_mps_pipe) {
    // Under MPS, %smid is virtualised; a process is an MPS client when a
    // daemon answers in its pipe directory. An empty private directory has
    // no daemon, so this process never becomes one (docs/hardware.md).
    if (const char* v = std::getenv(kMpsPipeEnv)) {
      I.had_pipe_env = true;
      I.saved_pipe_env = v;
    }
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = fmt::format("{}/nvtaskset-nomps-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!::mkdtemp(templ.data())) {
      const int e = errno;
      templ = "/tmp/nvtaskset-nomps-XXXXXX";
      if (!::mkdtemp(templ.data()))
        throw std::runtime_error(fmt::format("cannot create a private MPS pipe directory: {}", std::strerror(e)));
    }
    I.private_dir = templ;
    ::setenv(kMpsPipeEnv, I.private_dir.c_str(), 1);
    I.env_overridden = true;
    spdlog::debug("{}={} (this process must not be an MPS client)", kMpsPipeEnv, I.private_dir);
  }

  try {
    if (CUresult r = a.cuInit(0); r != CUDA_SUCCESS) throw std::runtime_error("cuInit failed: " + describe(r));
    if (CUresult r = a.cuDriverGetVersion(&I.version); r != CUDA_SUCCESS)
      throw std::runtime_error("cuDriverGetVersion failed: " + describe(r));
  } catch (...) {
    // No destructor runs for a constructor that throws: undo the override here.
    restore_environment();
    std::error_code ec;
    if (!I.private_dir.empty()) std::filesystem::remove_all(I.private_dir, ec);
    throw;
  }
  I.release = find_driver_release(I.path);
  spdlog::debug("CUDA driver version {} (release {})", I.version, I.release.empty() ? "unknown" : I.release);
}

CudaDriver::~CudaDriver() {
  restore_environment();
  if (!impl_->private_dir.empty()) {
    std::error_code ec;
    // Only ever our own, normally empty, directory.
    std::filesystem::remove_all(impl_->private_dir, ec);
  }
}

void CudaDriver::restore_environment() {
  Impl& I = *impl_;
  if (!I.env_overridden) return;
  if (I.had_pipe_env)
    ::setenv(kMpsPipeEnv, I.saved_pipe_env.c_str(), 1);
  else
    ::unsetenv(kMpsPipeEnv);
  I.env_overridden = false;
  // The directory only had to exist for cuInit. The CLI execs its task right
  // after this, so no destructor would ever remove it.
  if (!I.private_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(I.private_dir, ec);
    I.private_dir.clear();
  }
}

const std::string& CudaDriver::private_mps_pipe_dir() const { return impl_->private_dir; }
int CudaDriver::driver_version() const { return impl_->version; }
const std::string& CudaDriver::driver_release() const { return impl_->release; }
const std::string& CudaDriver::library_path() const { return impl_->path; }
bool CudaDriver::wedged() const { return impl_->wedged; }
void CudaDriver::mark_wedged() { impl_->wedged = true; }
const CudaDriver::Api& CudaDriver::api() const { return impl_->api; }

std::string CudaDriver::describe(int result) const {
  const char* name = nullptr;
  if (impl_->api.cuGetErrorName &&
      impl_->api.cuGetErrorName(static_cast<CUresult>(result), &name) == CUDA_SUCCESS && name)
    return fmt::format("{} ({})", name, result);
  return fmt::format("CUDA error {}", result);
}

std::vector<DeviceInfo> CudaDriver::query_devices() const {
  const Api& a = impl_->api;
  auto check = [&](CUresult r, const char* what) {
    if (r != CUDA_SUCCESS) throw std::runtime_error(fmt::format("{} failed: {}", what, describe(r)));
  };
  int count = 0;
  check(a.cuDeviceGetCount(&count), "cuDeviceGetCount");
  std::vector<DeviceInfo> out;
  for (int i = 0; i < count; ++i) {
    CUdevice d = 0;
    check(a.cuDeviceGet(&d, i), "cuDeviceGet");
    DeviceInfo info;
    info.ordinal = static_cast<unsigned>(i);
    char name[256] = {};
    check(a.cuDeviceGetName(name, sizeof name - 1, d), "cuDeviceGetName");
    info.name = name;
    CUuuid uuid{};
    check(a.cuDeviceGetUuid(&uuid, d), "cuDeviceGetUuid");
    std::memcpy(info.uuid.data(), uuid.bytes, 16);
    auto attr = [&](CUdevice_attribute at, const char* what) {
      int v = 0;
      check(a.cuDeviceGetAttribute(&v, at, d), what);
      return v;
    };
    info.cc_major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "cuDeviceGetAttribute(cc major)");
    info.cc_minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "cuDeviceGetAttribute(cc minor)");
    info.sm_count = static_cast<unsigned>(attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "cuDeviceGetAttribute(SM count)"));
    const int domain = attr(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, "cuDeviceGetAttribute(PCI domain)");
    const int bus = attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, "cuDeviceGetAttribute(PCI bus)");
    const int dev = attr(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, "cuDeviceGetAttribute(PCI device)");
    info.pci_bus_id = fmt::format("{:04x}:{:02x}:{:02x}.0", domain, bus, dev);
    info.driver_version = impl_->version;
    info.driver_release = impl_->release;
    spdlog::debug("device {}: {} {} pci {} cc {}.{} {} SMs", i, info.name, uuid_to_string(info.uuid), info.pci_bus_id,
                  info.cc_major, info.cc_minor, info.sm_count);
    out.push_back(std::move(info));
  }
  return out;
}

namespace {
// The hex digits at s[*i] (at most `max` of them), as a number; nullopt
// when there are none or more. (Not std::regex: building that regex took a
// third of a launch's instructions, and every launch normalises an id;
// docs/results.md, Fig. 11a.)
std::optional<unsigned long> hex_field(const std::string& s, std::size_t* i, std::size_t max) {
  unsigned long v = 0;
  const char* first = s.data() + *i;
  const auto [end, ec] = std::from_chars(first, s.data() + s.size(), v, 16);
  const auto n = static_cast<std::size_t>(end - first);
  if (ec != std::errc() || n > max) return std::nullopt;
  *i += n;
  return v;
}
}  // namespace

// [domain:]bus:device.function, in hex (domain 1-8 digits, bus and device
// 1-2, function 0-7).
std::optional<std::string> normalize_pci_bus_id(std::string_view s) {
  const std::string str = trim(s);
  const bool has_domain = std::count(str.begin(), str.end(), ':') == 2;
  std::size_t i = 0;
  unsigned long domain = 0;
  if (has_domain) {
    const auto d = hex_field(str, &i, 8);
    if (!d || i >= str.size() || str[i] != ':') return std::nullopt;
    domain = *d;
    ++i;
  }
  const auto bus = hex_field(str, &i, 2);
  if (!bus || i >= str.size() || str[i] != ':') return std::nullopt;
  ++i;
  const auto dev = hex_field(str, &i, 2);
  if (!dev || i + 2 != str.size() || str[i] != '.' || str[i + 1] < '0' || str[i + 1] > '7') return std::nullopt;
  return fmt::format("{:04x}:{:02x}:{:02x}.{}", domain, *bus, *dev, str[i + 1]);
}

DeviceInfo select_device(const std::vector<DeviceInfo>& devices, std::string_view spec_in) {
  const std::string spec = trim(spec_in);
  auto listing = [&] {
    if (devices.empty()) return std::string("no CUDA device is visible");
    std::string s = "devices are ";
    for (std::size_t i = 0; i < devices.size(); ++i) {
      const auto& d = devices[i];
      s += fmt::format("{}{}: {} {} {}", i ? "; " : "", d.ordinal, d.name, uuid_to_string(d.uuid), d.pci_bus_id);
    }
    return s;
  };
  auto none = [&](const std::string& what) -> DeviceInfo {
    throw std::runtime_error(fmt::format("no device {} '{}': {}", what, spec, listing()));
  };
  if (spec.empty()) return none("named");
  if (std::all_of(spec.begin(), spec.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
    if (spec.size() < 9) {
      const unsigned long idx = std::stoul(spec);
      for (const auto& d : devices)
        if (d.ordinal == idx) return d;
    }
    return none("with index");
  }
  if (spec.find(':') != std::string::npos) {
    auto want = normalize_pci_bus_id(spec);
    if (!want)
      throw std::runtime_error(
          fmt::format("malformed PCI bus ID '{}' (expected e.g. 0000:3b:00.0): {}", spec, listing()));
    for (const auto& d : devices)
      if (normalize_pci_bus_id(d.pci_bus_id) == want) return d;
    return none("at PCI bus ID");
  }
  if (auto full = uuid_from_string(spec)) {
    for (const auto& d : devices)
      if (d.uuid == *full) return d;
    return none("with UUID");
  }
  const std::string want = lower(spec);
  if (want.rfind("gpu-", 0) == 0) {
    const DeviceInfo* hit = nullptr;
    for (const auto& d : devices) {
      if (lower(uuid_to_string(d.uuid)).rfind(want, 0) == 0) {
        if (hit)
          throw std::runtime_error(fmt::format("UUID prefix '{}' is ambiguous (devices {} and {}): {}", spec,
                                               hit->ordinal, d.ordinal, listing()));
        hit = &d;
      }
    }
    if (hit) return *hit;
    return none("with UUID");
  }
  if (want.rfind("mig-", 0) == 0)
    throw std::runtime_error(fmt::format("MIG device '{}' is not supported: TPC masks need a whole GPU", spec));
  return none("matches");
}

}  // namespace nvtaskset::topo
