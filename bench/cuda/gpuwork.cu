// SPDX-License-Identifier: Apache-2.0
// The workloads of the enforcement and granularity experiments (paper Figs.
// 12 and 13), driven by bench/eval.py. Ordinary CUDA programs: they know
// nothing of nvtaskset, MPS or partitions, except the `green` mode, which
// partitions the GPU itself with green contexts.
//
//   gpuwork sgemm --serve [--n N]
//       The measured task: an FP32 SGEMM (C = A B, N x N, 128x128 tiles, own
//       kernel, as in the paper). Checks 16 entries against the host, prints
//       "ready", then reads commands on stdin:
//         run LABEL S   S samples, one SGEMM each; per sample it prints
//                       "s LABEL i t0 t1 g0 g1": CLOCK_MONOTONIC before the
//                       launch and after the synchronize returned (the
//                       iteration time is t1 - t0), and the %globaltimer of
//                       the first block's start and the last block's end;
//                       then "done LABEL median_ms M"
//         calib TAG     measure the clock offset again (common.cuh)
//         quit          (or end of input) exit
//   gpuwork interfere --kind mem|compute|short --stamps FILE --stop-file F [--max-s S]
//       An interferer: kernels back to back (at most 8 in flight) until F
//       exists, SIGTERM, or S seconds (default 120). mem: a streaming copy
//       over 2 x 64 MiB; compute: an FMA loop (~150 us on a whole H100);
//       short: tiny kernels (a few us, as many as the host can launch). The
//       last block of each kernel writes its %globaltimer to a ring, which is
//       written to FILE (little-endian u64, one per kernel, in launch order):
//       eval.py counts the interferer's progress during each measured sample
//       from it. Prints "ready" once 32 kernels finished, then at the end
//       "interferer kind K launched N recorded R" and two calib lines.
//   gpuwork green [--n N] [--samples S] [--kinds mem,compute,short] --stamps-prefix P
//       Green contexts (driver API, CUDA 12.4+): splits the SMs into two
//       groups of half the GPU (rounded to the split granularity), runs the
//       SGEMM in one (alone, then next to each interferer kind in the other,
//       then alone again), in one process and two threads. Same output lines
//       as sgemm (labels alone, corun-KIND, alone-end) and interfere (stamps
//       in P-KIND.u64).
//   gpuwork green-query
//       The SM counts green contexts offer: for every minimum count 1..SMs,
//       the size of the group cuDevSmResourceSplitByCount makes, with and
//       without CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING.
//   gpuwork mps-affinity [--max-s S]
//       Run as an MPS client: the SM counts MPS grants a context created with
//       an execution-affinity SM count of 1..SMs (what
//       CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and cuCtxCreate's affinity resolve
//       to; the driver rounds up "to the next hardware-supported amount").
#include <cuda.h>
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common.cuh"

namespace {

using evalgpu::globaltimer;
using evalgpu::mono_ns;

// ---------------------------------------------------------------------------
// The measured task: FP32 SGEMM, 128x128 block tiles, 8x8 per thread.

constexpr int kBM = 128, kBN = 128, kBK = 8, kTM = 8, kTN = 8, kThreads = 256;

__global__ void __launch_bounds__(kThreads) sgemm_kernel(int n, const float* __restrict__ A, const float* __restrict__ B,
                                                         float* __restrict__ C, unsigned long long* span) {
  if (span && threadIdx.x == 0) atomicMin(&span[0], globaltimer());
  __shared__ float As[kBK * kBM];  // transposed: As[k][m]
  __shared__ float Bs[kBK * kBN];
  const int tx = threadIdx.x % (kBN / kTN), ty = threadIdx.x / (kBN / kTN);
  const float* a = A + static_cast<size_t>(blockIdx.y) * kBM * n;
  const float* b = B + static_cast<size_t>(blockIdx.x) * kBN;
  const int a_row = threadIdx.x / (kBK / 4), a_col = threadIdx.x % (kBK / 4);
  const int b_row = threadIdx.x / (kBN / 4), b_col = threadIdx.x % (kBN / 4);
  float acc[kTM][kTN] = {};
  float rm[kTM], rn[kTN];
  for (int k0 = 0; k0 < n; k0 += kBK) {
    const float4 av = *reinterpret_cast<const float4*>(a + static_cast<size_t>(a_row) * n + k0 + a_col * 4);
    As[(a_col * 4 + 0) * kBM + a_row] = av.x;
    As[(a_col * 4 + 1) * kBM + a_row] = av.y;
    As[(a_col * 4 + 2) * kBM + a_row] = av.z;
    As[(a_col * 4 + 3) * kBM + a_row] = av.w;
    *reinterpret_cast<float4*>(&Bs[b_row * kBN + b_col * 4]) =
        *reinterpret_cast<const float4*>(b + static_cast<size_t>(k0 + b_row) * n + b_col * 4);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kBK; ++k) {
#pragma unroll
      for (int i = 0; i < kTM; ++i) rm[i] = As[k * kBM + ty * kTM + i];
#pragma unroll
      for (int j = 0; j < kTN; ++j) rn[j] = Bs[k * kBN + tx * kTN + j];
#pragma unroll
      for (int i = 0; i < kTM; ++i)
#pragma unroll
        for (int j = 0; j < kTN; ++j) acc[i][j] = fmaf(rm[i], rn[j], acc[i][j]);
    }
    __syncthreads();
  }
  float* c = C + static_cast<size_t>(blockIdx.y * kBM + ty * kTM) * n + blockIdx.x * kBN + tx * kTN;
#pragma unroll
  for (int i = 0; i < kTM; ++i)
#pragma unroll
    for (int j = 0; j < kTN; j += 4)
      *reinterpret_cast<float4*>(&c[static_cast<size_t>(i) * n + j]) =
          make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);
  if (span) {
    __syncthreads();
    if (threadIdx.x == 0) atomicMax(&span[1], globaltimer());
  }
}

struct Sample {
  std::uint64_t t0, t1;
  unsigned long long g0, g1;
};

class Sgemm {
 public:
  // Allocates in the current context; launches on `s`.
  void setup(int n, cudaStream_t s) {
    n_ = n;
    s_ = s;
    const size_t elems = static_cast<size_t>(n) * n;
    hA_.resize(elems);
    hB_.resize(elems);
    unsigned long long x = 88172645463325252ull;
    auto rnd = [&x] {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      return static_cast<float>(static_cast<double>(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    };
    for (auto& v : hA_) v = rnd();
    for (auto& v : hB_) v = rnd();
    EVAL_CHECK(cudaMalloc(&A_, elems * sizeof(float)));
    EVAL_CHECK(cudaMalloc(&B_, elems * sizeof(float)));
    EVAL_CHECK(cudaMalloc(&C_, elems * sizeof(float)));
    EVAL_CHECK(cudaMalloc(&span_, 2 * sizeof(unsigned long long)));
    EVAL_CHECK(cudaMemcpyAsync(A_, hA_.data(), elems * sizeof(float), cudaMemcpyHostToDevice, s_));
    EVAL_CHECK(cudaMemcpyAsync(B_, hB_.data(), elems * sizeof(float), cudaMemcpyHostToDevice, s_));
    EVAL_CHECK(cudaStreamSynchronize(s_));
  }

  Sample sample() {
    const unsigned long long init[2] = {~0ull, 0ull};
    EVAL_CHECK(cudaMemcpyAsync(span_, init, sizeof init, cudaMemcpyHostToDevice, s_));
    EVAL_CHECK(cudaStreamSynchronize(s_));
    Sample r{};
    const dim3 grid(n_ / kBN, n_ / kBM);
    r.t0 = mono_ns();
    sgemm_kernel<<<grid, kThreads, 0, s_>>>(n_, A_, B_, C_, span_);
    EVAL_CHECK(cudaStreamSynchronize(s_));
    r.t1 = mono_ns();
    unsigned long long g[2];
    EVAL_CHECK(cudaMemcpyAsync(g, span_, sizeof g, cudaMemcpyDeviceToHost, s_));
    EVAL_CHECK(cudaStreamSynchronize(s_));
    r.g0 = g[0];
    r.g1 = g[1];
    return r;
  }

  // Largest error of 16 entries against the host, relative to the sum of
  // the magnitudes of their products.
  double check() {
    std::vector<float> c(static_cast<size_t>(n_) * n_);
    EVAL_CHECK(cudaMemcpyAsync(c.data(), C_, c.size() * sizeof(float), cudaMemcpyDeviceToHost, s_));
    EVAL_CHECK(cudaStreamSynchronize(s_));
    double worst = 0;
    for (int t = 0; t < 16; ++t) {
      const int i = (t * 7919 + 13) % n_, j = (t * 104729 + 101) % n_;
      double sum = 0, mag = 0;
      for (int k = 0; k < n_; ++k) {
        const double p = static_cast<double>(hA_[static_cast<size_t>(i) * n_ + k]) * hB_[static_cast<size_t>(k) * n_ + j];
        sum += p;
        mag += std::fabs(p);
      }
      worst = std::max(worst, std::fabs(sum - c[static_cast<size_t>(i) * n_ + j]) / (mag + 1e-30));
    }
    return worst;
  }

  double gflop() const { return 2.0 * n_ * static_cast<double>(n_) * n_ / 1e9; }

 private:
  int n_ = 0;
  cudaStream_t s_ = nullptr;
  std::vector<float> hA_, hB_;
  float *A_ = nullptr, *B_ = nullptr, *C_ = nullptr;
  unsigned long long* span_ = nullptr;
};

double median_ms(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void run_samples(Sgemm& g, const std::string& label, int count) {
  std::vector<double> ms;
  for (int i = 0; i < count; ++i) {
    const Sample s = g.sample();
    std::printf("s %s %d %llu %llu %llu %llu\n", label.c_str(), i, static_cast<unsigned long long>(s.t0),
                static_cast<unsigned long long>(s.t1), s.g0, s.g1);
    ms.push_back(static_cast<double>(s.t1 - s.t0) / 1e6);
  }
  std::printf("done %s median_ms %.4f\n", label.c_str(), median_ms(ms));
  std::fflush(stdout);
}

// ---------------------------------------------------------------------------
// Interferers. The last block of each kernel stamps the kernel's end.

constexpr unsigned kDoneSlots = 4096;  // far more than the kernels in flight
__device__ unsigned g_done[kDoneSlots];

__device__ __forceinline__ void stamp_done(unsigned long long seq, unsigned long long* ring, unsigned long long cap) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned slot = static_cast<unsigned>(seq % kDoneSlots);
    if (atomicAdd(&g_done[slot], 1u) == gridDim.x * gridDim.y - 1) {
      if (seq < cap) ring[seq] = globaltimer();
      g_done[slot] = 0;
    }
  }
}

__global__ void mem_kernel(const float4* __restrict__ in, float4* __restrict__ out, size_t n4,
                           unsigned long long seq, unsigned long long* ring, unsigned long long cap) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float4 v = in[i];
    v.x = v.x * 0.999f + 1.f;
    v.y = v.y * 0.999f + 1.f;
    v.z = v.z * 0.999f + 1.f;
    v.w = v.w * 0.999f + 1.f;
    out[i] = v;
  }
  stamp_done(seq, ring, cap);
}

__global__ void compute_kernel(float* out, int iters, unsigned long long seq, unsigned long long* ring,
                               unsigned long long cap) {
  float a = threadIdx.x * 1e-3f, b = a + 1.f, c = a + 2.f, d = a + 3.f;
  for (int i = 0; i < iters; ++i) {
    a = fmaf(a, 0.9999f, 0.5f);
    b = fmaf(b, 0.9999f, 0.5f);
    c = fmaf(c, 0.9999f, 0.5f);
    d = fmaf(d, 0.9999f, 0.5f);
  }
  if (a + b + c + d == 12345.f) out[0] = a;  // keeps the loop
  stamp_done(seq, ring, cap);
}

enum class Kind { kMem, kCompute, kShort };

bool parse_kind(const std::string& s, Kind* k) {
  if (s == "mem") *k = Kind::kMem;
  else if (s == "compute") *k = Kind::kCompute;
  else if (s == "short") *k = Kind::kShort;
  else return false;
  return true;
}

class Interferer {
 public:
  static constexpr unsigned long long kCap = 4u << 20;  // kernels recorded (32 MiB of stamps)

  void setup(Kind kind, cudaStream_t s) {
    kind_ = kind;
    s_ = s;
    int dev = 0;
    EVAL_CHECK(cudaGetDevice(&dev));
    EVAL_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, dev));
    if (kind_ == Kind::kMem) {
      n4_ = (64ull << 20) / sizeof(float4);
      EVAL_CHECK(cudaMalloc(&in_, n4_ * sizeof(float4)));
      EVAL_CHECK(cudaMalloc(&out_, n4_ * sizeof(float4)));
      EVAL_CHECK(cudaMemsetAsync(in_, 0, n4_ * sizeof(float4), s_));
    } else {
      EVAL_CHECK(cudaMalloc(&out_, sizeof(float4)));
    }
    EVAL_CHECK(cudaMalloc(&ring_, kCap * sizeof(unsigned long long)));
    for (auto& e : ev_) EVAL_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    EVAL_CHECK(cudaStreamSynchronize(s_));
  }

  // Launches until stop() says so; calls ready() once 32 kernels finished.
  void run(const std::function<bool()>& stop, const std::function<void()>& ready) {
    std::uint64_t last_check = mono_ns();
    bool said_ready = false;
    for (;;) {
      if (launched_ >= kDepth) EVAL_CHECK(cudaEventSynchronize(ev_[launched_ % kDepth]));
      launch_one();
      EVAL_CHECK(cudaEventRecord(ev_[launched_ % kDepth], s_));
      ++launched_;
      if (!said_ready && launched_ == 32) {
        EVAL_CHECK(cudaStreamSynchronize(s_));
        said_ready = true;
        ready();
      }
      const std::uint64_t now = mono_ns();
      if (now - last_check > 2000000ull) {  // every 2 ms
        last_check = now;
        if (stop()) break;
      }
    }
    EVAL_CHECK(cudaStreamSynchronize(s_));
    EVAL_CHECK(cudaGetLastError());
  }

  std::vector<unsigned long long> stamps() {
    std::vector<unsigned long long> v(std::min<unsigned long long>(launched_, kCap));
    EVAL_CHECK(cudaMemcpy(v.data(), ring_, v.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    return v;
  }

  unsigned long long launched() const { return launched_; }

  void teardown() {
    for (auto& e : ev_) cudaEventDestroy(e);
    cudaFree(in_);
    cudaFree(out_);
    cudaFree(ring_);
  }

 private:
  static constexpr unsigned long long kDepth = 8;

  void launch_one() {
    switch (kind_) {
      case Kind::kMem:
        mem_kernel<<<sms_ * 4, 256, 0, s_>>>(reinterpret_cast<const float4*>(in_), reinterpret_cast<float4*>(out_),
                                             n4_, launched_, ring_, kCap);
        break;
      case Kind::kCompute:
        compute_kernel<<<sms_ * 8, 256, 0, s_>>>(reinterpret_cast<float*>(out_), 4096, launched_, ring_, kCap);
        break;
      case Kind::kShort:
        compute_kernel<<<sms_, 128, 0, s_>>>(reinterpret_cast<float*>(out_), 16, launched_, ring_, kCap);
        break;
    }
  }

  Kind kind_ = Kind::kCompute;
  cudaStream_t s_ = nullptr;
  int sms_ = 0;
  size_t n4_ = 0;
  void* in_ = nullptr;
  void* out_ = nullptr;
  unsigned long long* ring_ = nullptr;
  unsigned long long launched_ = 0;
  cudaEvent_t ev_[kDepth] = {};
};

bool write_stamps(const std::string& path, const std::vector<unsigned long long>& v) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  const bool ok = std::fwrite(v.data(), sizeof(unsigned long long), v.size(), f) == v.size();
  return std::fclose(f) == 0 && ok;
}

volatile sig_atomic_t g_signalled = 0;
void on_signal(int) { g_signalled = 1; }

bool file_exists(const std::string& p) {
  struct stat st;
  return !p.empty() && stat(p.c_str(), &st) == 0;
}

// ---------------------------------------------------------------------------
// Modes.

int mode_sgemm(int n) {
  cudaStream_t s;
  EVAL_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Sgemm g;
  g.setup(n, s);
  for (int i = 0; i < 3; ++i) g.sample();
  const double err = g.check();
  int dev = 0, sms = 0;
  EVAL_CHECK(cudaGetDevice(&dev));
  EVAL_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  std::printf("sgemm n %d gflop %.3f visible_sms %d check_max_rel_err %.3g\n", n, g.gflop(), sms, err);
  if (!(err < 1e-4)) {
    std::fprintf(stderr, "gpuwork: SGEMM result wrong (relative error %.3g)\n", err);
    return 4;
  }
  evalgpu::print_offset("begin", evalgpu::calibrate_offset());
  std::printf("ready\n");
  std::fflush(stdout);
  char line[512];
  while (std::fgets(line, sizeof line, stdin)) {
    char label[256];
    int count = 0;
    if (std::sscanf(line, "run %255s %d", label, &count) == 2 && count > 0) {
      run_samples(g, label, count);
    } else if (std::sscanf(line, "calib %255s", label) == 1) {
      evalgpu::print_offset(label, evalgpu::calibrate_offset());
      std::fflush(stdout);
    } else if (std::strncmp(line, "quit", 4) == 0) {
      break;
    } else {
      std::fprintf(stderr, "gpuwork: unknown command: %s", line);
    }
  }
  return 0;
}

int mode_interfere(Kind kind, const std::string& stamps_path, const std::string& stop_file, double max_s) {
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  cudaStream_t s;
  EVAL_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Interferer it;
  it.setup(kind, s);
  const evalgpu::Offset o0 = evalgpu::calibrate_offset();
  const std::uint64_t deadline = mono_ns() + static_cast<std::uint64_t>(max_s * 1e9);
  it.run([&] { return g_signalled || file_exists(stop_file) || mono_ns() > deadline; },
         [] {
           std::printf("ready\n");
           std::fflush(stdout);
         });
  const evalgpu::Offset o1 = evalgpu::calibrate_offset();
  const auto v = it.stamps();
  if (!write_stamps(stamps_path, v)) {
    std::fprintf(stderr, "gpuwork: cannot write %s\n", stamps_path.c_str());
    return 2;
  }
  evalgpu::print_offset("begin", o0);
  evalgpu::print_offset("end", o1);
  std::printf("interferer kind %s launched %llu recorded %zu\n",
              kind == Kind::kMem ? "mem" : kind == Kind::kCompute ? "compute" : "short", it.launched(), v.size());
  std::fflush(stdout);
  it.teardown();
  return 0;
}

// Green contexts: the SGEMM in one group, an interferer in the other.
int mode_green(int n, int samples, const std::vector<std::string>& kinds, const std::string& prefix) {
  EVAL_CHECK(cudaFree(nullptr));  // the primary context, which the green contexts build on
  CUdevice dev;
  DRV_CHECK(cuDeviceGet(&dev, 0));
  CUdevResource all{};
  DRV_CHECK(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
  const unsigned align = std::max(1u, all.sm.smCoscheduledAlignment);
  const unsigned half = std::max(all.sm.minSmPartitionSize, all.sm.smCount / 2 / align * align);
  CUdevResource groups[2]{}, rest{};
  unsigned nb = 2;
  DRV_CHECK(cuDevSmResourceSplitByCount(groups, &nb, &all, &rest, 0, half));
  if (nb < 2) {
    std::fprintf(stderr, "gpuwork: green contexts: only %u group of %u SMs fits\n", nb, half);
    return 5;
  }
  // The interferer gets the second group and what the split left over, as
  // nvtaskset's interferer gets every TPC the measured task does not have.
  CUdevResource b_res[2] = {groups[1], rest};
  CUdevResourceDesc da, db;
  DRV_CHECK(cuDevResourceGenerateDesc(&da, &groups[0], 1));
  DRV_CHECK(cuDevResourceGenerateDesc(&db, b_res, rest.sm.smCount > 0 ? 2 : 1));
  CUgreenCtx ga, gb;
  DRV_CHECK(cuGreenCtxCreate(&ga, da, dev, CU_GREEN_CTX_DEFAULT_STREAM));
  DRV_CHECK(cuGreenCtxCreate(&gb, db, dev, CU_GREEN_CTX_DEFAULT_STREAM));
  CUcontext ca, cb;
  DRV_CHECK(cuCtxFromGreenCtx(&ca, ga));
  DRV_CHECK(cuCtxFromGreenCtx(&cb, gb));
  CUstream sa, sb;
  DRV_CHECK(cuGreenCtxStreamCreate(&sa, ga, CU_STREAM_NON_BLOCKING, 0));
  DRV_CHECK(cuGreenCtxStreamCreate(&sb, gb, CU_STREAM_NON_BLOCKING, 0));
  std::printf("green device_sms %u min_partition %u alignment %u measured_sms %u interferer_sms %u\n", all.sm.smCount,
              all.sm.minSmPartitionSize, all.sm.smCoscheduledAlignment, groups[0].sm.smCount,
              groups[1].sm.smCount + rest.sm.smCount);
  DRV_CHECK(cuCtxSetCurrent(ca));
  Sgemm g;
  g.setup(n, reinterpret_cast<cudaStream_t>(sa));
  for (int i = 0; i < 3; ++i) g.sample();
  const double err = g.check();
  std::printf("sgemm n %d gflop %.3f check_max_rel_err %.3g\n", n, g.gflop(), err);
  if (!(err < 1e-4)) {
    std::fprintf(stderr, "gpuwork: SGEMM result wrong (relative error %.3g)\n", err);
    return 4;
  }
  evalgpu::print_offset("begin", evalgpu::calibrate_offset());
  run_samples(g, "alone", samples);
  for (const std::string& k : kinds) {
    Kind kind;
    if (!parse_kind(k, &kind)) {
      std::fprintf(stderr, "gpuwork: unknown interferer kind %s\n", k.c_str());
      return 2;
    }
    std::atomic<bool> stop{false}, ready{false};
    Interferer it;
    std::vector<unsigned long long> stamps;
    unsigned long long launched = 0;
    std::thread t([&] {
      cuCtxSetCurrent(cb);
      it.setup(kind, reinterpret_cast<cudaStream_t>(sb));
      it.run([&] { return stop.load(); }, [&] { ready.store(true); });
      stamps = it.stamps();
      launched = it.launched();
      it.teardown();
    });
    const std::uint64_t wait_until = mono_ns() + 60000000000ull;
    while (!ready.load() && mono_ns() < wait_until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!ready.load()) {
      std::fprintf(stderr, "gpuwork: the %s interferer did not start\n", k.c_str());
      stop.store(true);
      t.join();
      return 6;
    }
    run_samples(g, "corun-" + k, samples);
    stop.store(true);
    t.join();
    const std::string path = prefix + "-" + k + ".u64";
    if (!write_stamps(path, stamps)) {
      std::fprintf(stderr, "gpuwork: cannot write %s\n", path.c_str());
      return 2;
    }
    std::printf("interferer label corun-%s kind %s launched %llu recorded %zu\n", k.c_str(), k.c_str(), launched,
                stamps.size());
    std::fflush(stdout);
  }
  run_samples(g, "alone-end", samples);
  evalgpu::print_offset("end", evalgpu::calibrate_offset());
  std::fflush(stdout);
  return 0;
}

std::string join(const std::set<unsigned>& s) {
  std::string out;
  for (unsigned v : s) out += (out.empty() ? "" : ",") + std::to_string(v);
  return out;
}

int mode_green_query() {
  DRV_CHECK(cuInit(0));
  CUdevice dev;
  DRV_CHECK(cuDeviceGet(&dev, 0));
  CUdevResource all{};
  DRV_CHECK(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
  std::printf("green device_sms %u min_partition %u alignment %u\n", all.sm.smCount, all.sm.minSmPartitionSize,
              all.sm.smCoscheduledAlignment);
  const unsigned flag_sets[2] = {0u, CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING};
  for (unsigned flags : flag_sets) {
    std::set<unsigned> sizes;
    for (unsigned want = 1; want <= all.sm.smCount; ++want) {
      CUdevResource g{};
      unsigned nb = 1;
      if (cuDevSmResourceSplitByCount(&g, &nb, &all, nullptr, flags, want) == CUDA_SUCCESS && nb == 1)
        sizes.insert(g.sm.smCount);
    }
    std::printf("green_sizes flags %u count %zu sizes %s\n", flags, sizes.size(), join(sizes).c_str());
  }
  return 0;
}

int mode_mps_affinity(double max_s) {
  DRV_CHECK(cuInit(0));
  CUdevice dev;
  DRV_CHECK(cuDeviceGet(&dev, 0));
  int supported = 0, sms = 0;
  DRV_CHECK(cuDeviceGetExecAffinitySupport(&supported, CU_EXEC_AFFINITY_TYPE_SM_COUNT, dev));
  DRV_CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
  std::printf("mps_affinity supported %d device_sms %d\n", supported, sms);
  if (!supported) return 0;  // not an MPS client: nothing to list
  const std::uint64_t deadline = mono_ns() + static_cast<std::uint64_t>(max_s * 1e9);
  std::set<unsigned> sizes;
  std::string map;
  int asked = 0;
  for (int want = 1; want <= sms && mono_ns() < deadline; ++want, ++asked) {
    CUexecAffinityParam p{};
    p.type = CU_EXEC_AFFINITY_TYPE_SM_COUNT;
    p.param.smCount.val = static_cast<unsigned>(want);
    CUctxCreateParams cp{};
    cp.execAffinityParams = &p;
    cp.numExecAffinityParams = 1;
    CUcontext c = nullptr;
    if (cuCtxCreate(&c, &cp, 0, dev) != CUDA_SUCCESS) continue;
    CUexecAffinityParam got{};
    if (cuCtxGetExecAffinity(&got, CU_EXEC_AFFINITY_TYPE_SM_COUNT) == CUDA_SUCCESS) {
      sizes.insert(got.param.smCount.val);
      map += (map.empty() ? "" : ",") + std::to_string(want) + ":" + std::to_string(got.param.smCount.val);
    }
    cuCtxDestroy(c);
  }
  std::printf("mps_affinity asked %d of %d count %zu sizes %s\n", asked, sms, sizes.size(), join(sizes).c_str());
  std::printf("mps_affinity_map %s\n", map.c_str());
  return 0;
}

int usage() {
  std::fprintf(stderr,
               "usage: gpuwork sgemm --serve [--n N]\n"
               "       gpuwork interfere --kind mem|compute|short --stamps FILE --stop-file F [--max-s S]\n"
               "       gpuwork green [--n N] [--samples S] [--kinds LIST] --stamps-prefix P\n"
               "       gpuwork green-query\n"
               "       gpuwork mps-affinity [--max-s S]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string mode = argv[1];
  int n = 2048, samples = 100;
  double max_s = 120;
  std::string kind_s, stamps, stop_file, prefix, kinds_s = "mem,compute,short";
  bool serve = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--serve") serve = true;
    else if (a == "--n" && v) n = std::atoi(v), ++i;
    else if (a == "--samples" && v) samples = std::atoi(v), ++i;
    else if (a == "--max-s" && v) max_s = std::atof(v), ++i;
    else if (a == "--kind" && v) kind_s = v, ++i;
    else if (a == "--kinds" && v) kinds_s = v, ++i;
    else if (a == "--stamps" && v) stamps = v, ++i;
    else if (a == "--stop-file" && v) stop_file = v, ++i;
    else if (a == "--stamps-prefix" && v) prefix = v, ++i;
    else return usage();
  }
  if (n <= 0 || n % kBM != 0) {
    std::fprintf(stderr, "gpuwork: --n must be a positive multiple of %d\n", kBM);
    return 2;
  }
  if (samples <= 0 || !(max_s > 0)) return usage();
  if (mode == "sgemm" && serve) return mode_sgemm(n);
  if (mode == "interfere") {
    Kind k;
    if (!parse_kind(kind_s, &k) || stamps.empty() || stop_file.empty()) return usage();
    return mode_interfere(k, stamps, stop_file, max_s);
  }
  if (mode == "green") {
    if (prefix.empty()) return usage();
    std::vector<std::string> kinds;
    size_t pos = 0;
    while (pos <= kinds_s.size()) {
      const size_t c = kinds_s.find(',', pos);
      const std::string k = kinds_s.substr(pos, c == std::string::npos ? std::string::npos : c - pos);
      if (!k.empty()) kinds.push_back(k);
      if (c == std::string::npos) break;
      pos = c + 1;
    }
    return mode_green(n, samples, kinds, prefix);
  }
  if (mode == "green-query") return mode_green_query();
  if (mode == "mps-affinity") return mode_mps_affinity(max_s);
  return usage();
}
