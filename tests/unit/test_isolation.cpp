// Tests that run side by side (ctest -j) must not see each other's control
// regions: a CLI run removes stale regions, and would delete the leftovers
// another test plants on purpose. Each test process takes its own region
// namespace before any test starts; children inherit it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "nvtaskset/control_region.hpp"

namespace {

const bool g_namespace_set = [] {
  const std::string ns = "unit" + std::to_string(::getpid());
  return ::setenv(nvtaskset::ctl::kTestNamespaceEnv, ns.c_str(), 1) == 0;
}();

TEST(TestIsolation, RegionNamesCarryThisProcessNamespace) {
  ASSERT_TRUE(g_namespace_set);
  EXPECT_EQ(nvtaskset::ctl::region_name(42), "nvtaskset-unit" + std::to_string(::getpid()) + ".42");
}

TEST(TestIsolation, MalformedNamespaceIsRefused) {
  const std::string saved = std::getenv(nvtaskset::ctl::kTestNamespaceEnv);
  ::setenv(nvtaskset::ctl::kTestNamespaceEnv, "../etc", 1);
  EXPECT_THROW(nvtaskset::ctl::region_name(42), nvtaskset::ctl::Error);
  ::setenv(nvtaskset::ctl::kTestNamespaceEnv, saved.c_str(), 1);
}

TEST(TestIsolation, DefaultNameWithoutNamespace) {
  const std::string saved = std::getenv(nvtaskset::ctl::kTestNamespaceEnv);
  ::unsetenv(nvtaskset::ctl::kTestNamespaceEnv);
  EXPECT_EQ(nvtaskset::ctl::region_name(42), "nvtaskset.42");
  ::setenv(nvtaskset::ctl::kTestNamespaceEnv, saved.c_str(), 1);
}

}  // namespace
