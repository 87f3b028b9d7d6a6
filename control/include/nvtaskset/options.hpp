// SPDX-License-Identifier: Apache-2.0
// Every environment variable nvtaskset reads, in one table (as mimalloc's
// options.c): name, kind, accepted values, default, and what it does. The
// CLI's --help is generated from it, and a test checks the man page's
// ENVIRONMENT section against it. Header-only and allocation-free: the shim
// reads its options in its one-time init.
#pragma once

#include <cstdlib>
#include <string_view>

namespace nvtaskset {

enum class Option : unsigned {
  kLog,              // NVTASKSET_LOG
  kOnUnsupported,    // NVTASKSET_ON_UNSUPPORTED
  kOnClusterMisfit,  // NVTASKSET_ON_CLUSTER_MISFIT
  kRealLibcuda,      // NVTASKSET_REAL_LIBCUDA
  kTopology,         // NVTASKSET_TOPOLOGY
  kPartition,        // NVTASKSET_PARTITION (CLI -> task)
  kPartitionPid,     // NVTASKSET_PARTITION_PID (CLI -> task)
  kShimDir,          // NVTASKSET_SHIM_DIR
  kMpsControl,       // NVTASKSET_MPS_CONTROL
  kLdconfig,         // NVTASKSET_LDCONFIG (tests)
  kSysconfdir,       // NVTASKSET_SYSCONFDIR (tests)
  kNvdebugRoot,      // NVTASKSET_NVDEBUG_ROOT (tests)
  kStatusDir,        // NVTASKSET_STATUS_DIR (tests)
  kMpsOtherUser,     // NVTASKSET_MPS_OTHER_USER
  kSmCount,          // NVTASKSET_SM_COUNT
  kClaimDelayMs,     // NVTASKSET_CLAIM_DELAY_MS (tests)
  kTestDieAt,        // NVTASKSET_TEST_DIE_AT (tests)
  kRole,             // NVTASKSET_ROLE (CLI -> task)
  kBurstPool,        // NVTASKSET_BURST_POOL (CLI -> task)
  kBeDepth,          // NVTASKSET_BE_DEPTH
  kTestBurstMs,      // NVTASKSET_TEST_BURST_MS (tests)
  kBeYield,          // NVTASKSET_BE_YIELD
  kBeQueueUs,        // NVTASKSET_BE_QUEUE_US
  kClusterMap,       // NVTASKSET_CLUSTER_MAP (CLI -> task)
  kBeWorkUs,         // NVTASKSET_BE_WORK_US
  kLcTopup,          // NVTASKSET_LC_TOPUP
  kTestTopup,        // NVTASKSET_TEST_TOPUP (tests)
  kBeFloorDepth,     // NVTASKSET_BE_FLOOR_DEPTH
  kBeGateEvery,      // NVTASKSET_BE_GATE_EVERY
  kBeBorrowUs,       // NVTASKSET_BE_BORROW_US
  kTestGateSleepMs,  // NVTASKSET_TEST_GATE_SLEEP_MS (tests)
  kBeGateUs,         // NVTASKSET_BE_GATE_US
};

enum class OptionKind { kChoice, kPath, kInternal, kNumber };

struct OptionDesc {
  Option id;
  const char* name;
  OptionKind kind;
  const char* choices;  // kChoice: '|'-separated, the default first; kNumber: "MIN-MAX, default D"; else ""
  bool for_users;       // documented in --help and nvtaskset(1)
  const char* help;
};

inline constexpr OptionDesc kOptions[] = {
    {Option::kLog, "NVTASKSET_LOG", OptionKind::kChoice, "warn|trace|debug|info|error|off", true,
     "log level, any case (at debug the shim logs the cluster sizes a task launched)"},
    {Option::kOnUnsupported, "NVTASKSET_ON_UNSUPPORTED", OptionKind::kChoice, "abort|warn", true,
     "a partitioned task on a GPU whose TMD layout nvtaskset does not know, or that sees none of the GPUs its "
     "partition is for: stop it, or run it unmasked"},
    {Option::kOnClusterMisfit, "NVTASKSET_ON_CLUSTER_MISFIT", OptionKind::kChoice, "abort|widen", true,
     "a kernel whose clusters the partition cannot host: stop the task, or run that kernel on the "
     "partition's whole GPCs"},
    {Option::kRealLibcuda, "NVTASKSET_REAL_LIBCUDA", OptionKind::kPath, "", true,
     "the real driver library, when the search is not enough"},
    {Option::kTopology, "NVTASKSET_TOPOLOGY", OptionKind::kPath, "", true, "same as --topology-file"},
    {Option::kPartition, "NVTASKSET_PARTITION", OptionKind::kInternal, "", true,
     "set by nvtaskset for the task; not for users"},
    {Option::kPartitionPid, "NVTASKSET_PARTITION_PID", OptionKind::kInternal, "", false,
     "the PID nvtaskset exec'd with NVTASKSET_PARTITION"},
    {Option::kShimDir, "NVTASKSET_SHIM_DIR", OptionKind::kPath, "", true,
     "where the shim libcuda.so.1 is, when not next to nvtaskset"},
    {Option::kMpsControl, "NVTASKSET_MPS_CONTROL", OptionKind::kPath, "", true,
     "the nvidia-cuda-mps-control program to use"},
    {Option::kLdconfig, "NVTASKSET_LDCONFIG", OptionKind::kPath, "", false, "ldconfig for --system-wide (tests)"},
    {Option::kSysconfdir, "NVTASKSET_SYSCONFDIR", OptionKind::kPath, "", false, "/etc for --system-wide (tests)"},
    {Option::kNvdebugRoot, "NVTASKSET_NVDEBUG_ROOT", OptionKind::kPath, "", false, "/proc for nvdebug and the kernel driver's GPU list (tests)"},
    {Option::kStatusDir, "NVTASKSET_STATUS_DIR", OptionKind::kPath, "", false,
     "where the public status entries live instead of /dev/shm (tests)"},
    {Option::kMpsOtherUser, "NVTASKSET_MPS_OTHER_USER", OptionKind::kChoice, "wait|fail", true,
     "the MPS server serves another user's clients: start anyway and wait for them (said in one line), or fail"},
    {Option::kSmCount, "NVTASKSET_SM_COUNT", OptionKind::kChoice, "device|partition", true,
     "what cuDeviceGetAttribute(MULTIPROCESSOR_COUNT) tells the task: the GPU's SMs, or its partition's "
     "(same as --partition-sm-count)"},
    {Option::kClaimDelayMs, "NVTASKSET_CLAIM_DELAY_MS", OptionKind::kInternal, "", false,
     "milliseconds between reading the status and publishing a choice, so that tests can make choices race (tests)"},
    {Option::kTestDieAt, "NVTASKSET_TEST_DIE_AT", OptionKind::kInternal, "", false,
     "FOR TESTS ONLY: a `-p` change kills itself (SIGKILL) at this step (locked, claimed, written, published), as "
     "a user or the OOM killer could, so tests can check what every step leaves behind"},
    {Option::kRole, "NVTASKSET_ROLE", OptionKind::kInternal, "", false,
     "set by nvtaskset --latency-critical or --best-effort for the task (task_role.hpp)"},
    {Option::kBurstPool, "NVTASKSET_BURST_POOL", OptionKind::kInternal, "", false,
     "set by nvtaskset --latency-critical: every working TPC of each GPU, which the task may burst onto"},
    {Option::kBeDepth, "NVTASKSET_BE_DEPTH", OptionKind::kNumber, "1-1024, default 64 (4 under hold)", true,
     "while a latency-critical task exists, a --best-effort task keeps at most this many launches queued on the "
     "GPU: under the hold it gives the GPU back within that many kernels; under the gate, within the kernels "
     "before its next gate, and the queue bounds what keeps every TPC once the latency-critical task saturates"},
    {Option::kTestBurstMs, "NVTASKSET_TEST_BURST_MS", OptionKind::kInternal, "", false,
     "FOR TESTS ONLY: a latency-critical task bursts for up to this many ms in a row whatever its share of time "
     "busy, and a best-effort task holds for it as long, so that tests can observe a burst without timing"},
    {Option::kBeYield, "NVTASKSET_BE_YIELD", OptionKind::kChoice, "gate|hold|floor|run", true,
     "what a --best-effort task's launches do while a latency-critical task bursts: go on the floor queued behind "
     "a gate on the GPU that stops its stream while the latency-critical task is busy (the CPU keeps launching; "
     "NVTASKSET_BE_GATE_US), wait on the CPU, go on the TPCs outside its reservation, or go on as if it were "
     "idle"},
    {Option::kBeQueueUs, "NVTASKSET_BE_QUEUE_US", OptionKind::kNumber, "0-1000000, default 0", true,
     "while a latency-critical task exists, a --best-effort task's next launch also waits while its oldest "
     "launch still queued was queued more than this many microseconds ago (0: no such bound; "
     "NVTASKSET_BE_DEPTH stays the most launches queued)"},
    {Option::kClusterMap, "NVTASKSET_CLUSTER_MAP", OptionKind::kInternal, "", false,
     "set by nvtaskset --best-effort and --latency-critical: which TPCs of each GPU host thread-block clusters "
     "together, so that a best-effort task's clustered kernels can go on its floor where it hosts them, and a "
     "latency-critical task's top-up keeps them whole (partition.hpp, ClusterMap)"},
    {Option::kBeWorkUs, "NVTASKSET_BE_WORK_US", OptionKind::kNumber, "0-1000000, default 0", true,
     "while a latency-critical task exists, a --best-effort task keeps at most this many microseconds of work "
     "queued, in its kernels' durations as timed on its own earlier launches, instead of NVTASKSET_BE_DEPTH "
     "launches (which then only caps the launches, at most 63; 0: bounded in launches)"},
    {Option::kLcTopup, "NVTASKSET_LC_TOPUP", OptionKind::kChoice, "on|off", true,
     "a --latency-critical task whose burst stopped (it keeps the GPU busy) takes TPCs from the best-effort "
     "tasks beyond its reservation, as many as make its kernels as fast as alone on its reservation (timed "
     "against short probes of it alone), at most as many again as it reserved; off: its reservation only"},
    {Option::kTestTopup, "NVTASKSET_TEST_TOPUP", OptionKind::kInternal, "", false,
     "FOR TESTS ONLY: a latency-critical task whose burst stopped takes this many TPCs beyond its reservation, "
     "without timing anything, so that tests can check where each task's kernels go"},
    {Option::kBeFloorDepth, "NVTASKSET_BE_FLOOR_DEPTH", OptionKind::kNumber, "1-1024, default 64 (16 under hold)", true,
     "a --best-effort task's launches on its floor (every busy latency-critical task saturated) keep at most this "
     "many launches queued instead of NVTASKSET_BE_DEPTH: they keep off the reservations, so nothing waits behind "
     "them for TPCs (not with NVTASKSET_BE_QUEUE_US or NVTASKSET_BE_WORK_US)"},
    {Option::kBeGateEvery, "NVTASKSET_BE_GATE_EVERY", OptionKind::kNumber, "1-64, default 2", true,
     "under NVTASKSET_BE_YIELD=gate (the default), a --best-effort task queues its gate before every this many "
     "launches of a stream instead of spacing the gates by NVTASKSET_BE_GATE_US: a latency-critical task that "
     "becomes busy waits behind at most that many of its kernels (each gate costs the stream 2.4-2.9 us); the "
     "default where the task's kernels cannot be timed"},
    {Option::kBeBorrowUs, "NVTASKSET_BE_BORROW_US", OptionKind::kNumber, "0-1000000, default 500", true,
     "while a latency-critical task exists, a --best-effort task's kernels that its own earlier launches timed at "
     "this many microseconds or more keep off the reservations even while every latency-critical task is idle, so "
     "that no request waits for one of them there; shorter kernels borrow the reservations (0: every kernel does)"},
    {Option::kTestGateSleepMs, "NVTASKSET_TEST_GATE_SLEEP_MS", OptionKind::kInternal, "", false,
     "FOR TESTS ONLY: a --best-effort task's gatekeeper sleeps this long (instead of 2 ms) on an idle "
     "latency-critical task's beacon unless woken, so that a test sees a missed wake as a gate that never closes"},
    {Option::kBeGateUs, "NVTASKSET_BE_GATE_US", OptionKind::kNumber, "0-100000, default 100", true,
     "under NVTASKSET_BE_YIELD=gate (the default) and unless NVTASKSET_BE_GATE_EVERY is set, a --best-effort task "
     "queues a gate before a launch of a stream once the work since its last gate, in its kernels' durations as "
     "timed on its own earlier launches, would pass this many microseconds, before a kernel not timed yet, and "
     "after 16 launches: a latency-critical task that becomes busy waits for at most that much of its work, or "
     "one longer kernel (0: a gate every NVTASKSET_BE_GATE_EVERY launches)"},
};

constexpr const OptionDesc& option(Option o) { return kOptions[static_cast<unsigned>(o)]; }
static_assert([] {
  unsigned i = 0;
  for (const auto& d : kOptions)
    if (static_cast<unsigned>(d.id) != i++) return false;
  return true;
}(), "kOptions must be in Option order");

// The value, or nullptr when unset or empty.
inline const char* option_value(Option o) noexcept {
  const char* v = std::getenv(option(o).name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// A choice option: the index of its value among `choices` (case-insensitive),
// 0 (the default) when unset; `unknown` is set for a value that is none of
// them, which also counts as the default.
struct ChoiceValue {
  unsigned index = 0;
  bool unknown = false;
  const char* value = nullptr;
};

constexpr bool equal_nocase(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

constexpr ChoiceValue parse_choice(const OptionDesc& d, const char* value) noexcept {
  ChoiceValue c;
  c.value = value;
  if (value == nullptr || *value == '\0') return c;
  std::string_view rest = d.choices;
  for (unsigned i = 0;; ++i) {
    const std::size_t bar = rest.find('|');
    if (equal_nocase(rest.substr(0, bar), value)) {
      c.index = i;
      return c;
    }
    if (bar == std::string_view::npos) break;
    rest.remove_prefix(bar + 1);
  }
  c.unknown = true;
  return c;
}

inline ChoiceValue choice(Option o) noexcept { return parse_choice(option(o), option_value(o)); }

// ---- typed choices ----------------------------------------------------------
// Each choice option's values as an enum, enumerators in the order of the
// table's `choices` (the default first, value 0), so that call sites name a
// value instead of comparing an index. choice_names<O> spells them out; a
// static_assert below holds it equal to the table, so an enum cannot drift
// from the values the option accepts and --help documents.
enum class OnUnsupported : unsigned { kAbort, kWarn };
enum class OnClusterMisfit : unsigned { kAbort, kWiden };
enum class MpsOtherUser : unsigned { kWait, kFail };
enum class SmCount : unsigned { kDevice, kPartition };
enum class BeYield : unsigned { kGate, kHold, kFloor, kRun };
enum class LcTopup : unsigned { kOn, kOff };

template <Option O>
struct ChoiceOf;  // defined for the choice options that have an enum
template <>
struct ChoiceOf<Option::kOnUnsupported> {
  using type = OnUnsupported;
  static constexpr const char* names[] = {"abort", "warn"};
};
template <>
struct ChoiceOf<Option::kOnClusterMisfit> {
  using type = OnClusterMisfit;
  static constexpr const char* names[] = {"abort", "widen"};
};
template <>
struct ChoiceOf<Option::kMpsOtherUser> {
  using type = MpsOtherUser;
  static constexpr const char* names[] = {"wait", "fail"};
};
template <>
struct ChoiceOf<Option::kSmCount> {
  using type = SmCount;
  static constexpr const char* names[] = {"device", "partition"};
};

template <>
struct ChoiceOf<Option::kBeYield> {
  using type = BeYield;
  static constexpr const char* names[] = {"gate", "hold", "floor", "run"};
};

template <>
struct ChoiceOf<Option::kLcTopup> {
  using type = LcTopup;
  static constexpr const char* names[] = {"on", "off"};
};

template <Option O>
using choice_t = typename ChoiceOf<O>::type;

// Whether ChoiceOf<O>::names, joined with '|', is the table's `choices`.
template <Option O>
constexpr bool choice_names_match() noexcept {
  std::string_view rest = option(O).choices;
  if (option(O).kind != OptionKind::kChoice) return false;
  for (const char* name : ChoiceOf<O>::names) {
    const std::string_view n = name;
    if (rest.substr(0, n.size()) != n) return false;
    rest.remove_prefix(n.size());
    if (!rest.empty()) {
      if (rest.front() != '|') return false;
      rest.remove_prefix(1);
    }
  }
  return rest.empty();
}
static_assert(choice_names_match<Option::kOnUnsupported>());
static_assert(choice_names_match<Option::kOnClusterMisfit>());
static_assert(choice_names_match<Option::kMpsOtherUser>());
static_assert(choice_names_match<Option::kSmCount>());
static_assert(choice_names_match<Option::kBeYield>());
static_assert(choice_names_match<Option::kLcTopup>());

// A choice option's value: `value` is the default when unset or unknown;
// `unknown` says the option was set to none of its values (`text`, the
// value as set, and default_name, for the caller's one warning).
template <class E>
struct Choice {
  E value{};
  bool unknown = false;
  const char* text = nullptr;
};

template <Option O>
constexpr Choice<choice_t<O>> parse_choice_of(const char* value) noexcept {
  const ChoiceValue c = parse_choice(option(O), value);
  return {static_cast<choice_t<O>>(c.index), c.unknown, c.value};
}

// The value of choice option O in this process's environment. Allocation-
// free (getenv and comparisons): the shim's init reads its options with it.
template <Option O>
Choice<choice_t<O>> choice_of() noexcept {
  return parse_choice_of<O>(option_value(O));
}

// The name of a value of choice option O ("widen").
template <Option O>
constexpr const char* choice_name(choice_t<O> v) noexcept {
  return ChoiceOf<O>::names[static_cast<unsigned>(v)];
}

// The name of choice option O's default (its first value).
template <Option O>
constexpr const char* default_choice_name() noexcept {
  return ChoiceOf<O>::names[0];
}

// A number option: its value when it is a decimal number within
// [lo, hi], else `def`; `bad` is set for a value that is not (the caller
// says so once).
struct NumberValue {
  unsigned long value = 0;
  bool bad = false;
};
inline NumberValue number(Option o, unsigned long lo, unsigned long hi, unsigned long def) noexcept {
  NumberValue n{def, false};
  const char* v = option_value(o);
  if (v == nullptr) return n;
  unsigned long x = 0;
  const char* p = v;
  for (; *p >= '0' && *p <= '9' && x <= hi; ++p) x = x * 10 + static_cast<unsigned long>(*p - '0');
  if (p == v || *p != '\0' || x < lo || x > hi) n.bad = true;
  else n.value = x;
  return n;
}

}  // namespace nvtaskset
