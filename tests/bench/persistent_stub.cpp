// SPDX-License-Identifier: Apache-2.0
// A stand-in for bench/cuda/persistent.cu (which needs a GPU and cudart), for
// the CPU test of bench_persistent. It reads the SM count as cudart does:
// dlopen("libcuda.so.1") (under nvtaskset the shim, else the stand-in driver
// through this program's RUNPATH), cuInit, then MULTIPROCESSOR_COUNT twice,
// once through dlsym'd cuDeviceGetAttribute (the attribute) and once through
// cuGetProcAddress (how cudart fills its properties). So the SM count it
// prints is what --partition-sm-count really makes a task read, through the
// real CLI and shim. It runs no kernel: its ms is made up from that count
// (ceil(tiles / sms) tiles of 10 us each), only so the bench has distinct
// numbers to compute ratios from; it models nothing and no test may read it
// as a timing.
//
//   persistent_stub [--tiles N] [--fail] [--hang]
//     --fail   print an error on stderr and exit 1, as persistent does on a CUDA error
//     --hang   sleep (a child the bench must kill at its timeout)
// Also prints "env NVTASKSET_SM_COUNT=<value|unset>" on stderr, so a test can
// see what nvtaskset told the shim.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "nvtaskset/cuda_driver_api.hpp"

namespace {

using InitFn = CUresult (*)(unsigned int);
using GetAttributeFn = CUresult (*)(int*, CUdevice_attribute, CUdevice);
using GetProcAddressFn = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

int fail(const char* what) {
  std::fprintf(stderr, "persistent_stub: %s\n", what);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  long tiles = 132 * 8;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--fail") == 0) return fail("simulated CUDA error");
    if (std::strcmp(argv[i], "--hang") == 0) {
      for (;;) pause();
    }
    if (std::strcmp(argv[i], "--tiles") == 0 && i + 1 < argc) tiles = std::atol(argv[++i]);
    else return fail("usage: persistent_stub [--tiles N] [--fail] [--hang]");
  }
  const char* mode = std::getenv("NVTASKSET_SM_COUNT");
  std::fprintf(stderr, "env NVTASKSET_SM_COUNT=%s\n", mode ? mode : "unset");

  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!h) return fail(dlerror());
  auto init = reinterpret_cast<InitFn>(dlsym(h, "cuInit"));
  auto attr = reinterpret_cast<GetAttributeFn>(dlsym(h, "cuDeviceGetAttribute"));
  auto gpa = reinterpret_cast<GetProcAddressFn>(dlsym(h, "cuGetProcAddress_v2"));
  if (!init || !attr || !gpa) return fail("cuInit, cuDeviceGetAttribute or cuGetProcAddress_v2 missing");
  if (init(0) != CUDA_SUCCESS) return fail("cuInit failed");
  void* p = nullptr;
  CUdriverProcAddressQueryResult q{};
  if (gpa("cuDeviceGetAttribute", &p, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &q) != CUDA_SUCCESS || !p)
    return fail("cuGetProcAddress(cuDeviceGetAttribute) failed");
  int sms = 0, props_sms = 0;
  if (attr(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0) != CUDA_SUCCESS ||
      reinterpret_cast<GetAttributeFn>(p)(&props_sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0) != CUDA_SUCCESS ||
      sms < 1)
    return fail("cuDeviceGetAttribute(MULTIPROCESSOR_COUNT) failed");
  const long waves = (tiles + sms - 1) / sms;
  std::printf("persistent sms=%d props_sms=%d grid=%d occupancy=1 tiles=%ld ms=%.4f\n", sms, props_sms, sms, tiles,
              static_cast<double>(waves) * 0.01);
  return 0;
}
