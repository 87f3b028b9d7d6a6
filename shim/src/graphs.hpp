// SPDX-License-Identifier: Apache-2.0
// CUDA graphs under a partition (shim-internal).
//
// The driver builds a graph kernel node's TMD once, at cuGraphUpload or the
// exec's first launch, and replays reuse it, so a partition changed later
// never reaches them (docs/hardware.md, "CUDA graphs"). Toggling a kernel
// node's enabled state on the exec makes the driver build its TMD again at
// the next launch, and the launch callback then writes the current mask.
//
// So the shim wraps the few graph entry points this needs:
//   * cuGraphInstantiate* records each exec's kernel nodes (child graphs
//     included) and the partition epoch it was instantiated at;
//   * cuGraphLaunch/cuGraphUpload re-encode an exec whose epoch is older than
//     the control region's, toggling each enabled kernel node, and count the
//     TMD builds the driver performs during that call to prove it happened;
//     an exec the driver did not re-encode is counted and reported, never
//     silently trusted;
//   * cuGraphDestroy of a source graph that live execs still need is
//     deferred (PyTorch destroys it right after instantiation; the node
//     handles that identify the exec's nodes belong to it);
//   * cuGraphExecUpdate and user calls of cuGraphNodeSetEnabled mark the exec
//     stale; cuGraphExecDestroy forgets it;
//   * cuGetProcAddress hands out these wrappers too (cudart and PyTorch find
//     the driver's functions through it), and the shim's other wrappers
//     through set_hand_out_hook.
// Everything here runs in API calls, never in the launch callback, except
// note_tmd_built(), which is a load and a compare unless a re-encode is
// under way.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>

#include "nvtaskset/control_region.hpp"

namespace nvtaskset::graphs {

// Set while one thread re-encodes an exec: the launch callback counts the
// TMDs the driver builds on that thread.
inline std::atomic<bool> g_counting{false};
inline std::atomic<pthread_t> g_counting_thread{};
inline std::atomic<std::uint64_t> g_builds{0};

// Called by the launch callback for every TMD it sees.
inline void note_tmd_built() noexcept {
  if (!g_counting.load(std::memory_order_relaxed)) [[likely]]
    return;
  if (::pthread_equal(g_counting_thread.load(std::memory_order_relaxed), ::pthread_self()))
    g_builds.store(g_builds.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

// Where the partition epoch and the graph counters live (the region's
// header, or the process-local fallback); set by the shim's init.
void set_header(std::atomic<ctl::Header*>* header) noexcept;
// How warnings reach the user (the shim's logger); stderr until set.
using WarnFn = void (*)(const char* message);
void set_warn(WarnFn fn) noexcept;

// For cuGetProcAddress: called with what the driver handed out when it is
// none of the graph functions, so the shim's other wrappers are handed out too.
using HandOutFn = void (*)(void** pfn);
void set_hand_out_hook(HandOutFn fn) noexcept;

// For the init: the wrapper that replaces the driver export `name`, after
// remembering `real` as the function it calls; nullptr when `name` is not
// wrapped. `driver` is the real driver's handle, for the helper functions
// the wrappers use.
void* wrap_export(const char* name, void* real, void* driver) noexcept;

}  // namespace nvtaskset::graphs
