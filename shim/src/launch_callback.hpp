// SPDX-License-Identifier: Apache-2.0
// The launch callback (shim-internal): the hot path. The driver calls it in
// every launching thread just before it uploads a kernel's Task Metadata
// Descriptor; it reads the partition of the launching GPU from the control
// region (a seqlock read, or the last partition it read consistently when
// that fails), and writes the TPC-disable mask into the TMD.
//
// The rules of the hot path: no allocation, no lock, no logging, no system
// call (only the fatal and once-only warning paths write to stderr), no
// locked instruction (counters are a relaxed load and store). The lifecycle
// (init, driver loading, the intercepted entry points) is shim.cpp's.
#pragma once

#include <atomic>
#include <cstdint>

#include "nvtaskset/control_region.hpp"

namespace nvtaskset::launch {

// The header the callback reads: the control region's, or the process-local
// fallback when no region could be created. Set by the init, swapped (never
// freed) in a fork child.
extern std::atomic<ctl::Header*> g_header;

// The policies (options.hpp), set by the init before the callback is
// subscribed: NVTASKSET_ON_UNSUPPORTED=warn, NVTASKSET_ON_CLUSTER_MISFIT=widen.
extern std::atomic<bool> g_warn_unsupported;
extern std::atomic<bool> g_widen_clusters;

// The driver functions that tell which GPU a launch is for (cuCtxGetDevice,
// cuDeviceGetUuid), set by the init before the callback is subscribed.
using CtxGetDeviceFn = int (*)(int* device);
using DeviceGetUuidFn = int (*)(std::uint8_t* uuid, int device);
void set_device_lookup(CtxGetDeviceFn ctx_get_device, DeviceGetUuidFn device_get_uuid) noexcept;
DeviceGetUuidFn device_get_uuid() noexcept;

// The callback (launch_hook.hpp's signature).
void on_launch(void* userdata, int domain, int cbid, const void* params) noexcept;

}  // namespace nvtaskset::launch
