// SPDX-License-Identifier: Apache-2.0
// What the command line's files share (private to nvtaskset/src): the
// parsed options, the requests parsed once, and the two commands that run
// the pipeline parse -> plan -> claim -> deliver -> read back over the
// planner (../planner): a launch (launch.cpp) and a live change or query of
// a running task (-p, live.cpp).
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "nvtaskset/planner.hpp"
#include "nvtaskset/request.hpp"
#include "nvtaskset/task_role.hpp"

namespace nvtaskset::cli {

// A user-facing failure: printed as one line "nvtaskset: <what>", exit 1.
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One list as the user gave it, paired with the -d before it; kind kNone
// for a -d still waiting for its list.
struct Given {
  std::string device;  // "" = the default device
  planner::RequestKind kind = planner::RequestKind::kNone;
  std::string text;
};

// What a command line does: exactly one of these (cli.cpp's one_mode() refuses
// two).
enum class Mode {
  kLaunch,      // run a command (no mode option)
  kPid,         // -p: query or change a running task
  kStatus,      // --status
  kVerify,      // --verify
  kTopology,    // --topology
  kCalibrate,   // --calibrate
  kSystemWide,  // --system-wide ACTION
};

struct Options {
  std::string shim_dir;  // find_shim_dir() of this executable; "" when absent
  std::vector<Given> given;
  std::vector<std::string> positionals;
  Mode mode = Mode::kLaunch;
  bool no_mps = false;
  bool mps_multi_user = false;  // --mps-multi-user: MPS's daemon serves every user at once (mps.hpp)
  bool json = false;
  std::string show;  // -p query: list, mask, gpcs or physical ("" = the form it was set in)
  std::string topology_file;
  std::string system_wide;  // --system-wide's action: enable, disable or status
  bool spread = false;     // -n: spread over GPCs instead of packing
  bool exclusive = false;  // refuse overlapping other live partitions
  bool verbose = false;
  bool all_tasks = false;  // -a: with -p, the task and its descendants
  bool partition_sm_count = false;  // the task's MULTIPROCESSOR_COUNT is its partition's SMs
  std::optional<std::string> seed;  // --seed, with --verify
  roles::Role role = roles::Role::kNone;
  // --env-for PID: plan and claim for the running process PID (whose
  // children are the tasks: a Slurm job step's slurmstepd) and print the
  // environment its tasks need, instead of running a command.
  std::optional<pid_t> env_for;
};

// The requests of a launch or -p, parsed once (cli.cpp, parse_requests):
// the lists in the order given, and the first positional parsed as a TPC
// mask where the command takes one there (launch: MASK COMMAND; -p: MASK
// PID), for launch.cpp and live.cpp to place.
struct Requests {
  std::vector<planner::Request> lists;
  std::optional<planner::Request> lead_mask;
};

// launch.cpp: plans, claims and execs the command; returns only on failure
// (by throwing). With --env-for, prints the environment instead of
// exec'ing anything, and returns 0.
int launch(const Options& o, const Requests& rq, const std::vector<std::string>& env);

// live.cpp: -p, a query or a change of a running task (and with -a its
// family); returns the exit status.
int live(const Options& o, const Requests& rq);

// planner::plan_partition, and with -v the TPCs -n chose, said at once.
Partition plan_partition(const Options& o, const planner::Request& r, const topo::DeviceInfo& dev,
                         planner::Layouts& layouts, const planner::Sharing& sh, planner::Notes* notes);

// The shim file the driver search must skip (none when there is no shim).
std::vector<std::string> shim_copies(const std::string& shim_dir);

}  // namespace nvtaskset::cli
