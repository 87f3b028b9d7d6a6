// SPDX-License-Identifier: Apache-2.0
// The driver functions nvtaskset resolves at run time (private to topology/).
// Each is looked up by its EXPORTED name: the driver exports many API names
// in versions (cuMemAlloc -> cuMemAlloc_v2, ...; the name a program built
// with cuda.h binds to), and dlsym sees only the exported ones.
#pragma once

#include "nvtaskset/cuda_driver.hpp"
#include "nvtaskset/cuda_driver_api.hpp"

namespace nvtaskset::topo {

struct CudaDriver::Api {
  CUresult (*cuInit)(unsigned int) = nullptr;
  CUresult (*cuDriverGetVersion)(int*) = nullptr;
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*cuDeviceGetUuid)(CUuuid*, CUdevice) = nullptr;  // _v2 where the driver has it
  CUresult (*cuDeviceGetAttribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice) = nullptr;  // _v2
  CUresult (*cuCtxPushCurrent)(CUcontext) = nullptr;          // _v2
  CUresult (*cuCtxPopCurrent)(CUcontext*) = nullptr;          // _v2
  CUresult (*cuModuleLoadDataEx)(CUmodule*, const void*, unsigned int, CUjit_option*, void**) = nullptr;
  CUresult (*cuModuleUnload)(CUmodule) = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*cuFuncSetAttribute)(CUfunction, CUfunction_attribute, int) = nullptr;
  CUresult (*cuOccupancyMaxActiveBlocksPerMultiprocessor)(int*, CUfunction, int, size_t) = nullptr;
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t) = nullptr;  // _v2
  CUresult (*cuMemFree)(CUdeviceptr) = nullptr;            // _v2
  CUresult (*cuMemAllocHost)(void**, size_t) = nullptr;    // _v2
  CUresult (*cuMemFreeHost)(void*) = nullptr;
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream) = nullptr;  // _v2
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream) = nullptr;        // _v2
  CUresult (*cuStreamCreate)(CUstream*, unsigned int) = nullptr;
  CUresult (*cuStreamDestroy)(CUstream) = nullptr;  // _v2
  CUresult (*cuStreamQuery)(CUstream) = nullptr;
  CUresult (*cuLaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                             unsigned int, unsigned int, CUstream, void**, void**) = nullptr;
  int (*cuGetExportTable)(const void**, const void*) = nullptr;
  // Optional: CUDA 12.0+ drivers only (needed for thread-block clusters).
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig*, CUfunction, void**, void**) = nullptr;
  CUresult (*cuOccupancyMaxActiveClusters)(int*, CUfunction, const CUlaunchConfig*) = nullptr;
  // Optional.
  CUresult (*cuDeviceGetPCIBusId)(char*, int, CUdevice) = nullptr;
};

}  // namespace nvtaskset::topo
