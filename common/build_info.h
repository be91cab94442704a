// What a lazyrag binary was built from: the project version (CMake's project(VERSION)) and the
// git commit of the source tree when CMake configured the build ("unknown" outside a git
// checkout). Both are fixed at build time.
#pragma once

#include <string>
#include <string_view>

namespace lazyrag {

std::string_view BuildVersion();  // "0.1.0"
std::string_view BuildCommit();   // short hash, e.g. "a9de70c", or "unknown"
// "<binary> <version> (<commit>)", the line --version prints.
std::string VersionLine(std::string_view binary);

}  // namespace lazyrag
