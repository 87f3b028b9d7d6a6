// SPDX-License-Identifier: Apache-2.0
// An ordinary CUDA program: linked against libcuda.so.1 (DT_NEEDED), with a
// RUNPATH to the stand-in driver so it also runs without nvtaskset. Under
// nvtaskset the loader finds the shim first (LD_LIBRARY_PATH beats RUNPATH).
#include "launcher_common.hpp"

int main(int argc, char** argv) {
  const launcher::Driver d{&cuInit, &cuDeviceGet, &cuDevicePrimaryCtxRetain, &cuCtxSetCurrent, &cuLaunchKernel,
                             &cuDeviceGetAttribute};
  return launcher::main(argc, argv, d);
}
