// `lazyrag-cli generate`: runs a RAG request offline (model loaded in-process).
#pragma once

namespace lazyrag {

// argv[0] is "generate". Returns the process exit code; errors go to stderr.
int RunGenerateCommand(int argc, char** argv);

}  // namespace lazyrag
