// SPDX-License-Identifier: Apache-2.0
// The SM count a task sees: see sm_count.hpp.
#include "sm_count.hpp"

#include <cstring>

#include "nvtaskset/bits.hpp"
#include "nvtaskset/cuda_driver_api.hpp"

namespace nvtaskset::sm_count {
namespace {

using GetAttributeFn = CUresult (*)(int*, CUdevice_attribute, CUdevice);

std::atomic<bool> g_on{false};
std::atomic<std::atomic<ctl::Header*>*> g_header{nullptr};
std::atomic<DeviceGetUuidFn> g_get_uuid{nullptr};
std::atomic<GetAttributeFn> g_real{nullptr};

// The entry that applies on `device` (control_region.hpp), as for a launch there.
const ctl::DeviceEntry* entry_for(const ctl::Header& h, int device) noexcept {
  return ctl::entry_for_device(h, [device](std::uint8_t (&uuid)[16]) {
    const DeviceGetUuidFn get_uuid = g_get_uuid.load(std::memory_order_acquire);
    return get_uuid != nullptr && get_uuid(uuid, device) == 0;
  });
}

// The SMs of the partition that applies to `device`, 0 when none does (or it
// cannot be read consistently).
unsigned partition_sms(int device) noexcept {
  auto* src = g_header.load(std::memory_order_acquire);
  const ctl::Header* h = src != nullptr ? src->load(std::memory_order_acquire) : nullptr;
  if (h == nullptr) return 0;
  const ctl::DeviceEntry* e = entry_for(*h, device);
  if (e == nullptr) return 0;
  ctl::LaunchView v{};
  if (ctl::read_launch_view(*e, v) != ctl::ReadResult::kOk) return 0;
  const PhysicalTpcMask enabled{Bits128{v.enabled_lo, v.enabled_hi}};
  return 2 * enabled.size();  // 2 SMs per TPC (bits.hpp)
}

CUresult w_device_get_attribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  const GetAttributeFn real = g_real.load(std::memory_order_acquire);
  const CUresult rc = real(pi, attrib, dev);
  if (rc != CUDA_SUCCESS || pi == nullptr || attrib != CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) return rc;
  const unsigned sms = partition_sms(dev);
  if (sms > 0 && static_cast<int>(sms) < *pi) *pi = static_cast<int>(sms);
  return rc;
}

}  // namespace

void configure(bool partition_count, std::atomic<ctl::Header*>* header, DeviceGetUuidFn get_uuid) noexcept {
  g_header.store(header, std::memory_order_release);
  g_get_uuid.store(get_uuid, std::memory_order_release);
  g_on.store(partition_count, std::memory_order_release);
}

void* wrap_export(const char* name, void* real) noexcept {
  if (!g_on.load(std::memory_order_acquire) || real == nullptr || std::strcmp(name, "cuDeviceGetAttribute") != 0)
    return nullptr;
  g_real.store(reinterpret_cast<GetAttributeFn>(real), std::memory_order_release);
  return reinterpret_cast<void*>(&w_device_get_attribute);
}

void hand_out(void** pfn) noexcept {
  if (pfn == nullptr || *pfn == nullptr) return;
  const GetAttributeFn real = g_real.load(std::memory_order_acquire);
  if (real != nullptr && *pfn == reinterpret_cast<void*>(real)) *pfn = reinterpret_cast<void*>(&w_device_get_attribute);
}

}  // namespace nvtaskset::sm_count
