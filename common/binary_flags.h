// The command line every lazyrag server binary shares (kvstore, worker, router), on top of absl
// flags:
//   --help, --helpfull  list the flags on stdout (--help: lazyrag's own, grouped by the file
//                       that defines them; --helpfull: absl's as well) and exit 0
//   --version           prints "<binary> <version> (<commit>)" (common/build_info.h), exit 0
//   --log_level         debug|info|warning|error (default info; left at info,
//                       $LAZYRAG_LOG_LEVEL when set)
//   --log_format        text|json (common/logging.h)
// The flags --log_level and --log_format are defined in binary_flags.cc (like common/tls_flags).
#pragma once

#include <string>
#include <vector>

namespace lazyrag {

struct BinaryCommandLine {
  // -1: go on and serve; otherwise main returns this code at once (0 after --help or
  // --version, 2 after a bad --log_level or --log_format, with a message on stderr).
  int exit_code = -1;
  std::vector<char*> positional;  // argv[0] and the arguments that are not flags
};

// Installs absl's failure signal handler (a crash prints its stack on stderr), handles
// --help/--helpfull/--version, parses the flags (absl: an unknown flag or a bad value
// prints absl's message and exits 1), then applies --log_level and --log_format.
// `binary` names the program ("lazyrag-worker"); `usage` is its one-line synopsis.
BinaryCommandLine ParseBinaryCommandLine(int argc, char** argv, const std::string& binary,
                                         const std::string& usage);

// The flag list --help prints (exposed for tests). `all`: absl's own flags too.
std::string FlagsHelp(bool all);

}  // namespace lazyrag
