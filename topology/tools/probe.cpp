// SPDX-License-Identifier: Apache-2.0
// nvtaskset-topology-probe: calibrates every visible GPU (or one) with debug
// logging, prints the topology, and optionally repeats the calibration to
// check it is repeatable. A development tool for GPU runs; not installed.
//
//   nvtaskset-topology-probe [-d SPEC] [--repeat N] [--json] [--timeout-ms MS] [--quiet]
//
// Exit status: 0 when every calibration succeeded and every repeat matched.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "nvtaskset/calibration.hpp"
#include "nvtaskset/cuda_driver.hpp"
#include "nvtaskset/topology.hpp"
#include "nvtaskset/topology_json.hpp"

using namespace nvtaskset::topo;

namespace {

// Bits, GPC membership and cluster capability; not the timestamps.
bool same_layout(const Topology& a, const Topology& b) {
  nlohmann::json x = topology_to_json(a), y = topology_to_json(b);
  for (auto* j : {&x, &y}) {
    j->erase("calibrated_at");
    j->erase("calibration_ms");
  }
  return x == y;
}

}  // namespace

int main(int argc, char** argv) {
  std::string spec;
  unsigned repeat = 1;
  bool json = false, quiet = false;
  CalibrationOptions copts;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "-d") spec = next();
    else if (a == "--repeat") repeat = static_cast<unsigned>(std::stoul(next()));
    else if (a == "--json") json = true;
    else if (a == "--quiet") quiet = true;
    else if (a == "--timeout-ms") copts.wait_timeout = std::chrono::milliseconds(std::stoul(next()));
    else {
      std::fprintf(stderr, "usage: %s [-d SPEC] [--repeat N] [--json] [--timeout-ms MS] [--quiet]\n", argv[0]);
      return 2;
    }
  }
  spdlog::set_level(quiet ? spdlog::level::info : spdlog::level::debug);
  int rc = 0;
  try {
    CudaDriver drv;
    std::vector<DeviceInfo> devs = drv.query_devices();
    if (!spec.empty()) devs = {select_device(devs, spec)};
    std::vector<Topology> results;
    for (const DeviceInfo& d : devs) {
      Topology first;
      for (unsigned r = 0; r < std::max(1u, repeat); ++r) {
        Topology t;
        try {
          t = calibrate(drv, d, [&](unsigned done, unsigned total) {
            if (!quiet && (done == total || done % 16 == 0)) std::fprintf(stderr, "\rdevice %u: %u/%u", d.ordinal, done, total);
            if (!quiet && done == total) std::fputc('\n', stderr);
          }, copts);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "nvtaskset-topology-probe: %s\n", e.what());
          if (drv.wedged()) {
            std::fflush(nullptr);
            ::_exit(3);  // a kernel of ours may be stuck: do not tear down
          }
          rc = 1;
          break;
        }
        std::fprintf(stderr, "device %u: run %u: %.1f ms, %u GPCs, max cluster %u\n", d.ordinal, r + 1,
                     t.calibration_ms.value_or(0), static_cast<unsigned>(t.gpcs.size()), t.max_cluster());
        if (r == 0) {
          first = t;
        } else if (!same_layout(first, t)) {
          std::fprintf(stderr, "device %u: run %u DIFFERS from run 1\n", d.ordinal, r + 1);
          std::fputs(render_topology({t}).c_str(), stderr);
          rc = 1;
        }
      }
      if (!first.tpcs.empty()) results.push_back(first);
    }
    std::fputs(json ? render_topology_json(results).c_str() : render_topology(results).c_str(), stdout);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nvtaskset-topology-probe: %s\n", e.what());
    return 1;
  }
  return rc;
}
