// SPDX-License-Identifier: Apache-2.0
// The SM count a task sees (shim-internal), opt-in with
// NVTASKSET_SM_COUNT=partition (nvtaskset --partition-sm-count).
//
// Libraries size persistent grids by cuDeviceGetAttribute(
// CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT): one block (or a few) per SM,
// each looping over tiles. In a partition of S SMs such a grid has more
// blocks than can run at once, and the last wave runs on a few SMs while the
// rest of the partition idles. With the option on, the shim wraps
// cuDeviceGetAttribute (the export, and what cuGetProcAddress hands out) and
// answers MULTIPROCESSOR_COUNT with the SMs of the partition in force for that
// device at the time of the query: 2 per enabled TPC (bits.hpp), never more
// than the driver's own answer. Every other attribute, and every device
// without a partition, gets the driver's answer unchanged.
//
// A later `nvtaskset -p` changes what later queries return, not what the
// task already read: libraries (cudart's device properties, PyTorch) read it
// once and keep it.
//
// All of it runs in the API call, never in the launch callback. With the
// option off nothing is wrapped.
#pragma once

#include <atomic>

#include "nvtaskset/control_region.hpp"

namespace nvtaskset::sm_count {

using DeviceGetUuidFn = int (*)(std::uint8_t* uuid, int device);

// For the init, before the slots are filled: whether the option is on, where
// the control region's header is, and how to tell a device's UUID.
void configure(bool partition_count, std::atomic<ctl::Header*>* header, DeviceGetUuidFn get_uuid) noexcept;

// For the init: the wrapper that replaces export `name`, after remembering
// `real` as the function it calls; nullptr when `name` is not wrapped (or the
// option is off).
void* wrap_export(const char* name, void* real) noexcept;

// For cuGetProcAddress: when *pfn is the real function a wrapper stands for,
// replaces it with the wrapper.
void hand_out(void** pfn) noexcept;

}  // namespace nvtaskset::sm_count
