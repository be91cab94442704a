#include "common/build_info.h"

// Set by common/CMakeLists.txt on lazyrag_build_info only, so a new commit recompiles one file.
#ifndef LAZYRAG_VERSION
#define LAZYRAG_VERSION "0.0.0"
#endif
#ifndef LAZYRAG_GIT_COMMIT
#define LAZYRAG_GIT_COMMIT "unknown"
#endif

namespace lazyrag {

std::string_view BuildVersion() { return LAZYRAG_VERSION; }
std::string_view BuildCommit() { return LAZYRAG_GIT_COMMIT; }

std::string VersionLine(std::string_view binary) {
  std::string line(binary);
  line.append(" ").append(BuildVersion()).append(" (").append(BuildCommit()).append(")");
  return line;
}

}  // namespace lazyrag
