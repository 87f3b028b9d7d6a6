#include "nvtaskset/cli.hpp"

int main(int argc, char** argv) { return nvtaskset::cli::run(argc, argv); }
