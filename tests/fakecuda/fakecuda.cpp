// SPDX-License-Identifier: Apache-2.0
// A stand-in for NVIDIA's libcuda.so.1, for end-to-end tests without a GPU.
//
// It models exactly what nvtaskset depends on (docs/hardware.md,
// "The launch callback"): cuGetExportTable hands out the callback table CUPTI
// uses; entry 3 subscribes, entry 6 enables (domain, cbid); every launch builds
// a TMD image of the configured layout, writes CUDA's own per-stream mask into
// it, and runs the callbacks enabled for domain 0xb / cbid 0x1 synchronously
// in the launching thread, with params whose first 32-bit word is the struct
// size and whose 5th pointer is the TMD. What the callbacks leave in the mask
// field is then recorded, one line per launch, so tests can check what the
// hardware would have been told.
//
// Configuration (read once per process, from the environment):
//   FAKECUDA_DEVICES       number of devices (default 1, at most 8)
//   FAKECUDA_SM_COUNT      SMs per device (default 16, i.e. 8 TPCs)
//   FAKECUDA_CC            compute capability "major.minor" (default 8.6)
//   FAKECUDA_TMD_LAYOUT    v1|v3|v4|v5|unknown (default from CC: <9 v3, 9.x v4, >=10 v5)
//   FAKECUDA_INITIAL_MASK  hex disable mask written before the callbacks run
//   FAKECUDA_RECORD        file; each kernel that runs appends
//                          "<pid> <layout> <valid 0|1> <disable mask 0x hex> <source>"
//                          where <source> is "launch" (cuLaunchKernel*) or
//                          "graph<gridDimX>" (a graph kernel node, told apart
//                          by its grid width)
//   FAKECUDA_CHILD_NODES   accept|refuse|ignore: what cuGraphNodeSetEnabled
//                          does with a kernel node of a child graph (default
//                          accept, as measured; see "CUDA graphs" below)
//   FAKECUDA_TPC_BITS      the chip's layout: comma-separated, the TMD mask
//                          bit that controls logical TPC 0, 1, ... (one per
//                          TPC, distinct, < 128; default: bit k controls TPC
//                          k, as before Hopper). Only the probe kernel below
//                          obeys it.
//   FAKECUDA_INIT_LOG      file; each cuInit appends "init <comm>" (the
//                          calling program's name), so tests can tell
//                          whether the CLI itself initialised the driver
//   FAKECUDA_HOLD          file; a kernel launched while it exists keeps
//                          running until it is removed (see "Events and
//                          held work" below)
//   FAKECUDA_WAITS         file; each cuStreamWaitValue32_v2 appends
//                          "<pid> wait <the word then> <the value waited for>"
//   FAKECUDA_HOST_ALLOC    fail: cuMemHostAlloc returns
//                          CUDA_ERROR_OUT_OF_MEMORY (pinned memory is a
//                          limited resource; a shim must cope without it)
// CUDA_VISIBLE_DEVICES is read at the first cuInit, as the driver does
// (CUDA C Programming Guide, "CUDA Environment Variables"): a comma-separated
// list of device indices or full UUIDs selects and orders the devices the
// process sees, ordinal k being the k-th device listed; the list ends at the
// first entry that names no device, and an empty value hides every device.
// A device keeps its UUID and PCI bus id whatever its ordinal: measured on
// 2 x H200, where a task that set CUDA_VISIBLE_DEVICES=1 or 1,0 itself found
// GPU 1's UUID at its ordinal 0 (docs/runs.md, run 11).
// The layout field gets a trailing '!' when a callback changed any TMD byte
// outside the mask field and its valid bit: a shim writing at the wrong
// offsets must not go unnoticed.
//
// CUDA graphs, as measured on an H200 with driver 580.159.04
// (docs/hardware.md, "CUDA graphs"): a kernel node's TMD is built, and the
// TMD-upload callbacks run, at cuGraphUpload or the exec's first launch;
// replays reuse it. Changing a node's enabled state on the exec, or its grid
// (cuGraphExecKernelNodeSetParams, cuGraphExecUpdate), makes the next upload
// or launch build it again; cuGraphExecUpdate with unchanged parameters does
// not. Node handles of a destroyed graph are invalid. A child-graph node
// embeds a clone of the program's graph; cuGraphChildGraphNodeGetGraph
// returns the clone, whose kernel nodes cuGraphNodeSetEnabled accepts and
// re-encodes, while the program's own graph's nodes and the child-graph node
// itself are refused (measured on H100, docs/runs.md, run 9).
// FAKECUDA_CHILD_NODES=refuse|ignore stand for a driver that answers
// otherwise, so tests prove the shim reports such execs instead of trusting them.
// Cluster dimensions (CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, on cuLaunchKernelEx
// or a kernel node) are written into the TMD where the layout keeps them.
// cuLaunchCooperativeKernel is cuLaunchKernel (recorded as "launch").
//
// Events and held work, as CUDA documents them (CUDA Driver API, "Event
// Management"): an event completes when the work its stream held when it was
// recorded has completed; one never recorded is complete; recording it again
// replaces what it waits for. The stand-in runs kernels synchronously, so
// without FAKECUDA_HOLD every event is complete once recorded. With
// FAKECUDA_HOLD=<path>, tests keep work "on the GPU" without any timing: a
// kernel launched (cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel,
// a kernel of cuGraphLaunch) while <path> exists keeps running until <path> is
// removed. What is held is kept per process, not per stream: an event recorded
// on any stream after such a launch, while <path> still exists, is incomplete
// until <path> is gone (cuEventQuery answers CUDA_ERROR_NOT_READY;
// cuEventSynchronize polls the file every millisecond, with no timeout), and
// so are cuStreamQuery, cuStreamSynchronize and cuCtxSynchronize. An event
// recorded while nothing is held is complete. The stand-in notices the
// removal when it next looks at the file (a launch, record, query or wait);
// what it has seen released stays released when <path> is created again,
// which then holds only kernels launched afterwards. A test that creates the
// file again should let the stand-in see it gone first (e.g. by a query).
// Independently of FAKECUDA_HOLD, an event recorded on a stream stuck behind
// a probe kernel that can never run (see "Kernels") never completes.
// Event timing: the stand-in has no clock of its own. Each kernel launched
// takes FAKECUDA_KERNEL_US (default 0) on a virtual GPU clock, and an event
// is stamped with that clock when it is recorded (the kernels the process
// launched before it); cuEventElapsedTime gives the difference, in ms, once
// both are complete, and CUDA_ERROR_INVALID_HANDLE for an event created with
// CU_EVENT_DISABLE_TIMING or never recorded, as the real driver does.
// Stream capture: see "Stream capture" below (CUDA's global mode).
// Stream waits (cuStreamWaitValue32_v2, CU_STREAM_WAIT_VALUE_EQ only), as
// measured on an H200 as a plain process and as an MPS client
// (tests/gpu/gate_probe.cu, docs/runs.md, run 68): work queued behind a wait
// runs once the 32-bit word at its address (mapped host memory,
// cuMemHostAlloc with CU_MEMHOSTALLOC_DEVICEMAP) equals the value, and never
// before. Kept per process, as held work is: an event recorded after a wait
// completes only once that wait passed, and so do cuStreamQuery,
// cuStreamSynchronize and cuCtxSynchronize; a wait passes the first time it
// is seen satisfied (in order) and stays passed. Kernels are recorded at
// launch, as ever: their mask is fixed then.
//
// Kernels: the stand-in runs exactly one, `nvtaskset --verify`'s block-SM
// probe (topology/kernels/block_smid.cu), recognised by its entry name in the
// PTX it is loaded from. It places the probe's blocks as the hardware does
// under the TPC-disable mask the TMD holds once the callbacks ran: only on
// the SMs 2k and 2k+1 of the logical TPCs k whose mask bit (FAKECUDA_TPC_BITS)
// is enabled, one block per SM in turn; a mask that enables no TPC makes the
// kernel wait forever (cuStreamQuery keeps answering CUDA_ERROR_NOT_READY).
// That placement is what real GPUs were measured to do: on H100 and H200
// every block of a kernel ran on exactly the TPCs its mask enabled, and a
// mask with no working TPC hung the kernel (docs/verification.md, "The
// partition is what the hardware obeys"; docs/hardware.md). Any other module
// fails to load, so calibration on the stand-in still fails cleanly. Device
// memory is host memory.
#include <sys/syscall.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

// Every driver function declared here is part of the exported API; the rest
// of this file is hidden (-fvisibility=hidden).
#pragma GCC visibility push(default)
#include "nvtaskset/cuda_driver_api.hpp"
// The driver also exports the legacy versions of some functions next to the
// current ones, which alone the header declares; so does the stand-in.
extern "C" {
CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags);
CUresult CUDAAPI cuDeviceGetUuid(CUuuid* uuid, CUdevice dev);
CUresult CUDAAPI cuEventDestroy(CUevent hEvent);
CUresult CUDAAPI cuGraphInstantiate(CUgraphExec* exec, CUgraph graph, CUgraphNode* err, char* log, size_t size);
CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec* exec, CUgraph graph, CUgraphNode* err, char* log, size_t size);
CUresult CUDAAPI cuGraphExecUpdate(CUgraphExec exec, CUgraph graph, CUgraphNode* err, CUgraphExecUpdateResult* res);
}
#pragma GCC visibility pop

#include "nvtaskset/launch_hook.hpp"
#include "nvtaskset/tmd.hpp"

namespace {

namespace tmd = nvtaskset::tmd;
namespace hook = nvtaskset::hook;
using nvtaskset::Bits128;

constexpr int kMaxDevices = 8;
// The real TMD is 256 bytes (V03) to 384 bytes (V05); 512 covers every layout.
constexpr std::size_t kTmdBytes = 512;
// Params struct size handed to callbacks: above hook::kMinParamsSize, as the
// real driver's is.
constexpr std::uint32_t kParamsSize = 0x40;

[[noreturn]] void fatal(const char* what, const char* value) {
  std::fprintf(stderr, "fakecuda: %s%s%s\n", what, value ? ": " : "", value ? value : "");
  std::abort();
}

// A layout as the stand-in builds it.
struct LayoutSpec {
  const char* name;
  tmd::Layout layout;  // what tmd::detect must say about the image
  unsigned char byte72;
  unsigned char byte58;
};

// Version bytes from NVIDIA open-gpu-doc cl*qmd.h (QMD_MAJOR_VERSION << 4 |
// QMD_VERSION at byte 72; V05 moved it to byte 58).
constexpr LayoutSpec kLayouts[] = {
    {"v1", tmd::Layout::kV01toV03, 0x16, 0},  // V01_06 (Kepler2)
    {"v3", tmd::Layout::kV01toV03, 0x30, 0},  // V03_00 (Ampere, Ada)
    {"v4", tmd::Layout::kV04, 0x40, 0},       // V04_00 (Hopper)
    {"v5", tmd::Layout::kV05, 0, 0x50},       // V05_00 (Blackwell)
    // V00_06 (Kepler1) has no TPC mask at all: the shim must not know it.
    {"unknown", tmd::Layout::kUnknown, 0x06, 0},
};

enum class ChildNodes { kAccept, kRefuse, kIgnore };

struct Config {
  ChildNodes child_nodes = ChildNodes::kAccept;
  int devices = 1;
  unsigned sm_count = 16;
  int cc_major = 8;
  int cc_minor = 6;
  const LayoutSpec* layout = nullptr;
  Bits128 initial_mask;
  std::string record_path;
  std::vector<unsigned> tpc_bits;  // FAKECUDA_TPC_BITS: the mask bit of each logical TPC
  std::string hold_path;           // FAKECUDA_HOLD
  std::uint64_t kernel_ns = 0;     // FAKECUDA_KERNEL_US, on the virtual GPU clock
  std::string waits_path;          // FAKECUDA_WAITS
  bool host_alloc_fails = false;   // FAKECUDA_HOST_ALLOC=fail
};

long parse_int(const char* name, const char* v, long lo, long hi) {
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi) fatal("bad value for", name);
  return x;
}

Bits128 parse_hex128(const char* name, std::string_view v) {
  if (v.starts_with("0x") || v.starts_with("0X")) v.remove_prefix(2);
  if (v.empty() || v.size() > 32) fatal("bad hex mask in", name);
  Bits128 m;
  for (char c : v) {
    unsigned d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else fatal("bad hex mask in", name);
    m.hi = (m.hi << 4) | (m.lo >> 60);
    m.lo = (m.lo << 4) | d;
  }
  return m;
}

Config load_config() {
  Config c;
  if (const char* v = std::getenv("FAKECUDA_DEVICES")) c.devices = parse_int("FAKECUDA_DEVICES", v, 0, kMaxDevices);
  if (const char* v = std::getenv("FAKECUDA_SM_COUNT"))
    c.sm_count = static_cast<unsigned>(parse_int("FAKECUDA_SM_COUNT", v, 2, 256));
  if (const char* v = std::getenv("FAKECUDA_CC")) {
    int maj = 0, min = 0;
    char tail = 0;
    if (std::sscanf(v, "%d.%d%c", &maj, &min, &tail) != 2 || maj < 3 || min < 0 || min > 9)
      fatal("bad value for FAKECUDA_CC (want major.minor)", v);
    c.cc_major = maj;
    c.cc_minor = min;
  }
  const char* want = std::getenv("FAKECUDA_TMD_LAYOUT");
  if (!want || !*want) want = c.cc_major < 9 ? "v3" : c.cc_major == 9 ? "v4" : "v5";
  for (const auto& l : kLayouts)
    if (std::strcmp(l.name, want) == 0) c.layout = &l;
  if (!c.layout) fatal("bad value for FAKECUDA_TMD_LAYOUT (v1|v3|v4|v5|unknown)", want);
  if (const char* v = std::getenv("FAKECUDA_INITIAL_MASK")) c.initial_mask = parse_hex128("FAKECUDA_INITIAL_MASK", v);
  if (const char* v = std::getenv("FAKECUDA_RECORD")) c.record_path = v;
  if (const char* v = std::getenv("FAKECUDA_HOLD")) c.hold_path = v;
  if (const char* v = std::getenv("FAKECUDA_WAITS")) c.waits_path = v;
  if (const char* v = std::getenv("FAKECUDA_HOST_ALLOC")) {
    if (std::string_view(v) != "fail") fatal("FAKECUDA_HOST_ALLOC must be fail, not", v);
    c.host_alloc_fails = true;
  }
  if (const char* v = std::getenv("FAKECUDA_KERNEL_US"))
    c.kernel_ns = static_cast<std::uint64_t>(parse_int("FAKECUDA_KERNEL_US", v, 0, 1'000'000)) * 1000;
  const unsigned tpcs = c.sm_count / 2;
  if (const char* v = std::getenv("FAKECUDA_TPC_BITS")) {
    std::string_view rest = v;
    Bits128 seen;
    while (!rest.empty()) {
      const std::size_t comma = rest.find(',');
      const std::string item(rest.substr(0, comma));
      const long bit = parse_int("FAKECUDA_TPC_BITS", item.c_str(), 0, 127);
      if (seen.test(static_cast<unsigned>(bit))) fatal("a bit given twice in", "FAKECUDA_TPC_BITS");
      seen.set(static_cast<unsigned>(bit));
      c.tpc_bits.push_back(static_cast<unsigned>(bit));
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    }
    if (c.tpc_bits.size() != tpcs) fatal("FAKECUDA_TPC_BITS must name one bit per TPC (FAKECUDA_SM_COUNT / 2)", v);
  } else {
    for (unsigned k = 0; k < tpcs; ++k) c.tpc_bits.push_back(k);
  }
  if (const char* v = std::getenv("FAKECUDA_CHILD_NODES")) {
    if (std::strcmp(v, "accept") == 0) c.child_nodes = ChildNodes::kAccept;
    else if (std::strcmp(v, "refuse") == 0) c.child_nodes = ChildNodes::kRefuse;
    else if (std::strcmp(v, "ignore") == 0) c.child_nodes = ChildNodes::kIgnore;
    else fatal("bad value for FAKECUDA_CHILD_NODES (accept|refuse|ignore)", v);
  }
  return c;
}

const Config& config() {
  static const Config c = load_config();
  return c;
}

std::atomic<bool> g_initialized{false};

CUresult check_init() {
  return g_initialized.load(std::memory_order_acquire) ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

// The physical device behind each ordinal (CUDA_VISIBLE_DEVICES), fixed
// before g_initialized is set.
std::vector<int> g_visible;
std::once_flag g_visible_once;

std::string uuid_text(int physical) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "GPU-fa4ecda0-0000-4000-8000-0000000000%02x", physical);
  return buf;
}

void read_visible_devices() {
  const int n = config().devices;
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  if (v == nullptr) {
    for (int i = 0; i < n; ++i) g_visible.push_back(i);
    return;
  }
  std::string_view rest = v;
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string item(rest.substr(0, comma));
    int found = -1;
    for (int i = 0; i < n; ++i) {
      if (item == std::to_string(i) || item == uuid_text(i)) found = i;
    }
    bool seen = false;
    for (int d : g_visible) seen = seen || d == found;
    if (found < 0 || seen) break;
    g_visible.push_back(found);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
}

CUresult check_device(CUdevice dev) {
  if (!g_initialized.load(std::memory_order_acquire)) return CUDA_ERROR_NOT_INITIALIZED;
  if (dev < 0 || dev >= static_cast<int>(g_visible.size())) return CUDA_ERROR_INVALID_DEVICE;
  return CUDA_SUCCESS;
}

int physical(CUdevice dev) { return g_visible[static_cast<std::size_t>(dev)]; }

// --- contexts -----------------------------------------------------------------
// One primary context per device. A thread with no current context launches
// on device 0's, as if cudart had made it current.
struct FakeContext {
  int device;
};
FakeContext g_contexts[kMaxDevices] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};
// The calling thread's context stack (cuCtxPush/PopCurrent); the top is current.
thread_local std::vector<FakeContext*> t_stack;
FakeContext* current() { return t_stack.empty() ? nullptr : t_stack.back(); }

FakeContext* from_handle(CUcontext c) {
  auto* p = reinterpret_cast<FakeContext*>(c);
  for (auto& ctx : g_contexts)
    if (&ctx == p) return p;
  return nullptr;
}
CUcontext to_handle(FakeContext* c) { return reinterpret_cast<CUcontext>(c); }

// --- the callback table -------------------------------------------------------
// Subscribers live in fixed slots so a launch reads them without a lock or an
// allocation: the launch path stays cheap and steady for CPU benchmarks of
// the shim's overhead. Subscribing and enabling are rare and serialised.
constexpr std::uint32_t kMaxSubscribers = 64;
constexpr std::size_t kMaxEnabled = 16;

struct Subscriber {
  std::atomic<hook::Callback> callback{nullptr};
  std::atomic<void*> userdata{nullptr};
  std::atomic<bool> tmd_upload{false};  // (kDomainLaunch, kCbidTmdUpload) enabled
  std::pair<int, int> enabled[kMaxEnabled];  // every enabled (domain, cbid); under the mutex
  std::size_t n_enabled = 0;
};

std::mutex g_subscribers_mutex;
Subscriber g_subscribers[kMaxSubscribers];  // handle h is g_subscribers[h - 1]
std::atomic<std::uint32_t> g_subscriber_count{0};

int table_subscribe(std::uint32_t* handle, hook::Callback cb, void* userdata) {
  if (!handle || !cb) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(g_subscribers_mutex);
  const std::uint32_t n = g_subscriber_count.load(std::memory_order_relaxed);
  if (n == kMaxSubscribers) return CUDA_ERROR_OUT_OF_MEMORY;
  g_subscribers[n].userdata.store(userdata, std::memory_order_relaxed);
  g_subscribers[n].callback.store(cb, std::memory_order_relaxed);
  g_subscriber_count.store(n + 1, std::memory_order_release);
  *handle = n + 1;
  return CUDA_SUCCESS;
}

int table_enable(std::uint32_t on, std::uint32_t handle, int domain, int cbid) {
  std::lock_guard lock(g_subscribers_mutex);
  if (handle == 0 || handle > g_subscriber_count.load(std::memory_order_relaxed)) return CUDA_ERROR_INVALID_HANDLE;
  Subscriber& s = g_subscribers[handle - 1];
  const std::pair<int, int> key{domain, cbid};
  std::size_t i = 0;
  while (i < s.n_enabled && s.enabled[i] != key) ++i;
  if (on && i == s.n_enabled) {
    if (s.n_enabled == kMaxEnabled) return CUDA_ERROR_OUT_OF_MEMORY;
    s.enabled[s.n_enabled++] = key;
  } else if (!on && i < s.n_enabled) {
    s.enabled[i] = s.enabled[--s.n_enabled];
  }
  if (domain == hook::kDomainLaunch && cbid == hook::kCbidTmdUpload)
    s.tmd_upload.store(on != 0, std::memory_order_release);
  return CUDA_SUCCESS;
}

// Entries whose signature nvtaskset does not know: calling one is a bug.
int table_unsupported() { return CUDA_ERROR_NOT_SUPPORTED; }

template <class F>
const void* entry(F f) {
  return reinterpret_cast<const void*>(f);
}

// Entry 0 holds the table's size in bytes, as in the driver's export tables.
const void* const g_callback_table[8] = {
    reinterpret_cast<const void*>(sizeof(const void*) * 8),
    entry(&table_unsupported),
    entry(&table_unsupported),
    entry(&table_subscribe),  // hook::kTableSubscribe
    entry(&table_unsupported),
    entry(&table_unsupported),
    entry(&table_enable),  // hook::kTableEnable
    entry(&table_unsupported),
};
static_assert(hook::kTableSubscribe == 3 && hook::kTableEnable == 6);

// --- recording ----------------------------------------------------------------
int record_fd() {
  // Opened once per process image; O_CLOEXEC so an exec'd program opens its own
  // (a forked child shares this one, which O_APPEND makes safe).
  static const int fd = [] {
    const auto& path = config().record_path;
    if (path.empty()) return -1;
    const int f = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (f < 0) fatal("cannot open FAKECUDA_RECORD", path.c_str());
    return f;
  }();
  return fd;
}

void record(const char* layout_name, bool corrupted, bool valid, const Bits128& mask, const char* source) {
  const int fd = record_fd();
  if (fd < 0) return;
  char hex[40];
  if (mask.hi)
    std::snprintf(hex, sizeof hex, "%llx%016llx", static_cast<unsigned long long>(mask.hi),
                  static_cast<unsigned long long>(mask.lo));
  else
    std::snprintf(hex, sizeof hex, "%llx", static_cast<unsigned long long>(mask.lo));
  char line[160];
  const int n = std::snprintf(line, sizeof line, "%d %s%s %d 0x%s %s\n", static_cast<int>(::getpid()), layout_name,
                              corrupted ? "!" : "", valid ? 1 : 0, hex, source);
  // One write() per line on an O_APPEND file: lines from concurrent threads
  // and processes never interleave.
  if (::write(fd, line, static_cast<std::size_t>(n)) != n) fatal("short write to FAKECUDA_RECORD", nullptr);
}

// Bytes a callback may legitimately change in a TMD of this layout: the mask
// words, and the valid bit (bit 31 of a 32-bit word).
struct Editable {
  std::size_t mask_off = 0, mask_len = 0;
  std::size_t valid_word = SIZE_MAX;
};
Editable editable(tmd::Layout l) {
  switch (l) {
    case tmd::Layout::kV01toV03: return {84, 8, SIZE_MAX};
    case tmd::Layout::kV04: return {304, 16, 0};
    case tmd::Layout::kV05: return {280, 16, 16};
    case tmd::Layout::kUnknown: break;
  }
  return {};
}

bool changed_outside_mask(const unsigned char* before, const unsigned char* after, tmd::Layout l) {
  const Editable e = editable(l);
  for (std::size_t i = 0; i < kTmdBytes; ++i) {
    if (i >= e.mask_off && i < e.mask_off + e.mask_len) continue;
    unsigned char allowed = 0;
    if (e.valid_word != SIZE_MAX && i == e.valid_word + 3) allowed = 0x80;  // little-endian bit 31
    if ((before[i] ^ after[i]) & ~allowed) return true;
  }
  return false;
}

// Cluster shape of a launch: 0 0 0 without clusters.
struct Cluster {
  unsigned x = 0, y = 0, z = 0;
};

// A TMD as the driver leaves it for the hardware: built, the callbacks run.
struct Tmd {
  alignas(16) unsigned char image[kTmdBytes] = {};
  bool corrupted = false;  // a callback wrote outside the mask field
};

// Builds a TMD for one kernel and runs the TMD-upload callbacks on it.
void build_tmd(Tmd& out, const Cluster& cl) {
  const Config& c = config();
  const LayoutSpec& spec = *c.layout;
  std::memset(out.image, 0, kTmdBytes);
  unsigned char* image = out.image;
  image[72] = spec.byte72;
  image[58] = spec.byte58;
  if (cl.x) tmd::write_cluster_shape(image, spec.layout, cl.x, cl.y ? cl.y : 1, cl.z ? cl.z : 1);
  // CUDA writes its own per-stream mask before the callback runs (docs/hardware.md).
  // An unknown layout has no mask field; the stand-in puts the initial mask
  // where V03 keeps it, so a shim that wrongly treats it as V03 shows up.
  if (c.initial_mask.any()) {
    if (spec.layout == tmd::Layout::kUnknown) {
      tmd::store32(image + 84, static_cast<std::uint32_t>(c.initial_mask.lo));
      tmd::store32(image + 88, static_cast<std::uint32_t>(c.initial_mask.lo >> 32));
    } else {
      tmd::write_disable_mask(image, spec.layout, c.initial_mask);
    }
  }
  unsigned char before[kTmdBytes];
  std::memcpy(before, image, kTmdBytes);

  alignas(8) unsigned char params[kParamsSize] = {};
  tmd::store32(params, kParamsSize);
  void* tmd_ptr = image;
  std::memcpy(params + 4 * sizeof(void*), &tmd_ptr, sizeof tmd_ptr);

  // Synchronously, in the launching thread, in subscription order. No lock
  // is held: a callback may itself call into the driver.
  const std::uint32_t n = g_subscriber_count.load(std::memory_order_acquire);
  for (std::uint32_t i = 0; i < n; ++i) {
    const Subscriber& sub = g_subscribers[i];
    if (sub.tmd_upload.load(std::memory_order_acquire))
      sub.callback.load(std::memory_order_relaxed)(sub.userdata.load(std::memory_order_relaxed), hook::kDomainLaunch,
                                                   hook::kCbidTmdUpload, params);
  }
  out.corrupted = changed_outside_mask(before, image, spec.layout);
}

// The hardware runs a kernel with this TMD: record what it was told.
void run_tmd(const Tmd& t, const char* source) {
  const LayoutSpec& spec = *config().layout;
  Bits128 mask;
  bool valid = false;
  if (spec.layout == tmd::Layout::kUnknown) {
    mask.lo = tmd::load32(t.image + 84) | (std::uint64_t{tmd::load32(t.image + 88)} << 32);
  } else {
    mask = tmd::read_disable_mask(t.image, spec.layout);
    valid = tmd::mask_valid(t.image, spec.layout);
  }
  record(spec.name, t.corrupted, valid, mask, source);
}

// --- held work (FAKECUDA_HOLD; see "Events and held work" at the top) ----------
// Held launches are numbered 1, 2, ...: g_held_launches counts the launches
// that found the hold file, and held launches 1..g_released are known to
// have finished. Whoever reads the count and then finds the file gone may
// advance g_released to what it read: those launches all found the file, so
// its removal ended them, while a launch counted after that read stays held.
// No lock: waiters poll the file, and never under a mutex.
std::atomic<std::uint64_t> g_held_launches{0};
std::atomic<std::uint64_t> g_released{0};

bool hold_file_exists() {
  const std::string& path = config().hold_path;
  return !path.empty() && ::access(path.c_str(), F_OK) == 0;
}

// Whether held launches 1..target have all finished; looks at the file once.
bool released(std::uint64_t target);

// A kernel was launched: it keeps running while the hold file exists. A
// launch that finds the file gone notices that the earlier ones finished.
// The virtual GPU clock (see "Event timing"): the kernel time launched so far.
std::atomic<std::uint64_t> g_gpu_ns{0};

void note_launch() {
  g_gpu_ns.fetch_add(config().kernel_ns);
  if (config().hold_path.empty()) return;
  const std::uint64_t before = g_held_launches.load();
  if (hold_file_exists()) g_held_launches.fetch_add(1);
  else released(before);
}

bool released(std::uint64_t target) {
  std::uint64_t r = g_released.load();
  if (target <= r) return true;
  if (hold_file_exists()) return false;
  while (r < target && !g_released.compare_exchange_weak(r, target)) {
  }
  return true;
}

// Waits, polling the file every millisecond, until held launches 1..target
// have finished.
void wait_released(std::uint64_t target) {
  while (!released(target)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// --- stream waits (see "Stream waits" at the top) -----------------------------
struct FakeWait {
  const std::uint32_t* word;
  std::uint32_t value;
};
std::mutex g_wait_mutex;  // guards both
std::vector<FakeWait> g_waits;
std::size_t g_waits_passed = 0;

std::size_t waits_queued() {
  std::lock_guard lock(g_wait_mutex);
  return g_waits.size();
}

// Whether waits 1..n have passed; looks at each word once.
bool waits_passed(std::size_t n) {
  std::lock_guard lock(g_wait_mutex);
  while (g_waits_passed < n && __atomic_load_n(g_waits[g_waits_passed].word, __ATOMIC_ACQUIRE) ==
                                   g_waits[g_waits_passed].value)
    ++g_waits_passed;
  return g_waits_passed >= n;
}

void wait_passed(std::size_t n) {
  while (!waits_passed(n)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

CUresult launch(const Cluster& cl = {}) {
  if (!g_initialized.load(std::memory_order_acquire)) return CUDA_ERROR_NOT_INITIALIZED;
  Tmd t;
  build_tmd(t, cl);
  run_tmd(t, "launch");
  note_launch();
  return CUDA_SUCCESS;
}

// --- the one kernel the stand-in runs (see "Kernels" at the top) -----------------

constexpr const char* kProbeEntry = "nvtaskset_record_block_smid";
struct FakeModule {
  int unused;
};
struct FakeFunction {
  int unused;
};
FakeModule g_probe_module;
FakeFunction g_probe_function;

bool is_probe(CUfunction f) { return reinterpret_cast<FakeFunction*>(f) == &g_probe_function; }

// Device memory is host memory; the allocations are known, so a pointer
// outside them is an error, as it would be on a GPU.
std::mutex g_memory_mutex;
std::map<std::uintptr_t, std::size_t> g_allocations;  // start -> bytes

bool device_range(CUdeviceptr p, std::size_t bytes) {
  std::lock_guard lock(g_memory_mutex);
  auto it = g_allocations.upper_bound(static_cast<std::uintptr_t>(p));
  if (it == g_allocations.begin()) return false;
  --it;
  return p >= it->first && p - it->first <= it->second && bytes <= it->second - (p - it->first);
}

// A stream holding a kernel that can never run stays busy forever, and so
// does everything queued after it.
struct FakeStream {
  std::atomic<bool> stuck{false};
};
FakeStream g_default_stream;

FakeStream* stream_of(CUstream s) {
  if (s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return &g_default_stream;
  return reinterpret_cast<FakeStream*>(s);
}

// An event: what it waits for since it was last recorded (see "Events and
// held work" at the top). Handles are checked against the live set, as
// device pointers are against the allocations.
struct FakeEvent {
  std::uint64_t held = 0;  // held launches 1..held must finish; 0: none
  bool stuck = false;      // recorded behind a kernel that never runs
  bool timing = true;      // not CU_EVENT_DISABLE_TIMING
  bool recorded = false;
  std::uint64_t gpu_ns = 0;  // the virtual GPU clock when it completes
  std::size_t waits = 0;     // stream waits 1..waits must pass
};
std::mutex g_event_mutex;  // guards the live set and every event's fields
std::set<FakeEvent*> g_live_events;

// What `e` waits for, copied out under the lock (the wait itself is not):
// false when `e` is not a live event.
bool event_state(CUevent e, FakeEvent& out) {
  std::lock_guard lock(g_event_mutex);
  auto it = g_live_events.find(reinterpret_cast<FakeEvent*>(e));
  if (it == g_live_events.end()) return false;
  out = **it;
  return true;
}

// Runs the probe kernel as the hardware would with TMD `t` (the callbacks
// have run): block b writes the SM it ran on, plus one, into out[b].
CUresult run_probe(const Tmd& t, std::uint64_t blocks, FakeStream* stream, void** params) {
  if (params == nullptr || params[0] == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr out = 0;
  std::memcpy(&out, params[0], sizeof out);
  if (blocks == 0 || blocks > (1u << 20) || !device_range(out, blocks * 4)) return CUDA_ERROR_INVALID_VALUE;
  if (stream->stuck.load()) return CUDA_SUCCESS;  // queued behind a kernel that never runs
  const Config& c = config();
  const LayoutSpec& spec = *c.layout;
  // The hardware reads a mask only where the layout has one, and on V04/V05
  // only with its valid bit set.
  Bits128 disable;
  if (spec.layout != tmd::Layout::kUnknown && tmd::mask_valid(t.image, spec.layout))
    disable = tmd::read_disable_mask(t.image, spec.layout);
  std::vector<unsigned> sms;
  for (unsigned k = 0; k < c.tpc_bits.size(); ++k)
    if (!disable.test(c.tpc_bits[k])) {
      sms.push_back(2 * k);
      sms.push_back(2 * k + 1);
    }
  if (sms.empty()) {
    stream->stuck.store(true);  // no enabled TPC: the kernel never runs (docs/hardware.md)
    return CUDA_SUCCESS;
  }
  auto* words = reinterpret_cast<std::uint32_t*>(static_cast<std::uintptr_t>(out));
  for (std::uint64_t b = 0; b < blocks; ++b) words[b] = sms[b % sms.size()] + 1;
  return CUDA_SUCCESS;
}

CUresult load_module(CUmodule* m, const void* image) {
  if (!m || !image) return CUDA_ERROR_INVALID_VALUE;
  if (!g_initialized.load(std::memory_order_acquire)) return CUDA_ERROR_NOT_INITIALIZED;
  // PTX is NUL-terminated text naming its entries.
  if (std::strstr(static_cast<const char*>(image), ".entry nvtaskset_record_block_smid(") == nullptr)
    return CUDA_ERROR_NOT_SUPPORTED;
  *m = reinterpret_cast<CUmodule>(&g_probe_module);
  return CUDA_SUCCESS;
}

// --- CUDA graphs ----------------------------------------------------------------
struct FakeGraph;
struct FakeNode {
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  unsigned grid[3] = {1, 1, 1};
  Cluster cluster;
  FakeGraph* owner = nullptr;
  FakeGraph* child = nullptr;  // CU_GRAPH_NODE_TYPE_GRAPH: the embedded copy
};
struct FakeGraph {
  std::vector<FakeNode*> nodes;
  bool embedded = false;  // a child graph node's copy, owned by that node
};
// One kernel of an exec, identified by the node it came from.
struct ExecKernel {
  const FakeNode* node;  // the source node (or the embedded node of a child graph)
  bool in_child;
  unsigned grid[3];
  Cluster cluster;
  bool enabled = true;
  bool dirty = true;  // its TMD must be built at the next upload or launch
  Tmd tmd;
};
struct FakeExec {
  std::vector<ExecKernel> kernels;
};

std::mutex g_graph_mutex;  // graph objects are the program's to serialise; this guards the live sets
std::set<const FakeNode*> g_live_nodes;
std::set<const FakeGraph*> g_live_graphs;
std::set<const FakeExec*> g_live_execs;

bool live_graph(CUgraph g) {
  std::lock_guard lock(g_graph_mutex);
  return g_live_graphs.count(reinterpret_cast<const FakeGraph*>(g)) != 0;
}
bool live_node(CUgraphNode n) {
  std::lock_guard lock(g_graph_mutex);
  return g_live_nodes.count(reinterpret_cast<const FakeNode*>(n)) != 0;
}
FakeExec* live_exec(CUgraphExec e) {
  std::lock_guard lock(g_graph_mutex);
  auto* x = reinterpret_cast<FakeExec*>(e);
  return g_live_execs.count(x) ? x : nullptr;
}

FakeGraph* new_graph(bool embedded) {
  auto* g = new FakeGraph;
  g->embedded = embedded;
  std::lock_guard lock(g_graph_mutex);
  g_live_graphs.insert(g);
  return g;
}
FakeNode* add_node(FakeGraph* g, CUgraphNodeType type) {
  auto* n = new FakeNode;
  n->type = type;
  n->owner = g;
  g->nodes.push_back(n);
  std::lock_guard lock(g_graph_mutex);
  g_live_nodes.insert(n);
  return n;
}
void destroy_graph(FakeGraph* g) {
  for (FakeNode* n : g->nodes) {
    if (n->child) destroy_graph(n->child);
    std::lock_guard lock(g_graph_mutex);
    g_live_nodes.erase(n);
    delete n;
  }
  std::lock_guard lock(g_graph_mutex);
  g_live_graphs.erase(g);
  delete g;
}
// A child graph node holds a copy of the graph it was given (as CUDA does).
FakeGraph* clone_graph(const FakeGraph* src) {
  FakeGraph* g = new_graph(true);
  for (const FakeNode* n : src->nodes) {
    FakeNode* c = add_node(g, n->type);
    std::memcpy(c->grid, n->grid, sizeof c->grid);
    c->cluster = n->cluster;
    if (n->child) c->child = clone_graph(n->child);
  }
  return g;
}
void collect_kernels(const FakeGraph* g, bool in_child, std::vector<ExecKernel>& out) {
  for (const FakeNode* n : g->nodes) {
    if (n->type == CU_GRAPH_NODE_TYPE_KERNEL) {
      ExecKernel k{n, in_child, {n->grid[0], n->grid[1], n->grid[2]}, n->cluster};
      out.push_back(k);
    } else if (n->type == CU_GRAPH_NODE_TYPE_GRAPH && n->child) {
      collect_kernels(n->child, true, out);
    }
  }
}
ExecKernel* exec_kernel(FakeExec* x, CUgraphNode node) {
  for (auto& k : x->kernels)
    if (k.node == reinterpret_cast<const FakeNode*>(node)) return &k;
  return nullptr;
}
void build_dirty(FakeExec* x) {
  for (auto& k : x->kernels)
    if (k.enabled && k.dirty) {
      build_tmd(k.tmd, k.cluster);
      k.dirty = false;
    }
}

struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

struct ProcEntry {
  const char* name;
  const void* fn;
};
const ProcEntry* proc_table(std::size_t* n);

// cuGetProcAddress takes base names and picks the version the caller's CUDA
// version expects (mostly those cuda.h #defines the names to; but
// "cuGraphInstantiate" is the 5-argument cuGraphInstantiate_v2 even for CUDA
// 13.0, not the WithFlags cuda.h maps it to: measured on H100, driver
// 580.159.04, docs/hardware.md).
const void* lookup_proc(const char* symbol, int cuda_version) {
  std::string name = symbol;
  if (name == "cuGetProcAddress" && cuda_version >= 12000) name = "cuGetProcAddress_v2";
  else if (name == "cuGraphInstantiate" && cuda_version >= 11000) name = "cuGraphInstantiate_v2";
  else if (name == "cuGraphExecUpdate" && cuda_version >= 12000) name = "cuGraphExecUpdate_v2";
  else if ((name == "cuGraphAddKernelNode" || name == "cuGraphExecKernelNodeSetParams") && cuda_version >= 12000)
    name += "_v2";
  else if (name == "cuDeviceGetUuid" && cuda_version >= 11040) name = "cuDeviceGetUuid_v2";
  else if (name == "cuDeviceTotalMem" || name == "cuDevicePrimaryCtxRelease" || name == "cuCtxPushCurrent" ||
           name == "cuCtxPopCurrent" || name == "cuMemAlloc" || name == "cuMemFree" || name == "cuMemAllocHost" ||
           name == "cuMemcpyHtoDAsync" || name == "cuMemcpyDtoHAsync" || name == "cuStreamDestroy" ||
           name == "cuEventDestroy")
    name += "_v2";
  std::size_t n = 0;
  const ProcEntry* t = proc_table(&n);
  for (std::size_t i = 0; i < n; ++i)
    if (name == t[i].name) return t[i].fn;
  return nullptr;
}

}  // namespace

// --- the exported driver API ------------------------------------------------------
extern "C" {

CUresult CUDAAPI cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  (void)config();  // a bad configuration fails here, loudly
  if (const char* log = std::getenv("FAKECUDA_INIT_LOG")) {
    char comm[64] = {};
    const int cfd = ::open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
    if (cfd >= 0) {
      const ssize_t n = ::read(cfd, comm, sizeof comm - 1);
      ::close(cfd);
      if (n > 0 && comm[n - 1] == '\n') comm[n - 1] = '\0';
    }
    const std::string line = std::string("init ") + comm + "\n";
    const int fd = ::open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
      if (::write(fd, line.data(), line.size()) < 0) {
      }
      ::close(fd);
    }
  }
  std::call_once(g_visible_once, read_visible_devices);
  g_initialized.store(true, std::memory_order_release);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDriverGetVersion(int* version) {
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  *version = 13000;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetCount(int* count) {
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  if (!g_initialized.load(std::memory_order_acquire)) return CUDA_ERROR_NOT_INITIALIZED;
  *count = static_cast<int>(g_visible.size());
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_device(ordinal)) return r;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_device(dev)) return r;
  std::snprintf(name, static_cast<std::size_t>(len), "%s", "Stand-in GPU");
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  if (!pi) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_device(dev)) return r;
  const Config& c = config();
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = static_cast<int>(c.sm_count); break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = c.cc_major; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = c.cc_minor; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *pi = 0x10 + physical(dev); break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *pi = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *pi = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *pi = 0x7fffffff; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *pi = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *pi = c.cc_major >= 9 ? 2048 : 1536; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: *pi = c.cc_major >= 9 ? 32 : 16; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *pi = 49152; break;
    // H100/H200: 227 KiB per block (opt-in) of 228 KiB per SM; sm_86: 99 of 100.
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *pi = c.cc_major >= 9 ? 232448 : 101376; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *pi = c.cc_major >= 9 ? 233472 : 102400; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *pi = 1500000; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: *pi = c.cc_major >= 9 ? 1 : 0; break;
    default:
      if (attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
      *pi = 0;
  }
  return CUDA_SUCCESS;
}

// Deterministic per device: GPU-fa4ecda0-0000-4000-8000-0000000000<dd>.
CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  if (!uuid) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_device(dev)) return r;
  const unsigned char bytes[16] = {0xfa, 0x4e, 0xcd, 0xa0, 0x00, 0x00, 0x40, 0x00,
                                   0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, static_cast<unsigned char>(physical(dev))};
  std::memcpy(uuid->bytes, bytes, 16);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }

CUresult CUDAAPI cuDeviceGetPCIBusId(char* bus_id, int len, CUdevice dev) {
  if (!bus_id || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_device(dev)) return r;
  std::snprintf(bus_id, static_cast<std::size_t>(len), "0000:%02x:00.0", 0x10 + physical(dev));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_device(dev)) return r;
  *bytes = std::size_t{16} << 30;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_device(dev)) return r;
  *pctx = to_handle(&g_contexts[dev]);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return check_device(dev); }

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  if (!g_initialized.load(std::memory_order_acquire)) return CUDA_ERROR_NOT_INITIALIZED;
  if (ctx && !from_handle(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (t_stack.empty()) t_stack.push_back(from_handle(ctx));
  else t_stack.back() = from_handle(ctx);
  if (!t_stack.back()) t_stack.pop_back();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext* pctx) {
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (!g_initialized.load(std::memory_order_acquire)) return CUDA_ERROR_NOT_INITIALIZED;
  *pctx = to_handle(current());
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx) {
  if (!g_initialized.load(std::memory_order_acquire)) return CUDA_ERROR_NOT_INITIALIZED;
  if (!from_handle(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  t_stack.push_back(from_handle(ctx));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext* pctx) {
  if (!g_initialized.load(std::memory_order_acquire)) return CUDA_ERROR_NOT_INITIALIZED;
  if (t_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx) *pctx = to_handle(t_stack.back());
  t_stack.pop_back();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice* device) {
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  if (!g_initialized.load(std::memory_order_acquire)) return CUDA_ERROR_NOT_INITIALIZED;
  *device = current() ? current()->device : 0;
  return CUDA_SUCCESS;
}

// Held work (FAKECUDA_HOLD) is waited for, on any stream.
CUresult CUDAAPI cuCtxSynchronize(void) {
  if (CUresult r = check_init()) return r;
  wait_released(g_held_launches.load());
  wait_passed(waits_queued());
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamSynchronize(CUstream s) {
  if (CUresult r = check_init()) return r;
  wait_released(g_held_launches.load());
  wait_passed(waits_queued());
  // As on a GPU: a kernel that never runs is waited for forever.
  while (stream_of(s)->stuck.load()) std::this_thread::sleep_for(std::chrono::seconds(1));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char** str) {
  if (!str) return CUDA_ERROR_INVALID_VALUE;
  for (const auto& e : kErrors)
    if (e.code == error) {
      *str = e.text;
      return CUDA_SUCCESS;
    }
  *str = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char** str) {
  if (!str) return CUDA_ERROR_INVALID_VALUE;
  for (const auto& e : kErrors)
    if (e.code == error) {
      *str = e.name;
      return CUDA_SUCCESS;
    }
  *str = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

// Works before cuInit, as the real one does (docs/hardware.md).
CUresult CUDAAPI cuGetExportTable(const void** table, const CUuuid* id) {
  if (!table || !id) return CUDA_ERROR_INVALID_VALUE;
  if (std::memcmp(id->bytes, hook::kCallbackTableUuid, 16) != 0) {
    *table = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
  }
  *table = g_callback_table;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int,
                                unsigned int, unsigned int, unsigned int, CUstream s, void** params, void**) {
  if (!is_probe(f)) return launch();
  if (!g_initialized.load(std::memory_order_acquire)) return CUDA_ERROR_NOT_INITIALIZED;
  Tmd t;
  build_tmd(t, {});
  run_tmd(t, "launch");
  const CUresult r = run_probe(t, std::uint64_t{gx} * gy * gz, stream_of(s), params);
  if (r == CUDA_SUCCESS) note_launch();
  return r;
}

// The stand-in has no grid-wide synchronisation to model: a cooperative
// launch is a launch.
CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                           unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                                           CUstream s, void** params) {
  return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, s, params, nullptr);
}

CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig* cfg, CUfunction, void**, void**) {
  if (!cfg) return CUDA_ERROR_INVALID_VALUE;
  Cluster cl;
  for (unsigned i = 0; i < cfg->numAttrs; ++i)
    if (cfg->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
      cl = {cfg->attrs[i].value.clusterDim.x, cfg->attrs[i].value.clusterDim.y, cfg->attrs[i].value.clusterDim.z};
  return launch(cl);
}

// --- graphs (see "CUDA graphs" at the top) --------------------------------------

CUresult CUDAAPI cuGraphCreate(CUgraph* g, unsigned int flags) {
  if (!g || flags) return CUDA_ERROR_INVALID_VALUE;
  *g = reinterpret_cast<CUgraph>(new_graph(false));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphDestroy(CUgraph g) {
  if (!live_graph(g) || reinterpret_cast<FakeGraph*>(g)->embedded) return CUDA_ERROR_INVALID_VALUE;
  destroy_graph(reinterpret_cast<FakeGraph*>(g));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphAddKernelNode_v2(CUgraphNode* n, CUgraph g, const CUgraphNode*, size_t,
                                         const CUDA_KERNEL_NODE_PARAMS* p) {
  if (!n || !p || !live_graph(g)) return CUDA_ERROR_INVALID_VALUE;
  FakeNode* node = add_node(reinterpret_cast<FakeGraph*>(g), CU_GRAPH_NODE_TYPE_KERNEL);
  node->grid[0] = p->gridDimX;
  node->grid[1] = p->gridDimY;
  node->grid[2] = p->gridDimZ;
  *n = reinterpret_cast<CUgraphNode>(node);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphKernelNodeSetAttribute(CUgraphNode n, CUkernelNodeAttrID attr,
                                               const CUkernelNodeAttrValue* v) {
  if (!live_node(n) || !v) return CUDA_ERROR_INVALID_VALUE;
  if (attr == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
    reinterpret_cast<FakeNode*>(n)->cluster = {v->clusterDim.x, v->clusterDim.y, v->clusterDim.z};
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphAddChildGraphNode(CUgraphNode* n, CUgraph g, const CUgraphNode*, size_t, CUgraph child) {
  if (!n || !live_graph(g) || !live_graph(child)) return CUDA_ERROR_INVALID_VALUE;
  FakeNode* node = add_node(reinterpret_cast<FakeGraph*>(g), CU_GRAPH_NODE_TYPE_GRAPH);
  node->child = clone_graph(reinterpret_cast<FakeGraph*>(child));
  *n = reinterpret_cast<CUgraphNode>(node);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphChildGraphNodeGetGraph(CUgraphNode n, CUgraph* out) {
  if (!out || !live_node(n) || reinterpret_cast<FakeNode*>(n)->type != CU_GRAPH_NODE_TYPE_GRAPH)
    return CUDA_ERROR_INVALID_VALUE;
  *out = reinterpret_cast<CUgraph>(reinterpret_cast<FakeNode*>(n)->child);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphGetNodes(CUgraph g, CUgraphNode* nodes, size_t* count) {
  if (!count || !live_graph(g)) return CUDA_ERROR_INVALID_VALUE;
  const auto& v = reinterpret_cast<FakeGraph*>(g)->nodes;
  if (nodes)
    for (std::size_t i = 0; i < v.size() && i < *count; ++i) nodes[i] = reinterpret_cast<CUgraphNode>(v[i]);
  else
    *count = v.size();
  if (nodes && *count > v.size()) *count = v.size();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphNodeGetType(CUgraphNode n, CUgraphNodeType* type) {
  if (!type || !live_node(n)) return CUDA_ERROR_INVALID_VALUE;
  *type = reinterpret_cast<FakeNode*>(n)->type;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph g, unsigned long long) {
  if (!exec || !live_graph(g)) return CUDA_ERROR_INVALID_VALUE;
  auto* x = new FakeExec;
  collect_kernels(reinterpret_cast<FakeGraph*>(g), false, x->kernels);
  {
    std::lock_guard lock(g_graph_mutex);
    g_live_execs.insert(x);
  }
  *exec = reinterpret_cast<CUgraphExec>(x);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuGraphInstantiate(CUgraphExec* exec, CUgraph g, CUgraphNode*, char*, size_t) {
  return cuGraphInstantiateWithFlags(exec, g, 0);
}
CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec* exec, CUgraph g, CUgraphNode*, char*, size_t) {
  return cuGraphInstantiateWithFlags(exec, g, 0);
}
CUresult CUDAAPI cuGraphInstantiateWithParams(CUgraphExec* exec, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
  const CUresult r = cuGraphInstantiateWithFlags(exec, g, p ? p->flags : 0);
  if (p) p->result_out = r == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
  return r;
}

CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec e) {
  FakeExec* x = live_exec(e);
  if (!x) return CUDA_ERROR_INVALID_VALUE;
  {
    std::lock_guard lock(g_graph_mutex);
    g_live_execs.erase(x);
  }
  delete x;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphUpload(CUgraphExec e, CUstream) {
  if (!g_initialized.load(std::memory_order_acquire)) return CUDA_ERROR_NOT_INITIALIZED;
  FakeExec* x = live_exec(e);
  if (!x) return CUDA_ERROR_INVALID_VALUE;
  build_dirty(x);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphLaunch(CUgraphExec e, CUstream s) {
  if (CUresult r = cuGraphUpload(e, s)) return r;
  for (const auto& k : reinterpret_cast<FakeExec*>(e)->kernels) {
    if (!k.enabled) continue;
    char source[32];
    std::snprintf(source, sizeof source, "graph%u", k.grid[0]);
    run_tmd(k.tmd, source);
  }
  note_launch();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphNodeGetEnabled(CUgraphExec e, CUgraphNode n, unsigned int* on) {
  FakeExec* x = live_exec(e);
  if (!x || !on || !live_node(n)) return CUDA_ERROR_INVALID_VALUE;
  ExecKernel* k = exec_kernel(x, n);
  if (!k || (k->in_child && config().child_nodes == ChildNodes::kRefuse)) return CUDA_ERROR_INVALID_VALUE;
  *on = k->enabled ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphNodeSetEnabled(CUgraphExec e, CUgraphNode n, unsigned int on) {
  FakeExec* x = live_exec(e);
  if (!x || !live_node(n)) return CUDA_ERROR_INVALID_VALUE;
  ExecKernel* k = exec_kernel(x, n);
  if (!k) return CUDA_ERROR_INVALID_VALUE;
  if (k->in_child && config().child_nodes == ChildNodes::kRefuse) return CUDA_ERROR_INVALID_VALUE;
  if (k->in_child && config().child_nodes == ChildNodes::kIgnore) return CUDA_SUCCESS;
  if (k->enabled != (on != 0)) k->dirty = true;
  k->enabled = on != 0;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphExecKernelNodeSetParams_v2(CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS* p) {
  FakeExec* x = live_exec(e);
  if (!x || !p || !live_node(n)) return CUDA_ERROR_INVALID_VALUE;
  ExecKernel* k = exec_kernel(x, n);
  if (!k) return CUDA_ERROR_INVALID_VALUE;
  const unsigned grid[3] = {p->gridDimX, p->gridDimY, p->gridDimZ};
  if (std::memcmp(grid, k->grid, sizeof grid) != 0) k->dirty = true;  // a new grid re-encodes
  std::memcpy(k->grid, grid, sizeof grid);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphExecUpdate_v2(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo* info) {
  FakeExec* x = live_exec(e);
  if (!x || !live_graph(g)) return CUDA_ERROR_INVALID_VALUE;
  std::vector<ExecKernel> fresh;
  collect_kernels(reinterpret_cast<FakeGraph*>(g), false, fresh);
  if (fresh.size() != x->kernels.size()) {
    if (info) info->result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
    return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
  }
  // Nodes pair up in order; the exec keeps identifying them by the nodes
  // it was instantiated from. Only a changed grid re-encodes.
  for (std::size_t i = 0; i < fresh.size(); ++i) {
    ExecKernel& k = x->kernels[i];
    if (std::memcmp(k.grid, fresh[i].grid, sizeof k.grid) != 0) k.dirty = true;
    std::memcpy(k.grid, fresh[i].grid, sizeof k.grid);
  }
  if (info) info->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuGraphExecUpdate(CUgraphExec e, CUgraph g, CUgraphNode*, CUgraphExecUpdateResult* res) {
  CUgraphExecUpdateResultInfo info{};
  const CUresult r = cuGraphExecUpdate_v2(e, g, &info);
  if (res) *res = info.result;
  return r;
}

// The stand-in runs only the probe kernel (see "Kernels" at the top): any
// other device code fails to load, cleanly, so GPU calibration reports an
// error instead of hanging.
CUresult CUDAAPI cuModuleLoadData(CUmodule* m, const void* image) { return load_module(m, image); }
CUresult CUDAAPI cuModuleLoadDataEx(CUmodule* m, const void* image, unsigned int, CUjit_option*, void**) {
  return load_module(m, image);
}
CUresult CUDAAPI cuModuleLoad(CUmodule*, const char*) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult CUDAAPI cuModuleLoadFatBinary(CUmodule*, const void*) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult CUDAAPI cuLibraryLoadData(CUlibrary*, const void*, CUjit_option*, void**, unsigned int,
                                   CUlibraryOption*, void**, unsigned int) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult CUDAAPI cuModuleUnload(CUmodule m) {
  return reinterpret_cast<FakeModule*>(m) == &g_probe_module ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
CUresult CUDAAPI cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
  if (!f || !name) return CUDA_ERROR_INVALID_VALUE;
  if (reinterpret_cast<FakeModule*>(m) != &g_probe_module) return CUDA_ERROR_INVALID_HANDLE;
  if (std::strcmp(name, kProbeEntry) != 0) return CUDA_ERROR_NOT_FOUND;
  *f = reinterpret_cast<CUfunction>(&g_probe_function);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuFuncSetAttribute(CUfunction f, CUfunction_attribute, int) {
  return is_probe(f) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
// One probe block per SM: it asks for more shared memory than half an SM has.
CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessor(int* n, CUfunction f, int, size_t) {
  if (!n) return CUDA_ERROR_INVALID_VALUE;
  if (!is_probe(f)) return CUDA_ERROR_INVALID_HANDLE;
  *n = 1;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuOccupancyMaxActiveClusters(int*, CUfunction, const CUlaunchConfig*) {
  return CUDA_ERROR_INVALID_HANDLE;
}
CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* p, size_t bytes) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  if (!g_initialized.load(std::memory_order_acquire)) return CUDA_ERROR_NOT_INITIALIZED;
  void* mem = std::malloc(bytes ? bytes : 1);
  if (!mem) return CUDA_ERROR_OUT_OF_MEMORY;
  std::lock_guard lock(g_memory_mutex);
  g_allocations[reinterpret_cast<std::uintptr_t>(mem)] = bytes;
  *p = reinterpret_cast<std::uintptr_t>(mem);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemFree_v2(CUdeviceptr p) {
  std::lock_guard lock(g_memory_mutex);
  auto it = g_allocations.find(static_cast<std::uintptr_t>(p));
  if (it == g_allocations.end()) return CUDA_ERROR_INVALID_VALUE;
  std::free(reinterpret_cast<void*>(it->first));
  g_allocations.erase(it);
  return CUDA_SUCCESS;
}
// A copy queued behind a kernel that never runs never happens either.
CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, CUstream s) {
  if (!src || !device_range(dst, bytes)) return CUDA_ERROR_INVALID_VALUE;
  if (!stream_of(s)->stuck.load()) std::memcpy(reinterpret_cast<void*>(static_cast<std::uintptr_t>(dst)), src, bytes);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, CUstream s) {
  if (!dst || !device_range(src, bytes)) return CUDA_ERROR_INVALID_VALUE;
  if (!stream_of(s)->stuck.load()) std::memcpy(dst, reinterpret_cast<const void*>(static_cast<std::uintptr_t>(src)), bytes);
  return CUDA_SUCCESS;
}

// Host memory is plain memory here.
CUresult CUDAAPI cuMemAllocHost_v2(void** p, size_t bytes) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  if (!g_initialized.load(std::memory_order_acquire)) return CUDA_ERROR_NOT_INITIALIZED;
  *p = std::malloc(bytes ? bytes : 1);
  return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
CUresult CUDAAPI cuMemFreeHost(void* p) {
  std::free(p);
  return CUDA_SUCCESS;
}

// Streams: work completes at once, except behind a probe kernel that can
// never run (see run_probe), where it waits forever, and while held work
// exists (FAKECUDA_HOLD; see "Events and held work" at the top).
CUresult CUDAAPI cuStreamCreate(CUstream* s, unsigned int) {
  if (!s) return CUDA_ERROR_INVALID_VALUE;
  if (!g_initialized.load(std::memory_order_acquire)) return CUDA_ERROR_NOT_INITIALIZED;
  *s = reinterpret_cast<CUstream>(new FakeStream);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuStreamDestroy_v2(CUstream s) {
  if (stream_of(s) == &g_default_stream) return CUDA_ERROR_INVALID_HANDLE;
  delete reinterpret_cast<FakeStream*>(s);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuStreamQuery(CUstream s) {
  if (CUresult r = check_init()) return r;
  if (!released(g_held_launches.load())) return CUDA_ERROR_NOT_READY;  // held work, on any stream
  if (!waits_passed(waits_queued())) return CUDA_ERROR_NOT_READY;
  return stream_of(s)->stuck.load() ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
// Stream capture, in CUDA's global mode (PyTorch's): one capture at a time,
// of nothing (no kernel may be launched into it here). While it is under way,
// a driver call of another thread that CUDA counts unsafe (here: an event
// record, query, synchronise or elapsed time) invalidates
// it, and its end answers CUDA_ERROR_STREAM_CAPTURE_INVALIDATED. Measured:
// PyTorch's capture of the LC forward failed ("Offset increment outside
// graph capture") while the latency-critical controller thread queried
// events, once in about ten runs on an H100 and in 2 of 3 visits on an
// H200 (docs/runs.md, run 60).
static std::atomic<long> g_capture_thread{0};  // the capturing thread's id, 0: none
static std::atomic<CUstream> g_capture_stream{nullptr};
static std::atomic<bool> g_capture_broken{false};
static long thread_id() { return static_cast<long>(::syscall(SYS_gettid)); }
static void unsafe_call() {
  const long t = g_capture_thread.load();
  if (t != 0 && t != thread_id()) g_capture_broken = true;
}
__attribute__((visibility("default"))) CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream s, int) {
  if (CUresult r = check_init()) return r;
  long none = 0;
  if (!g_capture_thread.compare_exchange_strong(none, thread_id())) return CUDA_ERROR_ILLEGAL_STATE;
  g_capture_broken = false;
  g_capture_stream = s;
  return CUDA_SUCCESS;
}
__attribute__((visibility("default"))) CUresult CUDAAPI cuStreamBeginCapture(CUstream s) {
  return cuStreamBeginCapture_v2(s, 0);
}
__attribute__((visibility("default"))) CUresult CUDAAPI cuStreamEndCapture(CUstream s, CUgraph* g) {
  if (CUresult r = check_init()) return r;
  if (g_capture_thread.load() == 0 || g_capture_stream.load() != s) return CUDA_ERROR_ILLEGAL_STATE;
  const bool broken = g_capture_broken.load();
  g_capture_thread = 0;
  if (g) *g = nullptr;
  return broken ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
}
CUresult CUDAAPI cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* status) {
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_init()) return r;
  *status = g_capture_thread.load() != 0 && g_capture_stream.load() == s ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                                                                          : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}

// Events (see "Events and held work" at the top).
CUresult CUDAAPI cuEventCreate(CUevent* e, unsigned int flags) {
  if (!e) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_init()) return r;
  // CU_EVENT_DEFAULT | BLOCKING_SYNC | DISABLE_TIMING | INTERPROCESS (4),
  // which CUDA accepts only with DISABLE_TIMING.
  if ((flags & ~7u) || ((flags & 4u) && !(flags & CU_EVENT_DISABLE_TIMING))) return CUDA_ERROR_INVALID_VALUE;
  auto* ev = new FakeEvent;
  ev->timing = !(flags & CU_EVENT_DISABLE_TIMING);
  {
    std::lock_guard lock(g_event_mutex);
    g_live_events.insert(ev);
  }
  *e = reinterpret_cast<CUevent>(ev);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuEventDestroy_v2(CUevent e) {
  if (CUresult r = check_init()) return r;
  std::lock_guard lock(g_event_mutex);
  if (!g_live_events.erase(reinterpret_cast<FakeEvent*>(e))) return CUDA_ERROR_INVALID_HANDLE;
  delete reinterpret_cast<FakeEvent*>(e);  // a waiter holds a copy, never the event
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuEventDestroy(CUevent e) { return cuEventDestroy_v2(e); }
// The event waits for what the process has launched while held, and, behind
// a kernel that never runs, forever.
CUresult CUDAAPI cuEventRecord(CUevent e, CUstream s) {
  if (CUresult r = check_init()) return r;
  unsafe_call();
  std::uint64_t held = g_held_launches.load();
  if (released(held)) held = 0;  // nothing held now: complete at once
  const bool stuck = stream_of(s)->stuck.load();
  const std::size_t waits = waits_queued();
  std::lock_guard lock(g_event_mutex);
  auto it = g_live_events.find(reinterpret_cast<FakeEvent*>(e));
  if (it == g_live_events.end()) return CUDA_ERROR_INVALID_HANDLE;
  (*it)->held = held;  // replaces what it waited for
  (*it)->waits = waits;
  (*it)->stuck = stuck;
  (*it)->recorded = true;
  (*it)->gpu_ns = g_gpu_ns.load();
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuEventQuery(CUevent e) {
  if (CUresult r = check_init()) return r;
  unsafe_call();
  FakeEvent state;
  if (!event_state(e, state)) return CUDA_ERROR_INVALID_HANDLE;
  return state.stuck || !released(state.held) || !waits_passed(state.waits) ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
// As CUDA documents it: both events recorded and complete, both with timing.
// Not in cuda_driver_api.hpp (the shim looks it up by name), so exported here.
__attribute__((visibility("default"))) CUresult CUDAAPI cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
  if (!ms) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_init()) return r;
  unsafe_call();
  FakeEvent a, b;
  if (!event_state(start, a) || !event_state(end, b)) return CUDA_ERROR_INVALID_HANDLE;
  if (!a.timing || !b.timing || !a.recorded || !b.recorded) return CUDA_ERROR_INVALID_HANDLE;
  if (a.stuck || b.stuck || !released(a.held) || !released(b.held) || !waits_passed(std::max(a.waits, b.waits)))
    return CUDA_ERROR_NOT_READY;
  *ms = static_cast<float>((static_cast<double>(b.gpu_ns) - static_cast<double>(a.gpu_ns)) / 1e6);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventSynchronize(CUevent e) {
  if (CUresult r = check_init()) return r;
  unsafe_call();
  FakeEvent state;
  if (!event_state(e, state)) return CUDA_ERROR_INVALID_HANDLE;
  wait_released(state.held);
  wait_passed(state.waits);
  // As cuStreamSynchronize: a kernel that never runs is waited for forever.
  while (state.stuck) std::this_thread::sleep_for(std::chrono::seconds(1));
  return CUDA_SUCCESS;
}

// Mapped host memory: host memory the device reaches at the same address
// (unified addressing, as on a 64-bit GPU). Not in cuda_driver_api.hpp (the
// shim looks these up by name), so exported here.
__attribute__((visibility("default"))) CUresult CUDAAPI cuMemHostAlloc(void** pp, size_t bytes, unsigned int) {
  if (!pp) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_init()) return r;
  if (config().host_alloc_fails) return CUDA_ERROR_OUT_OF_MEMORY;
  void* mem = nullptr;
  if (::posix_memalign(&mem, 4096, bytes ? bytes : 1) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
  std::memset(mem, 0, bytes ? bytes : 1);
  std::lock_guard lock(g_memory_mutex);
  g_allocations[reinterpret_cast<std::uintptr_t>(mem)] = bytes;
  *pp = mem;
  return CUDA_SUCCESS;
}
__attribute__((visibility("default"))) CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr* d, void* p,
                                                                                      unsigned int flags) {
  if (!d || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (!device_range(reinterpret_cast<std::uintptr_t>(p), 1)) return CUDA_ERROR_INVALID_VALUE;
  *d = reinterpret_cast<std::uintptr_t>(p);
  return CUDA_SUCCESS;
}
// CU_STREAM_WAIT_VALUE_EQ (1) only; see "Stream waits" at the top.
__attribute__((visibility("default"))) CUresult CUDAAPI cuStreamWaitValue32_v2(CUstream, CUdeviceptr addr,
                                                                                std::uint32_t value, unsigned int flags) {
  if (CUresult r = check_init()) return r;
  if (flags != 0x1 || addr % 4 != 0 || !device_range(addr, 4)) return CUDA_ERROR_INVALID_VALUE;
  const auto* word = reinterpret_cast<const std::uint32_t*>(static_cast<std::uintptr_t>(addr));
  {
    std::lock_guard lock(g_wait_mutex);
    g_waits.push_back({word, value});
  }
  if (!config().waits_path.empty()) {
    static const int fd = ::open(config().waits_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) fatal("cannot open FAKECUDA_WAITS", config().waits_path.c_str());
    char line[80];
    const int n = std::snprintf(line, sizeof line, "%d wait %u %u\n", static_cast<int>(::getpid()),
                                __atomic_load_n(word, __ATOMIC_ACQUIRE), value);
    if (::write(fd, line, static_cast<std::size_t>(n)) != n) fatal("short write to FAKECUDA_WAITS", nullptr);
  }
  return CUDA_SUCCESS;
}
__attribute__((visibility("default"))) CUresult CUDAAPI cuStreamWaitValue32_v2_ptsz(CUstream s, CUdeviceptr addr,
                                                                                     std::uint32_t value,
                                                                                     unsigned int flags) {
  return cuStreamWaitValue32_v2(s, addr, value, flags);
}

CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t,
                                     CUdriverProcAddressQueryResult* status) {
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  const void* f = lookup_proc(symbol, cudaVersion);
  *pfn = const_cast<void*>(f);
  if (status) *status = f ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return f ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, nullptr);
}

}  // extern "C"

namespace {

#define FAKECUDA_PROC(fn) {#fn, reinterpret_cast<const void*>(&fn)}
const ProcEntry kProcs[] = {
    FAKECUDA_PROC(cuInit),
    FAKECUDA_PROC(cuDriverGetVersion),
    FAKECUDA_PROC(cuDeviceGetCount),
    FAKECUDA_PROC(cuDeviceGet),
    FAKECUDA_PROC(cuDeviceGetName),
    FAKECUDA_PROC(cuDeviceGetAttribute),
    FAKECUDA_PROC(cuDeviceGetUuid),
    FAKECUDA_PROC(cuDeviceGetUuid_v2),
    FAKECUDA_PROC(cuDeviceGetPCIBusId),
    FAKECUDA_PROC(cuDeviceTotalMem_v2),
    FAKECUDA_PROC(cuDevicePrimaryCtxRetain),
    FAKECUDA_PROC(cuDevicePrimaryCtxRelease_v2),
    FAKECUDA_PROC(cuCtxSetCurrent),
    FAKECUDA_PROC(cuCtxGetCurrent),
    FAKECUDA_PROC(cuCtxPushCurrent_v2),
    FAKECUDA_PROC(cuCtxPopCurrent_v2),
    FAKECUDA_PROC(cuCtxGetDevice),
    FAKECUDA_PROC(cuCtxSynchronize),
    FAKECUDA_PROC(cuStreamSynchronize),
    FAKECUDA_PROC(cuGetErrorString),
    FAKECUDA_PROC(cuGetErrorName),
    FAKECUDA_PROC(cuGetExportTable),
    FAKECUDA_PROC(cuLaunchKernel),
    FAKECUDA_PROC(cuLaunchKernelEx),
    FAKECUDA_PROC(cuModuleLoadData),
    FAKECUDA_PROC(cuModuleLoadDataEx),
    FAKECUDA_PROC(cuModuleLoad),
    FAKECUDA_PROC(cuModuleLoadFatBinary),
    FAKECUDA_PROC(cuLibraryLoadData),
    FAKECUDA_PROC(cuModuleUnload),
    FAKECUDA_PROC(cuModuleGetFunction),
    FAKECUDA_PROC(cuFuncSetAttribute),
    FAKECUDA_PROC(cuOccupancyMaxActiveBlocksPerMultiprocessor),
    FAKECUDA_PROC(cuOccupancyMaxActiveClusters),
    FAKECUDA_PROC(cuMemAlloc_v2),
    FAKECUDA_PROC(cuMemFree_v2),
    FAKECUDA_PROC(cuMemcpyHtoDAsync_v2),
    FAKECUDA_PROC(cuMemcpyDtoHAsync_v2),
    FAKECUDA_PROC(cuMemAllocHost_v2),
    FAKECUDA_PROC(cuMemFreeHost),
    FAKECUDA_PROC(cuStreamCreate),
    FAKECUDA_PROC(cuStreamDestroy_v2),
    FAKECUDA_PROC(cuStreamQuery),
    FAKECUDA_PROC(cuStreamIsCapturing),
    {"cuStreamIsCapturing_ptsz", reinterpret_cast<const void*>(&cuStreamIsCapturing)},
    FAKECUDA_PROC(cuEventCreate),
    FAKECUDA_PROC(cuEventDestroy_v2),
    FAKECUDA_PROC(cuEventRecord),
    {"cuEventRecord_ptsz", reinterpret_cast<const void*>(&cuEventRecord)},
    FAKECUDA_PROC(cuEventQuery),
    FAKECUDA_PROC(cuEventElapsedTime),
    FAKECUDA_PROC(cuEventSynchronize),
    FAKECUDA_PROC(cuLaunchCooperativeKernel),
    {"cuLaunchCooperativeKernel_ptsz", reinterpret_cast<const void*>(&cuLaunchCooperativeKernel)},
    FAKECUDA_PROC(cuGetProcAddress),
    FAKECUDA_PROC(cuGetProcAddress_v2),
    FAKECUDA_PROC(cuGraphCreate),
    FAKECUDA_PROC(cuGraphDestroy),
    FAKECUDA_PROC(cuGraphAddKernelNode_v2),
    FAKECUDA_PROC(cuGraphKernelNodeSetAttribute),
    FAKECUDA_PROC(cuGraphAddChildGraphNode),
    FAKECUDA_PROC(cuGraphChildGraphNodeGetGraph),
    FAKECUDA_PROC(cuGraphGetNodes),
    FAKECUDA_PROC(cuGraphNodeGetType),
    FAKECUDA_PROC(cuGraphInstantiate),
    FAKECUDA_PROC(cuGraphInstantiate_v2),
    FAKECUDA_PROC(cuGraphInstantiateWithFlags),
    FAKECUDA_PROC(cuGraphInstantiateWithParams),
    FAKECUDA_PROC(cuGraphExecDestroy),
    FAKECUDA_PROC(cuGraphUpload),
    FAKECUDA_PROC(cuGraphLaunch),
    FAKECUDA_PROC(cuGraphNodeGetEnabled),
    FAKECUDA_PROC(cuGraphNodeSetEnabled),
    FAKECUDA_PROC(cuGraphExecKernelNodeSetParams_v2),
    FAKECUDA_PROC(cuGraphExecUpdate),
    FAKECUDA_PROC(cuGraphExecUpdate_v2),
};
#undef FAKECUDA_PROC

const ProcEntry* proc_table(std::size_t* n) {
  *n = std::size(kProcs);
  return kProcs;
}

// The layouts above must be what tmd::detect recognises, or every test built
// on them would test nothing.
[[maybe_unused]] const bool g_layouts_checked = [] {
  for (const auto& l : kLayouts) {
    unsigned char image[kTmdBytes] = {};
    image[72] = l.byte72;
    image[58] = l.byte58;
    if (tmd::detect(image) != l.layout) fatal("layout table disagrees with tmd::detect for", l.name);
  }
  return true;
}();

}  // namespace
