// SPDX-License-Identifier: Apache-2.0
// The stand-in driver's events, capture query and cooperative launches, and
// FAKECUDA_HOLD's held work (tests/fakecuda/fakecuda.cpp, "Events and held
// work"): tests that rely on work still "running on the GPU" are only as good
// as this model. Each scenario runs in a forked child, which loads the
// stand-in with its own environment (read once per process) and reports the
// first check that failed on stderr.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "nvtaskset/cuda_driver_api.hpp"

namespace fs = std::filesystem;

namespace {

const std::string kFakeDriver = std::string(NVTASKSET_BUILD_DIR) + "/tests/fakecuda/lib/libcuda.so.1";

struct TempDir {
  fs::path path;
  TempDir() {
    char t[] = "/tmp/nvtaskset-fcev-XXXXXX";
    path = ::mkdtemp(t);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// In the child: a failed check ends it with status 1.
#define CHILD_CHECK(cond)                                                             \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::_Exit(1);                                                                  \
    }                                                                                 \
  } while (0)

// Runs `body` in a child with `env` set; the child's exit status (0: passed).
int in_child(const std::vector<std::pair<std::string, std::string>>& env, const std::function<void()>& body) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    body();
    std::fflush(nullptr);
    std::_Exit(0);
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The stand-in's functions, looked up by name.
struct Driver {
  void* h = nullptr;
  template <class F>
  F get(const char* name) {
    void* p = ::dlsym(h, name);
    if (!p) {
      std::fprintf(stderr, "the stand-in does not export %s\n", name);
      std::_Exit(2);
    }
    return reinterpret_cast<F>(p);
  }
#define FN(name) decltype(&::name) name = get<decltype(&::name)>(#name)
  Driver() : h(::dlopen(kFakeDriver.c_str(), RTLD_NOW | RTLD_LOCAL)) {
    if (!h) {
      std::fprintf(stderr, "cannot load %s: %s\n", kFakeDriver.c_str(), ::dlerror());
      std::_Exit(2);
    }
  }
  FN(cuInit);
  FN(cuEventCreate);
  FN(cuEventDestroy_v2);
  FN(cuEventRecord);
  FN(cuEventQuery);
  FN(cuEventSynchronize);
  FN(cuStreamIsCapturing);
  FN(cuStreamCreate);
  FN(cuStreamQuery);
  FN(cuStreamSynchronize);
  FN(cuCtxSynchronize);
  FN(cuLaunchKernel);
  FN(cuLaunchKernelEx);
  FN(cuLaunchCooperativeKernel);
  FN(cuGraphCreate);
  FN(cuGraphAddKernelNode_v2);
  FN(cuGraphInstantiateWithFlags);
  FN(cuGraphLaunch);
  FN(cuGetProcAddress_v2);
  FN(cuModuleLoadData);
  FN(cuModuleGetFunction);
  FN(cuMemAlloc_v2);
#undef FN
  decltype(&::cuEventDestroy_v2) cuEventDestroy = get<decltype(&::cuEventDestroy_v2)>("cuEventDestroy");
};

// Any function handle but the probe's is a kernel the stand-in "runs".
int g_kernel;
CUfunction kernel() { return reinterpret_cast<CUfunction>(&g_kernel); }

CUresult launch(Driver& d, CUstream s = nullptr) {
  return d.cuLaunchKernel(kernel(), 1, 1, 1, 32, 1, 1, 0, s, nullptr, nullptr);
}
CUresult launch_cooperative(Driver& d, CUstream s = nullptr) {
  return d.cuLaunchCooperativeKernel(kernel(), 1, 1, 1, 32, 1, 1, 0, s, nullptr);
}

void touch(const fs::path& p) { std::ofstream(p).put('x'); }

}  // namespace

TEST(FakeCudaEvents, HandlesErrorsAndLookupWithoutHold) {
  ASSERT_TRUE(fs::is_regular_file(kFakeDriver)) << kFakeDriver << " is missing: build the fakecuda target first";
  TempDir t;
  const fs::path record = t.path / "record";
  const int rc = in_child({{"FAKECUDA_RECORD", record.string()}}, [&] {
    ::unsetenv("FAKECUDA_HOLD");
    Driver d;
    CUevent e = nullptr;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    // Before cuInit.
    CHILD_CHECK(d.cuEventCreate(&e, 0) == CUDA_ERROR_NOT_INITIALIZED);
    CHILD_CHECK(d.cuEventQuery(e) == CUDA_ERROR_NOT_INITIALIZED);
    CHILD_CHECK(d.cuEventRecord(e, nullptr) == CUDA_ERROR_NOT_INITIALIZED);
    CHILD_CHECK(d.cuEventSynchronize(e) == CUDA_ERROR_NOT_INITIALIZED);
    CHILD_CHECK(d.cuEventDestroy_v2(e) == CUDA_ERROR_NOT_INITIALIZED);
    CHILD_CHECK(d.cuStreamIsCapturing(nullptr, &st) == CUDA_ERROR_NOT_INITIALIZED);
    CHILD_CHECK(launch_cooperative(d) == CUDA_ERROR_NOT_INITIALIZED);
    CHILD_CHECK(d.cuInit(0) == CUDA_SUCCESS);

    CHILD_CHECK(d.cuEventCreate(nullptr, 0) == CUDA_ERROR_INVALID_VALUE);
    CHILD_CHECK(d.cuEventCreate(&e, 8) == CUDA_ERROR_INVALID_VALUE);
    CHILD_CHECK(d.cuEventCreate(&e, CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
    CHILD_CHECK(e != nullptr);
    CHILD_CHECK(d.cuEventQuery(e) == CUDA_SUCCESS);  // never recorded: complete
    CHILD_CHECK(d.cuEventSynchronize(e) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventQuery(nullptr) == CUDA_ERROR_INVALID_HANDLE);
    CHILD_CHECK(d.cuEventRecord(nullptr, nullptr) == CUDA_ERROR_INVALID_HANDLE);
    CHILD_CHECK(d.cuEventSynchronize(reinterpret_cast<CUevent>(&g_kernel)) == CUDA_ERROR_INVALID_HANDLE);
    CHILD_CHECK(d.cuStreamIsCapturing(nullptr, nullptr) == CUDA_ERROR_INVALID_VALUE);
    CHILD_CHECK(d.cuStreamIsCapturing(CU_STREAM_PER_THREAD, &st) == CUDA_SUCCESS);
    CHILD_CHECK(st == CU_STREAM_CAPTURE_STATUS_NONE);

    // Without FAKECUDA_HOLD, kernels run synchronously: recorded means complete.
    CHILD_CHECK(launch_cooperative(d) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventRecord(e, nullptr) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventQuery(e) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventSynchronize(e) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuStreamQuery(nullptr) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuStreamSynchronize(nullptr) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuCtxSynchronize() == CUDA_SUCCESS);

    // cuGetProcAddress hands out every new function, _ptsz names included.
    const std::pair<const char*, void*> names[] = {
        {"cuEventCreate", reinterpret_cast<void*>(d.cuEventCreate)},
        {"cuEventDestroy", reinterpret_cast<void*>(d.cuEventDestroy_v2)},
        {"cuEventDestroy_v2", reinterpret_cast<void*>(d.cuEventDestroy_v2)},
        {"cuEventRecord", reinterpret_cast<void*>(d.cuEventRecord)},
        {"cuEventRecord_ptsz", reinterpret_cast<void*>(d.cuEventRecord)},
        {"cuEventQuery", reinterpret_cast<void*>(d.cuEventQuery)},
        {"cuEventSynchronize", reinterpret_cast<void*>(d.cuEventSynchronize)},
        {"cuStreamIsCapturing", reinterpret_cast<void*>(d.cuStreamIsCapturing)},
        {"cuStreamIsCapturing_ptsz", reinterpret_cast<void*>(d.cuStreamIsCapturing)},
        {"cuLaunchCooperativeKernel", reinterpret_cast<void*>(d.cuLaunchCooperativeKernel)},
        {"cuLaunchCooperativeKernel_ptsz", reinterpret_cast<void*>(d.cuLaunchCooperativeKernel)},
    };
    for (const auto& [name, want] : names) {
      void* fn = nullptr;
      CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
      if (d.cuGetProcAddress_v2(name, &fn, 12080, 0, &q) != CUDA_SUCCESS || fn != want ||
          q != CU_GET_PROC_ADDRESS_SUCCESS) {
        std::fprintf(stderr, "cuGetProcAddress_v2(%s) does not give the stand-in's function\n", name);
        std::_Exit(1);
      }
    }

    CHILD_CHECK(d.cuEventDestroy_v2(e) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventDestroy_v2(e) == CUDA_ERROR_INVALID_HANDLE);
    CHILD_CHECK(d.cuEventQuery(e) == CUDA_ERROR_INVALID_HANDLE);
    CHILD_CHECK(d.cuEventRecord(e, nullptr) == CUDA_ERROR_INVALID_HANDLE);
    CHILD_CHECK(d.cuEventCreate(&e, CU_EVENT_DEFAULT) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventDestroy(e) == CUDA_SUCCESS);  // the legacy name
    CHILD_CHECK(d.cuEventDestroy(e) == CUDA_ERROR_INVALID_HANDLE);
  });
  EXPECT_EQ(rc, 0);
  // The cooperative launch was recorded as a launch.
  std::ifstream f(record);
  std::string line;
  int launches = 0;
  while (std::getline(f, line)) launches += line.ends_with(" launch");
  EXPECT_EQ(launches, 1);
}

TEST(FakeCudaEvents, HeldWorkKeepsEventsAndSynchronisationWaitingUntilTheFileGoes) {
  ASSERT_TRUE(fs::is_regular_file(kFakeDriver)) << kFakeDriver << " is missing: build the fakecuda target first";
  TempDir t;
  const fs::path hold = t.path / "hold";
  const int rc = in_child({{"FAKECUDA_HOLD", hold.string()}}, [&] {
    Driver d;
    CHILD_CHECK(d.cuInit(0) == CUDA_SUCCESS);
    CUevent before = nullptr, e1 = nullptr, e2 = nullptr;
    CHILD_CHECK(d.cuEventCreate(&before, 0) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventCreate(&e1, 0) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventCreate(&e2, 0) == CUDA_SUCCESS);
    CUstream s = nullptr;
    CHILD_CHECK(d.cuStreamCreate(&s, 0) == CUDA_SUCCESS);

    // No file: nothing is held.
    CHILD_CHECK(launch(d) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventRecord(e1, nullptr) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventQuery(e1) == CUDA_SUCCESS);

    // The file alone holds nothing: only kernels launched while it exists.
    touch(hold);
    CHILD_CHECK(d.cuEventRecord(before, nullptr) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventQuery(before) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuStreamQuery(nullptr) == CUDA_SUCCESS);

    CHILD_CHECK(launch(d) == CUDA_SUCCESS);
    // Per process: an event on another stream waits too.
    CHILD_CHECK(d.cuEventRecord(e1, nullptr) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventRecord(e2, s) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventQuery(e1) == CUDA_ERROR_NOT_READY);
    CHILD_CHECK(d.cuEventQuery(e2) == CUDA_ERROR_NOT_READY);
    CHILD_CHECK(d.cuEventQuery(before) == CUDA_SUCCESS);  // recorded before the launch
    CHILD_CHECK(d.cuStreamQuery(s) == CUDA_ERROR_NOT_READY);
    // Re-recording replaces what an event waits for.
    CHILD_CHECK(d.cuEventRecord(before, s) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventQuery(before) == CUDA_ERROR_NOT_READY);

    // Waiters, on other threads, wait until the file is removed.
    std::atomic<int> done{0};
    std::atomic<bool> all_ok{true};
    auto waiter = [&](const std::function<CUresult()>& wait) {
      return std::thread([&, wait] {
        if (wait() != CUDA_SUCCESS) all_ok = false;
        ++done;
      });
    };
    std::thread w[] = {
        waiter([&] { return d.cuEventSynchronize(e1); }),
        waiter([&] { return d.cuEventSynchronize(e2); }),
        waiter([&] { return d.cuStreamSynchronize(s); }),
        waiter([&] { return d.cuCtxSynchronize(); }),
    };
    // Not a timing test: while the file exists none may return, however long.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHILD_CHECK(done == 0);
    CHILD_CHECK(d.cuEventQuery(e1) == CUDA_ERROR_NOT_READY);
    fs::remove(hold);
    for (auto& th : w) th.join();
    CHILD_CHECK(done == 4);
    CHILD_CHECK(all_ok);
    CHILD_CHECK(d.cuEventQuery(e1) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventQuery(e2) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventQuery(before) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuStreamQuery(s) == CUDA_SUCCESS);

    // Once seen gone, the earlier work stays finished when the file returns.
    touch(hold);
    CHILD_CHECK(d.cuEventRecord(e1, nullptr) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventQuery(e1) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventQuery(e2) == CUDA_SUCCESS);

    // Every kind of launch holds: cuLaunchKernelEx, cooperative, a graph.
    CUlaunchConfig cfg{};
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    CHILD_CHECK(d.cuLaunchKernelEx(&cfg, kernel(), nullptr, nullptr) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventRecord(e1, nullptr) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventQuery(e1) == CUDA_ERROR_NOT_READY);
    fs::remove(hold);
    CHILD_CHECK(d.cuEventSynchronize(e1) == CUDA_SUCCESS);

    touch(hold);
    CHILD_CHECK(launch_cooperative(d, s) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventRecord(e1, s) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventQuery(e1) == CUDA_ERROR_NOT_READY);
    fs::remove(hold);
    CHILD_CHECK(d.cuEventQuery(e1) == CUDA_SUCCESS);

    CUgraph g = nullptr;
    CUgraphNode n = nullptr;
    CUgraphExec x = nullptr;
    CUDA_KERNEL_NODE_PARAMS p{};
    p.func = kernel();
    p.gridDimX = p.gridDimY = p.gridDimZ = 1;
    p.blockDimX = p.blockDimY = p.blockDimZ = 1;
    CHILD_CHECK(d.cuGraphCreate(&g, 0) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuGraphAddKernelNode_v2(&n, g, nullptr, 0, &p) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuGraphInstantiateWithFlags(&x, g, 0) == CUDA_SUCCESS);
    touch(hold);
    CHILD_CHECK(d.cuGraphLaunch(x, s) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventRecord(e2, nullptr) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventQuery(e2) == CUDA_ERROR_NOT_READY);
    fs::remove(hold);
    CHILD_CHECK(d.cuStreamSynchronize(nullptr) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventQuery(e2) == CUDA_SUCCESS);
  });
  EXPECT_EQ(rc, 0);
}

// Without FAKECUDA_HOLD, an event recorded behind a probe kernel that can never
// run (every TPC disabled) never completes, and recording it again on a free
// stream replaces what it waited for.
TEST(FakeCudaEvents, EventsBehindAKernelThatNeverRunsStayIncomplete) {
  ASSERT_TRUE(fs::is_regular_file(kFakeDriver)) << kFakeDriver << " is missing: build the fakecuda target first";
  const std::vector<std::pair<std::string, std::string>> env = {
      {"FAKECUDA_INITIAL_MASK", "0xff"}, {"FAKECUDA_SM_COUNT", "16"}, {"FAKECUDA_CC", "8.6"}};
  const int rc = in_child(env, [&] {
    ::unsetenv("FAKECUDA_HOLD");
    ::unsetenv("FAKECUDA_TPC_BITS");
    Driver d;
    CHILD_CHECK(d.cuInit(0) == CUDA_SUCCESS);
    static const char kPtx[] = ".entry nvtaskset_record_block_smid(.param .u64 out) { ret; }";
    CUmodule m = nullptr;
    CUfunction probe = nullptr;
    CHILD_CHECK(d.cuModuleLoadData(&m, kPtx) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuModuleGetFunction(&probe, m, "nvtaskset_record_block_smid") == CUDA_SUCCESS);
    CUdeviceptr out = 0;
    CHILD_CHECK(d.cuMemAlloc_v2(&out, 64) == CUDA_SUCCESS);
    void* params[] = {&out};
    CUstream stuck = nullptr, free_stream = nullptr;
    CHILD_CHECK(d.cuStreamCreate(&stuck, 0) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuStreamCreate(&free_stream, 0) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuLaunchCooperativeKernel(probe, 1, 1, 1, 32, 1, 1, 0, stuck, params) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuStreamQuery(stuck) == CUDA_ERROR_NOT_READY);
    CUevent e = nullptr;
    CHILD_CHECK(d.cuEventCreate(&e, 0) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventRecord(e, stuck) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventQuery(e) == CUDA_ERROR_NOT_READY);
    CHILD_CHECK(d.cuEventRecord(e, free_stream) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventQuery(e) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventSynchronize(e) == CUDA_SUCCESS);
  });
  EXPECT_EQ(rc, 0);
}

// Stream capture in CUDA's global mode (fakecuda.cpp): the capturing
// thread's own event calls leave it whole; another thread's event call
// breaks it, and its end says so (as PyTorch's capture broke on the GPU
// while the latency-critical controller thread queried events, run 60).
TEST(FakeCudaEvents, AStreamCaptureIsBrokenByAnotherThreadsEventCall) {
  ASSERT_TRUE(fs::is_regular_file(kFakeDriver)) << kFakeDriver << " is missing: build the fakecuda target first";
  const int rc = in_child({}, [&] {
    ::unsetenv("FAKECUDA_HOLD");
    Driver d;
    using BeginFn = CUresult (*)(CUstream, int);
    using EndFn = CUresult (*)(CUstream, CUgraph*);
    const auto begin = d.get<BeginFn>("cuStreamBeginCapture_v2");
    const auto end = d.get<EndFn>("cuStreamEndCapture");
    CHILD_CHECK(d.cuInit(0) == CUDA_SUCCESS);
    CUstream s = nullptr, other = nullptr;
    CHILD_CHECK(d.cuStreamCreate(&s, 0) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuStreamCreate(&other, 0) == CUDA_SUCCESS);
    CUevent e = nullptr;
    CHILD_CHECK(d.cuEventCreate(&e, 0) == CUDA_SUCCESS);
    CUgraph g = nullptr;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    // Whole: only the capturing thread calls.
    CHILD_CHECK(begin(s, 0) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuStreamIsCapturing(s, &st) == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CHILD_CHECK(d.cuStreamIsCapturing(other, &st) == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_NONE);
    CHILD_CHECK(d.cuEventRecord(e, other) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuEventQuery(e) == CUDA_SUCCESS);
    CHILD_CHECK(begin(other, 0) == CUDA_ERROR_ILLEGAL_STATE);  // one at a time
    CHILD_CHECK(end(other, &g) == CUDA_ERROR_ILLEGAL_STATE);   // not the capturing stream
    CHILD_CHECK(end(s, &g) == CUDA_SUCCESS);
    CHILD_CHECK(d.cuStreamIsCapturing(s, &st) == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_NONE);
    CHILD_CHECK(end(s, &g) == CUDA_ERROR_ILLEGAL_STATE);  // none under way
    // Broken: another thread queries an event meanwhile.
    CHILD_CHECK(begin(s, 0) == CUDA_SUCCESS);
    std::thread([&] { (void)d.cuEventQuery(e); }).join();
    CHILD_CHECK(end(s, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    // The next one starts whole; another thread's calls after it ended break nothing.
    CHILD_CHECK(begin(s, 0) == CUDA_SUCCESS);
    CHILD_CHECK(end(s, &g) == CUDA_SUCCESS);
    std::thread([&] { (void)d.cuEventQuery(e); }).join();
    CHILD_CHECK(begin(s, 0) == CUDA_SUCCESS);
    CHILD_CHECK(end(s, &g) == CUDA_SUCCESS);
  });
  EXPECT_EQ(rc, 0);
}
