// lazyrag-cli COMMAND [ARGS...]: operator tools. Each command is a function taking the
// arguments from the command name on.
#include <cstring>
#include <iostream>

#include "cli/health_command.h"
#include "common/build_info.h"
#ifdef LAZYRAG_CLI_GENERATE
#include "cli/generate_command.h"
#endif
#ifdef LAZYRAG_CLI_KV
#include "cli/kv_command.h"
#endif

namespace {

struct Command {
  const char* name;
  int (*run)(int argc, char** argv);
  const char* summary;
};

// The commands this build has (the server images build only health; see CMakeLists.txt).
constexpr Command kCommands[] = {
#ifdef LAZYRAG_CLI_GENERATE
    {"generate", lazyrag::RunGenerateCommand, "run a RAG request (offline; --help for flags)"},
#endif
#ifdef LAZYRAG_CLI_KV
    {"kv", lazyrag::cli::RunKvCommand, "put|get|stat|delete values in the kvstore"},
#endif
    {"health", lazyrag::cli::RunHealthCommand,
     "grpc.health.v1 check of a server, plaintext or TLS (exit 0: SERVING)"},
};

// Usage on `out`; returns `exit_code`.
int Usage(std::ostream& out, int exit_code) {
  out << "usage: lazyrag-cli COMMAND [ARGS...] | --version\ncommands:\n";
  for (const Command& c : kCommands) out << "  " << c.name << "  " << c.summary << "\n";
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage(std::cerr, 2);
  if (std::strcmp(argv[1], "--version") == 0) {
    std::cout << lazyrag::VersionLine("lazyrag-cli") << "\n";
    return 0;
  }
  if (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    return Usage(std::cout, 0);
  }
  for (const Command& c : kCommands) {
    if (std::strcmp(argv[1], c.name) == 0) return c.run(argc - 1, argv + 1);
  }
  std::cerr << "lazyrag-cli: unknown command '" << argv[1] << "'\n";
  return Usage(std::cerr, 2);
}
