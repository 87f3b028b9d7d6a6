// SPDX-License-Identifier: Apache-2.0
// The one table of environment options (options.hpp): choices parse as
// documented, and the man page documents exactly the options meant for users.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "nvtaskset/options.hpp"

using namespace nvtaskset;

TEST(Options, ChoicesParseCaseInsensitivelyWithTheDefaultFirst) {
  const OptionDesc& misfit = option(Option::kOnClusterMisfit);
  EXPECT_EQ(parse_choice(misfit, nullptr).index, 0u);
  EXPECT_EQ(parse_choice(misfit, "").index, 0u);
  EXPECT_EQ(parse_choice(misfit, "abort").index, 0u);
  EXPECT_EQ(parse_choice(misfit, "WIDEN").index, 1u);
  const ChoiceValue bad = parse_choice(misfit, "widened");
  EXPECT_TRUE(bad.unknown);
  EXPECT_EQ(bad.index, 0u);  // unknown means the safe default
  EXPECT_EQ(parse_choice(option(Option::kOnUnsupported), "Warn").index, 1u);
  EXPECT_EQ(parse_choice(option(Option::kLog), "off").index, 5u);
}

TEST(Options, TypedChoicesNameTheirValues) {
  EXPECT_EQ(parse_choice_of<Option::kOnClusterMisfit>(nullptr).value, OnClusterMisfit::kAbort);
  EXPECT_EQ(parse_choice_of<Option::kOnClusterMisfit>("Widen").value, OnClusterMisfit::kWiden);
  EXPECT_EQ(parse_choice_of<Option::kOnUnsupported>("warn").value, OnUnsupported::kWarn);
  EXPECT_EQ(parse_choice_of<Option::kMpsOtherUser>("FAIL").value, MpsOtherUser::kFail);
  EXPECT_EQ(parse_choice_of<Option::kSmCount>("partition").value, SmCount::kPartition);
  const auto bad = parse_choice_of<Option::kSmCount>("half");
  EXPECT_TRUE(bad.unknown);
  EXPECT_EQ(bad.value, SmCount::kDevice);  // unknown means the safe default
  EXPECT_STREQ(bad.text, "half");
  EXPECT_STREQ(choice_name<Option::kMpsOtherUser>(MpsOtherUser::kFail), "fail");
  EXPECT_STREQ(default_choice_name<Option::kOnClusterMisfit>(), "abort");
  static_assert(parse_choice_of<Option::kOnClusterMisfit>("widen").value == OnClusterMisfit::kWiden);
}

TEST(Options, TypedChoicesReadTheEnvironment) {
  const char* name = option(Option::kMpsOtherUser).name;
  ::setenv(name, "fail", 1);
  EXPECT_EQ(choice_of<Option::kMpsOtherUser>().value, MpsOtherUser::kFail);
  ::setenv(name, "", 1);
  EXPECT_EQ(choice_of<Option::kMpsOtherUser>().value, MpsOtherUser::kWait);
  EXPECT_FALSE(choice_of<Option::kMpsOtherUser>().unknown);
  ::unsetenv(name);
  EXPECT_EQ(choice_of<Option::kMpsOtherUser>().value, MpsOtherUser::kWait);
}

TEST(Options, ManPageDocumentsExactlyTheUserOptions) {
  std::ifstream f(std::string(NVTASKSET_TEST_DATA_DIR) + "/../../man/nvtaskset.1");
  ASSERT_TRUE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string man = ss.str();
  const auto a = man.find(".SH ENVIRONMENT\n");
  ASSERT_NE(a, std::string::npos);
  const std::string env = man.substr(a, man.find("\n.SH ", a + 1) - a);
  std::set<std::string> documented;
  const std::regex name("NVTASKSET_[A-Z_]+");
  for (auto it = std::sregex_iterator(env.begin(), env.end(), name); it != std::sregex_iterator(); ++it)
    documented.insert(it->str());
  std::set<std::string> for_users, known;
  for (const OptionDesc& d : kOptions) {
    known.insert(d.name);
    if (d.for_users) for_users.insert(d.name);
  }
  for (const auto& n : for_users) EXPECT_TRUE(documented.count(n)) << n << " is missing from nvtaskset(1)";
  for (const auto& n : documented) EXPECT_TRUE(known.count(n)) << n << " is documented but nvtaskset does not read it";
}
