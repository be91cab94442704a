// lazyrag-cli COMMAND [ARGS...]: operator tools. Each command is a function taking the
// arguments from the command name on.
#include <cstring>
#include <iostream>

#include "cli/generate_command.h"
#include "cli/kv_command.h"

namespace {

struct Command {
  const char* name;
  int (*run)(int argc, char** argv);
  const char* summary;
};

constexpr Command kCommands[] = {
    {"generate", lazyrag::RunGenerateCommand, "run a RAG request (offline; --help for flags)"},
    {"kv", lazyrag::cli::RunKvCommand, "put|get|stat|delete values in the kvstore"},
};

int Usage() {
  std::cerr << "usage: lazyrag-cli COMMAND [ARGS...]\ncommands:\n";
  for (const Command& c : kCommands) std::cerr << "  " << c.name << "  " << c.summary << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage();
  for (const Command& c : kCommands) {
    if (std::strcmp(argv[1], c.name) == 0) return c.run(argc - 1, argv + 1);
  }
  std::cerr << "lazyrag-cli: unknown command '" << argv[1] << "'\n";
  return Usage();
}
