// The memc executable: the command line of tools/memc.cc (../shared/CLI.md).
#include "tools/commands.h"

int main(int argc, char** argv) { return memc::cli::run_cli(argc, argv); }
