// SPDX-License-Identifier: Apache-2.0
// Subscribing to the driver's hidden launch callback (launch_hook.hpp).
// Runs inside the shim's one-time init: no logging, errors as one line.
#include "nvtaskset/launch_hook.hpp"

#include <cstring>

namespace nvtaskset::hook {
namespace {

// The table is an array of untyped pointers; entries are converted to their
// function types by copying the bits (a void* -> function pointer cast is
// only conditionally supported in ISO C++).
template <class Fn>
Fn entry(const void* table, int index) {
  const void* p = static_cast<const void* const*>(table)[index];
  Fn fn = nullptr;
  static_assert(sizeof fn == sizeof p);
  std::memcpy(&fn, &p, sizeof fn);
  return fn;
}

}  // namespace

bool subscribe(GetExportTableFn get_export_table, Callback cb, void* userdata, std::string* why) {
  auto fail = [&](std::string msg) {
    if (why) *why = std::move(msg);
    return false;
  };
  if (get_export_table == nullptr) return fail("the driver does not export cuGetExportTable");
  if (cb == nullptr) return fail("no callback given");

  const void* table = nullptr;
  const int rc = get_export_table(&table, kCallbackTableUuid);
  if (rc != 0 || table == nullptr)
    return fail("the driver does not provide the launch-callback table (cuGetExportTable error " +
                std::to_string(rc) + ")");

  const auto subscribe_fn = entry<SubscribeFn>(table, kTableSubscribe);
  const auto enable_fn = entry<EnableFn>(table, kTableEnable);
  if (subscribe_fn == nullptr || enable_fn == nullptr)
    return fail("the driver's launch-callback table lacks the subscribe/enable entries");

  std::uint32_t handle = 0;
  if (const int r = subscribe_fn(&handle, cb, userdata); r != 0)
    return fail("the driver refused the launch-callback subscription (error " + std::to_string(r) + ")");
  if (const int r = enable_fn(1, handle, kDomainLaunch, kCbidTmdUpload); r != 0)
    return fail("the driver refused to enable the TMD-upload callback (error " + std::to_string(r) + ")");
  return true;
}

}  // namespace nvtaskset::hook
