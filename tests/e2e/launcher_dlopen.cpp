// SPDX-License-Identifier: Apache-2.0
// A CUDA program that is NOT linked against libcuda: like cudart and PyTorch it
// dlopen()s "libcuda.so.1", takes cuInit and cuGetProcAddress_v2 with dlsym,
// and everything else through cuGetProcAddress.
#include <dlfcn.h>

#include <cstdlib>

#include "launcher_common.hpp"

namespace {

using GetProcAddressFn = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

template <class F>
void resolve(GetProcAddressFn gpa, const char* name, F& out) {
  void* p = nullptr;
  CUdriverProcAddressQueryResult status{};
  const CUresult r = gpa(name, &p, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status);
  if (r != CUDA_SUCCESS || !p || status != CU_GET_PROC_ADDRESS_SUCCESS) {
    std::fprintf(stderr, "launcher_dlopen: cuGetProcAddress(%s) failed: %d\n", name, static_cast<int>(r));
    std::exit(3);
  }
  out = reinterpret_cast<F>(p);
}

}  // namespace

int main(int argc, char** argv) {
  // LAUNCHER_LIBCUDA: a program that loads the driver by a path of its own
  // (a renamed or private copy), as a bypass of the shim would.
  const char* lib = std::getenv("LAUNCHER_LIBCUDA");
  void* h = dlopen(lib != nullptr ? lib : "libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    std::fprintf(stderr, "launcher_dlopen: %s\n", dlerror());
    return 3;
  }
  launcher::Driver d{};
  d.init = reinterpret_cast<decltype(d.init)>(dlsym(h, "cuInit"));
  auto gpa = reinterpret_cast<GetProcAddressFn>(dlsym(h, "cuGetProcAddress_v2"));
  if (!d.init || !gpa) {
    std::fprintf(stderr, "launcher_dlopen: cuInit or cuGetProcAddress_v2 missing\n");
    return 3;
  }
  resolve(gpa, "cuDeviceGet", d.device_get);
  resolve(gpa, "cuDevicePrimaryCtxRetain", d.primary_ctx_retain);
  resolve(gpa, "cuCtxSetCurrent", d.ctx_set_current);
  resolve(gpa, "cuLaunchKernel", d.launch_kernel);
  resolve(gpa, "cuDeviceGetAttribute", d.device_get_attribute);
  return launcher::main(argc, argv, d);
}
