// SPDX-License-Identifier: Apache-2.0
// What a program reads as the GPU's SM count, through each door libraries
// use: the driver API export, cuGetProcAddress (how cudart and PyTorch reach
// the driver), cudaDeviceGetAttribute and cudaGetDeviceProperties. Prints
//   sms driver=N procaddr=N runtime=N props=N
// (verify.py smcount checks them under nvtaskset --partition-sm-count).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>

int main() {
  if (cuInit(0) != CUDA_SUCCESS) return 1;
  CUdevice dev;
  int drv = -1, viaproc = -1, rt = -1;
  if (cuDeviceGet(&dev, 0) != CUDA_SUCCESS) return 1;
  cuDeviceGetAttribute(&drv, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  void* fn = nullptr;
  CUdriverProcAddressQueryResult q;
  if (cuGetProcAddress("cuDeviceGetAttribute", &fn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &q) == CUDA_SUCCESS && fn)
    reinterpret_cast<CUresult (*)(int*, CUdevice_attribute, CUdevice)>(fn)(&viaproc,
                                                                           CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  if (cudaDeviceGetAttribute(&rt, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) return 1;
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return 1;
  std::printf("sms driver=%d procaddr=%d runtime=%d props=%d\n", drv, viaproc, rt, p.multiProcessorCount);
  return 0;
}
