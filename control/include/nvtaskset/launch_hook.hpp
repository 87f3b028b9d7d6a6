// SPDX-License-Identifier: Apache-2.0
// The driver's hidden launch callback: the hook through which a TPC mask
// reaches each kernel's TMD. Facts from docs/hardware.md
// (measured on H200, driver 580.159.04):
//   * cuGetExportTable with kCallbackTableUuid returns the table CUPTI uses;
//     entry 3 subscribes a callback, entry 6 enables one (domain, cbid);
//   * domain 0xb, cbid 0x1 fires synchronously in the launching thread just
//     before the TMD is uploaded, after CUDA wrote its own per-stream mask,
//     so what the callback writes is final;
//   * params: first 32-bit word is the struct size (>= 0x28); the 5th pointer
//     is the TMD.
#pragma once

#include <cstdint>
#include <string>

namespace nvtaskset::hook {

inline constexpr unsigned char kCallbackTableUuid[16] = {0x2c, 0x8e, 0x0a, 0xd8, 0x07, 0x10, 0xab, 0x4e,
                                                        0x90, 0xdd, 0x54, 0x71, 0x9f, 0xe5, 0xf7, 0x4b};
inline constexpr int kTableSubscribe = 3;
inline constexpr int kTableEnable = 6;
inline constexpr int kDomainLaunch = 0xb;
inline constexpr int kCbidTmdUpload = 0x1;
inline constexpr std::uint32_t kMinParamsSize = 0x28;

using Callback = void (*)(void* userdata, int domain, int cbid, const void* params);
using SubscribeFn = int (*)(std::uint32_t* handle, Callback cb, void* userdata);
using EnableFn = int (*)(std::uint32_t on, std::uint32_t handle, int domain, int cbid);
// cuGetExportTable(const void** table, const CUuuid* id)
using GetExportTableFn = int (*)(const void** table, const void* uuid);

// The TMD a launch callback is about, or nullptr when `params` is not the
// structure we know (too small).
inline void* tmd_of(int domain, int cbid, const void* params) noexcept {
  if (domain != kDomainLaunch || cbid != kCbidTmdUpload || params == nullptr) return nullptr;
  if (*static_cast<const std::uint32_t*>(params) < kMinParamsSize) return nullptr;
  return static_cast<void* const*>(params)[4];
}

// Subscribes `cb` for TMD uploads through `get_export_table` (the real
// driver's cuGetExportTable). Returns false with *why set on failure.
bool subscribe(GetExportTableFn get_export_table, Callback cb, void* userdata, std::string* why);

}  // namespace nvtaskset::hook
