// SPDX-License-Identifier: Apache-2.0
#include <cstring>

#include "nvtaskset/cli.hpp"
#include "nvtaskset/verify.hpp"

int main(int argc, char** argv) {
  // `nvtaskset --verify` runs its probe in a process of this same program
  // (verify.hpp), which must not parse a command line meant for users.
  if (argc > 1 && std::strcmp(argv[1], nvtaskset::cli::verify::kProbeArg) == 0)
    return nvtaskset::cli::verify::probe_main(argc, argv);
  return nvtaskset::cli::run(argc, argv);
}
