// SPDX-License-Identifier: Apache-2.0
// End-to-end tests of the command line itself: --help, --version and the man
// page agree; bad lists, masks and options never start the command, and syntax
// errors come before any driver access; NVTASKSET_LOG.
#include "e2e_fixture.hpp"

using namespace e2e;

namespace {

// --- --help, --version and the man page ----------------------------------------------------------

// Every long option and NVTASKSET_ variable in --help is documented in the
// man page, and every option the man page documents is in --help: the two
// stay in step with the parser.
TEST_F(E2E, HelpAndManPageAgree) {
  const Result r = run({kCli, "--help"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  // One usage block, then examples (as taskset's usage()).
  EXPECT_EQ(r.out.find("Usage:"), 0u) << r.out;
  EXPECT_EQ(r.out.find("Usage:", 1), std::string::npos) << "two usage blocks:\n" << r.out;
  EXPECT_NE(r.out.find("\nExamples:\n"), std::string::npos) << r.out;
  auto collect = [](const std::string& text, const std::regex& re) {
    std::set<std::string> out;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it)
      out.insert((*it)[1].str());
    return out;
  };
  const std::string help_options = r.out.substr(r.out.find("Options:"), r.out.find("Examples:") - r.out.find("Options:"));
  const auto help_long = collect(help_options, std::regex("(?:^|[ ,])--([a-z][a-z-]+)"));
  const std::string man = read_file(NVTASKSET_E2E_MAN);
  const auto sec = [&](const std::string& name) {
    const auto a = man.find(".SH " + name + "\n");
    const auto b = man.find("\n.SH ", a + 1);
    return a == std::string::npos ? std::string() : man.substr(a, b - a);
  };
  // Option entries of the OPTIONS section: lines that follow ".TP".
  std::set<std::string> man_long;
  {
    std::istringstream in(sec("OPTIONS"));
    std::string line, prev;
    while (std::getline(in, line)) {
      if (prev == ".TP")
        for (const auto& o : collect(line, std::regex("\\\\-\\\\-([a-z][a-z\\\\-]+)"))) {
          std::string name = o;
          name.erase(std::remove(name.begin(), name.end(), '\\'), name.end());
          man_long.insert(name);
        }
      prev = line;
    }
  }
  ASSERT_FALSE(man_long.empty());
  EXPECT_EQ(help_long, man_long) << "--help and nvtaskset(1) document different options";
  const auto help_env = collect(r.out, std::regex("(NVTASKSET_[A-Z_]+)"));
  const std::string man_env = sec("ENVIRONMENT");
  for (const auto& v : help_env) EXPECT_NE(man_env.find(v), std::string::npos) << v << " is not in nvtaskset(1)";
}

TEST_F(E2E, VersionSaysWhatABugReportNeeds) {
  const Result r = run({kCli, "--version"});
  ASSERT_TRUE(ExitedWith(r, 0)) << r;
  EXPECT_TRUE(std::regex_match(r.out, std::regex("nvtaskset [0-9]+\\.[0-9]+\\.[0-9]+\n"
                                                 "built against CUDA driver API [0-9]+\\.[0-9]+ \\(CUDA_VERSION [0-9]+\\), "
                                                 "control region version [0-9]+\n")))
      << r;
}

TEST_F(E2E, HelpNamesTheOptions) {
  const Result r = run({kCli, "--help"});
  ASSERT_TRUE(ExitedWith(r, 0));
  // As options, not as parts of longer ones ("--physical" contains "-p").
  for (const std::string opt : {"-p", "-t", "--physical", "--no-mps"})
    EXPECT_TRUE(std::regex_search(r.out, std::regex("(^|[\\s,\\[])" + opt + "([\\s,=\\]]|$)")))
        << "--help does not mention " << opt << r;
}

// --- bad lists and masks never start the command -------------------------------------------------

struct BadSpec {
  std::string name;
  std::vector<std::string> args;  // between --no-mps and the command
};

void PrintTo(const BadSpec& c, std::ostream* os) { *os << c.name; }

class BadSpecs : public E2E, public ::testing::WithParamInterface<BadSpec> {};

TEST_P(BadSpecs, RejectedBeforeTheCommandRuns) {
  // Control: the same command with a good list runs, so the failure below is
  // the bad argument's, not the setup's.
  const std::string control = path("control");
  ASSERT_TRUE(ExitedWith(run({kCli, "--no-mps", "-t", "0", "touch", control}), 0));
  ASSERT_TRUE(exists(control));
  ::unlink(record_.c_str());

  const std::string marker = path("marker");
  std::vector<std::string> argv{kCli, "--no-mps"};
  argv.insert(argv.end(), GetParam().args.begin(), GetParam().args.end());
  argv.insert(argv.end(), {"touch", marker});
  const Result r = run(argv);
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_FALSE(exists(marker)) << "the command ran" << r;
  EXPECT_FALSE(exists(record_));
}

INSTANTIATE_TEST_SUITE_P(E2E, BadSpecs,
                         ::testing::Values(BadSpec{"EmptyList", {"-t", ""}},                     //
                                           BadSpec{"OpenRange", {"-t", "1-"}},                   //
                                           BadSpec{"LeadingDash", {"-t", "-1"}},                 //
                                           BadSpec{"Letter", {"-t", "a"}},                       //
                                           BadSpec{"ReversedRange", {"-t", "3-1"}},              //
                                           BadSpec{"ZeroStride", {"-t", "0-7:0"}},               //
                                           BadSpec{"EmptyItem", {"-t", "0,,1"}},                 //
                                           BadSpec{"TpcBeyondDevice", {"-t", "8"}},              //
                                           BadSpec{"RangeBeyondDevice", {"-t", "0-8"}},          //
                                           BadSpec{"EmptyMask", {"0x0"}},                        //
                                           BadSpec{"NotHex", {"0xzz"}},                          //
                                           BadSpec{"MaskOf33Digits", {"0x1" + std::string(32, '0')}},  //
                                           BadSpec{"MaskBeyondDevice", {"0x100"}},               //
                                           BadSpec{"UnknownOption", {"--bogus", "-t", "0"}}),
                         [](const auto& info) { return info.param.name; });

TEST_F(E2E, MissingCommandIsAnError) {
  const Result r = run({kCli, "--no-mps", "-t", "0"});
  EXPECT_TRUE(FailedWithOneLine(r));
}

// --- syntax errors come before any driver access -------------------------------------------------

struct BadSyntax {
  std::string name;
  std::vector<std::string> args;  // between --no-mps and the command
  std::string error;              // the whole stderr line, after "nvtaskset: "
};

void PrintTo(const BadSyntax& c, std::ostream* os) { *os << c.name; }

class SyntaxBeforeDriver : public E2E, public ::testing::WithParamInterface<BadSyntax> {};

TEST_P(SyntaxBeforeDriver, IsReportedAsSuch) {
  // No driver anywhere: the stand-in is replaced by a file that does not exist.
  env_["NVTASKSET_REAL_LIBCUDA"] = path("no-such-libcuda.so.1");
  const std::string marker = path("marker");
  // Control: a good list gets as far as the (missing) driver.
  Result r = run({kCli, "--no-mps", "-t", "0-3", "touch", marker});
  ASSERT_TRUE(FailedWithOneLine(r));
  ASSERT_NE(r.err.find("no CUDA driver found"), std::string::npos) << r;

  std::vector<std::string> argv{kCli, "--no-mps"};
  argv.insert(argv.end(), GetParam().args.begin(), GetParam().args.end());
  argv.insert(argv.end(), {"touch", marker});
  r = run(argv);
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_EQ(r.err, "nvtaskset: " + GetParam().error + "\n") << r;
  EXPECT_FALSE(exists(marker)) << "the command ran";
}

INSTANTIATE_TEST_SUITE_P(
    Hardening, SyntaxBeforeDriver,
    ::testing::Values(
        BadSyntax{"ZeroStride", {"-t", "0-3:0"}, "invalid TPC list '0-3:0': stride must be at least 1"},
        BadSyntax{"StrideOf2To64Minus1",
                  {"-t", "50-53:18446744073709551615"},
                  "invalid TPC list '50-53:18446744073709551615': stride 18446744073709551615 is larger than 4095"},
        BadSyntax{"GpcList", {"-g", "1-"}, "invalid GPC list '1-': range without an end"},
        BadSyntax{"PositionalMask", {"0xzz"}, "invalid TPC mask '0xzz': 'z' is not a hex digit"},
        BadSyntax{"Physical", {"--physical", "0x"}, "invalid physical mask '0x': no digits"},
        BadSyntax{"SecondDevice", {"-d", "0", "-t", "0-3", "-d", "1", "-t", "x"},
                  "invalid TPC list 'x': 'x' is not a number or range"},
        BadSyntax{"MaskAfterDevice", {"-d", "1", "0x1g"}, "invalid TPC mask '0x1g': 'g' is not a hex digit"},
        BadSyntax{"ControlCharacters", {"-t", "1\n2"}, "invalid TPC list '1\\x0a2': unexpected '\\x0a2'"}),
    [](const auto& info) { return info.param.name; });

TEST_F(E2E, PidModeChecksSyntaxFirstToo) {
  env_["NVTASKSET_REAL_LIBCUDA"] = path("no-such-libcuda.so.1");
  // PID 1 exists and is not under nvtaskset: the list is still the error.
  Result r = run({kCli, "-p", "-t", "0-3:0", "1"});
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_EQ(r.err, "nvtaskset: invalid TPC list '0-3:0': stride must be at least 1\n") << r;
  r = run({kCli, "-p", "0xzz", "1"});
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_EQ(r.err, "nvtaskset: invalid TPC mask '0xzz': 'z' is not a hex digit\n") << r;
  // Control: with good syntax, the PID is the error.
  r = run({kCli, "-p", "-t", "0-3", "1"});
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_EQ(r.err, "nvtaskset: pid 1 is not running under nvtaskset\n") << r;
}

// -p, --status, --verify, --topology, --calibrate and --system-wide each
// choose what the command line does: two of them are refused, none ignored.
TEST_F(E2E, ModesExcludeEachOther) {
  env_["NVTASKSET_REAL_LIBCUDA"] = path("no-such-libcuda.so.1");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {{"--topology", "--calibrate"}, "--topology and --calibrate exclude each other"},
      {{"--calibrate", "-p", "1"}, "-p and --calibrate exclude each other"},
      {{"--system-wide", "status", "--status"}, "--status and --system-wide exclude each other"},
      {{"--status", "--verify"}, "--verify takes only -d, --seed and --topology-file"},
      {{"--verify", "-p", "1"}, "--verify takes only -d, --seed and --topology-file"},
      {{"--status", "-p", "1"}, "--status takes no list, PID or command"},
  };
  for (const auto& [args, error] : cases) {
    std::vector<std::string> argv{kCli};
    argv.insert(argv.end(), args.begin(), args.end());
    const Result r = run(argv);
    EXPECT_TRUE(FailedWithOneLine(r)) << r;
    EXPECT_EQ(r.err, "nvtaskset: " + error + "\n") << r;
  }
}

TEST_F(E2E, OverlongListIsRefusedAtOnce) {
  std::string huge;
  while (huge.size() < 120 * 1024) huge += "0-4095:3,";
  huge += "0";
  const std::string marker = path("marker");
  const auto t0 = std::chrono::steady_clock::now();
  const Result r = run({kCli, "--no-mps", "-t", huge, "touch", marker});
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_TRUE(FailedWithOneLine(r));
  EXPECT_NE(r.err.find("longer than 4096 characters"), std::string::npos) << r;
  EXPECT_LT(r.err.size(), 200u) << r;
  EXPECT_LT(elapsed, 3s) << "took 4-60 s before the bound";
  EXPECT_FALSE(exists(marker));
}

// --- NVTASKSET_LOG -------------------------------------------------------------------------------

TEST_F(E2E, LogLevelIsCaseInsensitiveAndUnknownLevelsWarn) {
  // `true` is no CUDA program, so only the CLI logs here.
  Env env = env_;
  env["NVTASKSET_LOG"] = "bogus";
  Result r = run({kCli, "--no-mps", "-t", "0-3", "true"}, env);
  EXPECT_TRUE(ExitedWith(r, 0));
  EXPECT_EQ(r.err,
            "nvtaskset: warning: NVTASKSET_LOG=bogus: unknown level (trace, debug, info, warn, error, off); using warn\n")
      << r;

  env["NVTASKSET_LOG"] = "DEBUG";  // spdlog's from_str turned this into "off"
  r = run({kCli, "--no-mps", "-t", "0-3", "true"}, env);
  EXPECT_TRUE(ExitedWith(r, 0));
  EXPECT_NE(r.err.find("nvtaskset: debug: CUDA driver: " + kFake + "\n"), std::string::npos) << r;

  env["NVTASKSET_LOG"] = "Warn";
  r = run({kCli, "--no-mps", "-t", "0-3", "true"}, env);
  EXPECT_TRUE(ExitedWith(r, 0));
  EXPECT_EQ(r.err, "") << r;

  // Unknown means warn, not off: a warning still reaches the user.
  env["NVTASKSET_LOG"] = "INFOO";
  env["FAKECUDA_CC"] = "9.0";  // a Hopper without a known layout: the physical mask warning
  r = run({kCli, "--no-mps", "--physical", "0xf", "true"}, env);
  EXPECT_TRUE(ExitedWith(r, 0));
  EXPECT_EQ(lines_of(r.err).size(), 2u) << r;
  EXPECT_NE(r.err.find("NVTASKSET_LOG=INFOO: unknown level"), std::string::npos) << r;
}

}  // namespace
