// SPDX-License-Identifier: Apache-2.0
// The intercepted driver calls that feed the roles: kernel launches (before
// and after each, for either role), graph launches (graphs.cpp calls in),
// and stream captures (counted, so that the shim makes no driver call of
// its own during one); and how the shim hands them out (role_hooks.hpp).
#include <cstring>
#include <exception>

#include "be_borrow.hpp"
#include "be_gate.hpp"
#include "be_queue.hpp"
#include "lc_controller.hpp"
#include "nvtaskset/kernel_durations.hpp"
#include "role_shared.hpp"

namespace nvtaskset::roles_shim {

namespace {

// One launch, either role: what before() decided, for after().
struct Launch {
  std::uint64_t lc_seq = 0;
  std::uint64_t key = 0;  // the kernel, for the work bound
  bool floor = false;
  int timed = -1;  // the KernelTimer pair timing it
};

Launch before(CUstream s, bool per_thread, bool graph, std::uint64_t key) noexcept {
  Launch l;
  l.key = key;
  switch (static_cast<Role>(g_role.load(std::memory_order_relaxed))) {
    case Role::kLatencyCritical: l.lc_seq = lc_before(s, per_thread, key); break;
    case Role::kBestEffort:
      work_wait(key);
      try {
        // Under the gate a kernel launch is queued behind it (a graph's
        // kernels keep the TPCs they were encoded with: it holds).
        l.floor = g_gate.on && !graph && gate_before(s, per_thread, key) ? be_before_gate() : be_before(s, per_thread, graph);
      } catch (const std::exception&) {
        l.floor = true;  // the safe side
      }
      if (!l.floor && !graph && borrow_before(s, per_thread, key, l.timed)) {
        l.floor = true;
        if (ctl::Header* h = header()) bump(h->kept_off);
      }
      if (l.floor) g_floor_users.fetch_add(1, std::memory_order_acq_rel);
      break;
    case Role::kNone: break;
  }
  return l;
}

void after(const Launch& l, CUstream s, bool per_thread, bool launched = true) noexcept {
  switch (static_cast<Role>(g_role.load(std::memory_order_relaxed))) {
    case Role::kLatencyCritical: lc_after(l.lc_seq, s, per_thread); break;
    case Role::kBestEffort:
      borrow_after(l.timed, s, per_thread, launched);
      if (l.floor) g_floor_users.fetch_sub(1, std::memory_order_acq_rel);
      be_after(s, per_thread, l.key, l.floor);
      break;
    case Role::kNone: break;
  }
}

// The wrappers of the intercepted calls, by the driver's names.
enum Fn : unsigned {
  kLaunchKernel, kLaunchKernelPtsz, kLaunchKernelEx, kLaunchKernelExPtsz, kCoop, kCoopPtsz,
  kBeginCapture, kBeginCapturePtsz, kBeginCaptureV2, kBeginCaptureV2Ptsz, kBeginCaptureToGraph,
  kBeginCaptureToGraphPtsz, kEndCapture, kEndCapturePtsz, kFnCount
};
constexpr const char* kNames[kFnCount] = {
    "cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz",
    "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz", "cuStreamBeginCapture",
    "cuStreamBeginCapture_ptsz", "cuStreamBeginCapture_v2", "cuStreamBeginCapture_v2_ptsz",
    "cuStreamBeginCaptureToGraph", "cuStreamBeginCaptureToGraph_ptsz", "cuStreamEndCapture",
    "cuStreamEndCapture_ptsz"};
std::atomic<void*> g_real[kFnCount]{};

template <class F>
F real(Fn f) noexcept {
  return reinterpret_cast<F>(g_real[f].load(std::memory_order_acquire));
}

using LaunchKernelFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    CUstream, void**, void**);
using LaunchKernelExFn = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
using CoopFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            CUstream, void**);

template <Fn F, bool kPtsz>
CUresult w_launch_kernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned shm, CUstream s, void** params, void** extra) {
  const Launch l = before(s, kPtsz, false, roles::kernel_key(f, std::uint64_t{gx} * gy * gz));
  const CUresult rc = real<LaunchKernelFn>(F)(f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
  after(l, s, kPtsz, rc == CUDA_SUCCESS);
  return rc;
}

template <Fn F, bool kPtsz>
CUresult w_launch_kernel_ex(const CUlaunchConfig* cfg, CUfunction f, void** params, void** extra) {
  CUstream s = cfg != nullptr ? cfg->hStream : nullptr;
  const Launch l =
      before(s, kPtsz, false,
             roles::kernel_key(f, cfg != nullptr ? std::uint64_t{cfg->gridDimX} * cfg->gridDimY * cfg->gridDimZ : 0));
  const CUresult rc = real<LaunchKernelExFn>(F)(cfg, f, params, extra);
  after(l, s, kPtsz, rc == CUDA_SUCCESS);
  return rc;
}

template <Fn F, bool kPtsz>
CUresult w_coop(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                unsigned shm, CUstream s, void** params) {
  const Launch l = before(s, kPtsz, false, roles::kernel_key(f, std::uint64_t{gx} * gy * gz));
  const CUresult rc = real<CoopFn>(F)(f, gx, gy, gz, bx, by, bz, shm, s, params);
  after(l, s, kPtsz, rc == CUDA_SUCCESS);
  return rc;
}

// Captures: counted (g_captures), the calls themselves unchanged. The
// driver's signatures (cuda.h): (stream); (stream, mode); (stream, graph,
// dependencies, edge data, count, mode); end: (stream, graph*).
using BeginFn = CUresult (*)(CUstream);
using BeginV2Fn = CUresult (*)(CUstream, int);
using BeginToGraphFn = CUresult (*)(CUstream, CUgraph, const void*, const void*, size_t, int);
using EndFn = CUresult (*)(CUstream, CUgraph*);

// A capture is counted before it begins, and begins only once the
// controller is in none of its own driver calls (controller_call): either
// the controller sees the count and makes no call, or the capture waits for
// the call to end. Counted after the begin, a controller that had just
// read no capture could query an event as the capture began, invalidating
// it, as PyTorch's captures were on an H200 (docs/design.md, "The numbers,
// measured").
template <class Begin>
CUresult begin_capture(Begin begin) noexcept {
  g_captures.fetch_add(1, std::memory_order_seq_cst);
  // The controller's calls are an event query or two (microseconds); a
  // controller stuck in one is not waited for beyond 20 ms.
  for (int i = 0; i < 2000 && g_ctl_calls.load(std::memory_order_seq_cst) != 0; ++i) sleep_ns(10'000);
  const CUresult rc = begin();
  if (rc != CUDA_SUCCESS) g_captures.fetch_sub(1, std::memory_order_acq_rel);
  return rc;
}
template <Fn F>
CUresult w_begin(CUstream s) {
  return begin_capture([&] { return real<BeginFn>(F)(s); });
}
template <Fn F>
CUresult w_begin_v2(CUstream s, int mode) {
  return begin_capture([&] { return real<BeginV2Fn>(F)(s, mode); });
}
template <Fn F>
CUresult w_begin_to_graph(CUstream s, CUgraph g, const void* deps, const void* edges, size_t n, int mode) {
  return begin_capture([&] { return real<BeginToGraphFn>(F)(s, g, deps, edges, n, mode); });
}
template <Fn F>
CUresult w_end(CUstream s, CUgraph* g) {
  const CUresult rc = real<EndFn>(F)(s, g);
  // A capture ends with this call whatever it answers (an invalidated one
  // too), unless the stream was not capturing.
  int n = g_captures.load(std::memory_order_acquire);
  while (n > 0 && !g_captures.compare_exchange_weak(n, n - 1, std::memory_order_acq_rel)) {
  }
  return rc;
}

template <class W>
void* addr(W* w) noexcept {
  void* p;
  static_assert(sizeof p == sizeof w);
  std::memcpy(&p, &w, sizeof p);
  return p;
}

void* wrapper_of(unsigned f) noexcept {
  switch (f) {
    case kLaunchKernel: return addr(&w_launch_kernel<kLaunchKernel, false>);
    case kLaunchKernelPtsz: return addr(&w_launch_kernel<kLaunchKernelPtsz, true>);
    case kLaunchKernelEx: return addr(&w_launch_kernel_ex<kLaunchKernelEx, false>);
    case kLaunchKernelExPtsz: return addr(&w_launch_kernel_ex<kLaunchKernelExPtsz, true>);
    case kCoop: return addr(&w_coop<kCoop, false>);
    case kCoopPtsz: return addr(&w_coop<kCoopPtsz, true>);
    case kBeginCapture: return addr(&w_begin<kBeginCapture>);
    case kBeginCapturePtsz: return addr(&w_begin<kBeginCapturePtsz>);
    case kBeginCaptureV2: return addr(&w_begin_v2<kBeginCaptureV2>);
    case kBeginCaptureV2Ptsz: return addr(&w_begin_v2<kBeginCaptureV2Ptsz>);
    case kBeginCaptureToGraph: return addr(&w_begin_to_graph<kBeginCaptureToGraph>);
    case kBeginCaptureToGraphPtsz: return addr(&w_begin_to_graph<kBeginCaptureToGraphPtsz>);
    case kEndCapture: return addr(&w_end<kEndCapture>);
    case kEndCapturePtsz: return addr(&w_end<kEndCapturePtsz>);
    default: return nullptr;
  }
}

}  // namespace

void* wrap_export(const char* name, void* real_fn) noexcept {
  if (role() == Role::kNone || real_fn == nullptr) return nullptr;
  for (unsigned f = 0; f < kFnCount; ++f) {
    if (std::strcmp(name, kNames[f]) != 0) continue;
    g_real[f].store(real_fn, std::memory_order_release);
    return wrapper_of(f);
  }
  return nullptr;
}

void hand_out(void** pfn) noexcept {
  if (pfn == nullptr || *pfn == nullptr || role() == Role::kNone) return;
  for (unsigned f = 0; f < kFnCount; ++f)
    if (void* r = g_real[f].load(std::memory_order_acquire); r != nullptr && *pfn == r) {
      *pfn = wrapper_of(f);
      return;
    }
}

std::uint64_t before_graph_launch(const void* exec, CUstream s, bool per_thread) noexcept {
  return before(s, per_thread, true, roles::kernel_key(exec, 0)).lc_seq;  // a graph never runs on the floor
}

void after_graph_launch(std::uint64_t token, const void* exec, CUstream s, bool per_thread) noexcept {
  Launch l;
  l.lc_seq = token;
  l.key = roles::kernel_key(exec, 0);
  after(l, s, per_thread);
}

}  // namespace nvtaskset::roles_shim
