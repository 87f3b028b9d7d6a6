// SPDX-License-Identifier: Apache-2.0
#include "nvtaskset/cli.hpp"

int main(int argc, char** argv) { return nvtaskset::cli::run(argc, argv); }
