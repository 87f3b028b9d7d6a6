// SPDX-License-Identifier: Apache-2.0
// Launch-to-block-start latency (paper Fig. 11b): the time from the host's
// CLOCK_MONOTONIC stamp just before a kernel launch to the moment the first
// block of that kernel runs (its %globaltimer, converted with the calibrated
// offset of common.cuh). Each launch goes to an idle GPU (the previous kernel
// finished and was synchronized, untimed), so the figure is the launch path
// (runtime, driver, the shim's callback when it is loaded, the GPU's front
// end) and not queueing. Run it plainly and under nvtaskset; bench/eval.py
// alternates the two in rounds.
//
//   launch_latency [--launches N] [--blocks B] [--samples-out FILE]
// prints
//   calib begin|end offset_ns ... halfwidth_ns ... at_ns ... ok 1
//   timer_resolution_ns R
//   summary launches N blocks B latency_ns min M med D p99 P max X call_ns med C
// and, with --samples-out, one line per launch: latency_ns,call_ns,roundtrip_ns,last_block_ns
// (the offset is interpolated between the two calibrations, so a slow drift
// of %globaltimer against the host clock does not bias the figures).
#include <string>
#include <vector>

#include "common.cuh"

__global__ void latency_kernel(unsigned long long* first, unsigned long long* last, int i) {
  if (threadIdx.x == 0) {
    const unsigned long long t = evalgpu::globaltimer();
    atomicMin(&first[i], t);
    atomicMax(&last[i], t);
  }
}

int main(int argc, char** argv) {
  int launches = 2000, blocks = 1;
  const char* samples_out = nullptr;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--launches" && v) launches = std::atoi(v), ++i;
    else if (a == "--blocks" && v) blocks = std::atoi(v), ++i;
    else if (a == "--samples-out" && v) samples_out = v, ++i;
    else {
      std::fprintf(stderr, "usage: launch_latency [--launches N] [--blocks B] [--samples-out FILE]\n");
      return 2;
    }
  }
  if (launches < 1 || blocks < 1) {
    std::fprintf(stderr, "launch_latency: --launches and --blocks must be positive\n");
    return 2;
  }
  unsigned long long *d_first = nullptr, *d_last = nullptr;
  EVAL_CHECK(cudaMalloc(&d_first, sizeof(unsigned long long) * launches));
  EVAL_CHECK(cudaMalloc(&d_last, sizeof(unsigned long long) * launches));
  EVAL_CHECK(cudaMemset(d_first, 0xff, sizeof(unsigned long long) * launches));
  EVAL_CHECK(cudaMemset(d_last, 0, sizeof(unsigned long long) * launches));
  cudaStream_t s;
  EVAL_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Warm-up: module load, first-launch paths.
  for (int i = 0; i < 200; ++i) latency_kernel<<<blocks, 32, 0, s>>>(d_first, d_last, 0);
  EVAL_CHECK(cudaStreamSynchronize(s));
  EVAL_CHECK(cudaMemset(d_first, 0xff, sizeof(unsigned long long)));
  EVAL_CHECK(cudaMemset(d_last, 0, sizeof(unsigned long long)));
  EVAL_CHECK(cudaDeviceSynchronize());

  const evalgpu::Offset o0 = evalgpu::calibrate_offset();
  std::vector<std::uint64_t> t0(launches), t_call(launches), t_sync(launches);
  for (int i = 0; i < launches; ++i) {
    t0[i] = evalgpu::mono_ns();
    latency_kernel<<<blocks, 32, 0, s>>>(d_first, d_last, i);
    t_call[i] = evalgpu::mono_ns();
    EVAL_CHECK(cudaStreamSynchronize(s));
    t_sync[i] = evalgpu::mono_ns();
  }
  EVAL_CHECK(cudaGetLastError());
  const evalgpu::Offset o1 = evalgpu::calibrate_offset();
  const unsigned long long res = evalgpu::timer_resolution_ns();
  std::vector<unsigned long long> first(launches), last(launches);
  EVAL_CHECK(cudaMemcpy(first.data(), d_first, sizeof(unsigned long long) * launches, cudaMemcpyDeviceToHost));
  EVAL_CHECK(cudaMemcpy(last.data(), d_last, sizeof(unsigned long long) * launches, cudaMemcpyDeviceToHost));
  evalgpu::print_offset("begin", o0);
  evalgpu::print_offset("end", o1);
  std::printf("timer_resolution_ns %llu\n", res);
  if (!o0.ok || !o1.ok) {
    std::fprintf(stderr, "launch_latency: the clock calibration failed\n");
    return 4;
  }
  // Offset at host time t, linear between the two calibrations.
  const double span = static_cast<double>(o1.at_host_ns) - static_cast<double>(o0.at_host_ns);
  auto offset_at = [&](std::uint64_t t) {
    if (span <= 0) return static_cast<double>(o0.offset_ns);
    const double f = (static_cast<double>(t) - static_cast<double>(o0.at_host_ns)) / span;
    return static_cast<double>(o0.offset_ns) + f * static_cast<double>(o1.offset_ns - o0.offset_ns);
  };
  std::vector<double> lat(launches), call(launches);
  FILE* f = samples_out ? std::fopen(samples_out, "w") : nullptr;
  if (samples_out && !f) {
    std::fprintf(stderr, "launch_latency: cannot write %s\n", samples_out);
    return 2;
  }
  if (f) std::fprintf(f, "latency_ns,call_ns,roundtrip_ns,last_block_ns\n");
  for (int i = 0; i < launches; ++i) {
    const double start = static_cast<double>(first[i]) - offset_at(t0[i]);
    lat[i] = start - static_cast<double>(t0[i]);
    call[i] = static_cast<double>(t_call[i] - t0[i]);
    if (f)
      std::fprintf(f, "%.0f,%.0f,%llu,%.0f\n", lat[i], call[i], static_cast<unsigned long long>(t_sync[i] - t0[i]),
                   static_cast<double>(last[i]) - offset_at(t0[i]) - static_cast<double>(t0[i]));
  }
  if (f) std::fclose(f);
  std::vector<double> sl = lat, sc = call;
  std::sort(sl.begin(), sl.end());
  std::sort(sc.begin(), sc.end());
  auto pct = [](const std::vector<double>& v, double p) {
    std::size_t k = static_cast<std::size_t>(p * static_cast<double>(v.size()) + 0.999999);
    return v[std::min(v.size() - 1, k == 0 ? 0 : k - 1)];
  };
  std::printf("summary launches %d blocks %d latency_ns min %.0f med %.0f p99 %.0f max %.0f call_ns med %.0f "
              "halfwidth_ns %lld drift_ns %lld\n",
              launches, blocks, sl.front(), pct(sl, 0.5), pct(sl, 0.99), sl.back(), pct(sc, 0.5),
              std::max(o0.halfwidth_ns, o1.halfwidth_ns), o1.offset_ns - o0.offset_ns);
  return 0;
}
