#include "common/binary_flags.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/debugging/failure_signal_handler.h"
#include "absl/debugging/symbolize.h"
#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/build_info.h"
#include "common/metrics.h"
#include "common/logging.h"

ABSL_FLAG(std::string, log_level, "info",
          "debug | info | warning | error: the least severe messages logged (left at info: "
          "$LAZYRAG_LOG_LEVEL when set)");
ABSL_FLAG(std::string, log_format, "text",
          "text | json: one line per message, json: one object per line (ts, level, src, msg "
          "and the message's fields)");

namespace lazyrag {
namespace {

// Flag definitions record __FILE__, which is absolute or relative to the build directory
// ("../worker/main.cc" with ccache's base_dir): keep the path from the source root on.
std::string NormalizeFlagFile(absl::string_view file) {
  while (absl::ConsumePrefix(&file, "../") || absl::ConsumePrefix(&file, "./")) {
  }
#ifdef LAZYRAG_SOURCE_DIR
  absl::ConsumePrefix(&file, LAZYRAG_SOURCE_DIR "/");
#endif
  return std::string(file);
}

// absl's own flags (--flagfile, --fromenv, --help...) are shown by --helpfull only.
bool IsLazyragFlagFile(absl::string_view file) { return !absl::StrContains(file, "absl/"); }

enum class Early { kNone, kHelp, kHelpFull, kVersion };

Early EarlyFlag(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--") break;
    if (a == "--help" || a == "-help" || a == "-h") return Early::kHelp;
    if (a == "--helpfull" || a == "-helpfull") return Early::kHelpFull;
    if (a == "--version" || a == "-version") return Early::kVersion;
  }
  return Early::kNone;
}

}  // namespace

std::string FlagsHelp(bool all) {
  // file -> name -> flag, both sorted.
  std::map<std::string, std::map<std::string, const absl::CommandLineFlag*>> by_file;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (flag->IsRetired()) continue;
    std::string file = NormalizeFlagFile(flag->Filename());
    if (!all && !IsLazyragFlagFile(file)) continue;
    by_file[file][std::string(name)] = flag;
  }
  // The binary's own flags (its main.cc) first, then the shared ones.
  std::vector<const std::string*> files;
  for (const auto& entry : by_file) files.push_back(&entry.first);
  std::stable_partition(files.begin(), files.end(),
                        [](const std::string* f) { return absl::EndsWith(*f, "main.cc"); });
  std::string out;
  for (const std::string* file_name : files) {
    const std::string& file = *file_name;
    const auto& flags = by_file[file];
    absl::StrAppend(&out, "\n  Flags from ", file, ":\n");
    for (const auto& [name, flag] : flags) {
      absl::StrAppend(&out, "    --", name, " (default \"", flag->DefaultValue(), "\")\n      ",
                      flag->Help(), "\n");
    }
  }
  return out;
}

BinaryCommandLine ParseBinaryCommandLine(int argc, char** argv, const std::string& binary,
                                         const std::string& usage) {
  // A crash (SIGSEGV, SIGBUS, SIGABRT, ...) prints its signal and a symbolized stack on stderr
  // before the default action; RunServerUntilSignal later takes SIGINT and SIGTERM back.
  absl::InitializeSymbolizer(argv[0]);
  absl::InstallFailureSignalHandler(absl::FailureSignalHandlerOptions());
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  config.contains_helpshort_flags = IsLazyragFlagFile;
  config.contains_help_flags = IsLazyragFlagFile;
  config.contains_helppackage_flags = IsLazyragFlagFile;
  config.normalize_filename = [](absl::string_view f) { return NormalizeFlagFile(f); };
  config.version_string = [binary] { return VersionLine(binary) + "\n"; };
  absl::SetFlagsUsageConfig(config);

  metrics::SetBuildInfo(BuildVersion(), BuildCommit());
  BinaryCommandLine result;
  // absl answers --help with exit code 1 and --version only after parsing every other flag;
  // both are answered here first, with exit code 0.
  switch (EarlyFlag(argc, argv)) {
    case Early::kNone:
      break;
    case Early::kVersion:
      std::cout << VersionLine(binary) << "\n";
      result.exit_code = 0;
      return result;
    case Early::kHelp:
    case Early::kHelpFull:
      std::cout << VersionLine(binary) << "\nusage: " << usage << "\n"
                << FlagsHelp(EarlyFlag(argc, argv) == Early::kHelpFull) << std::flush;
      result.exit_code = 0;
      return result;
  }

  result.positional = absl::ParseCommandLine(argc, argv);

  // --log_level: $LAZYRAG_LOG_LEVEL (read by common/logging) stays when the flag holds its
  // default (absl does not say whether a flag was given, only its value).
  const absl::CommandLineFlag* level_flag = absl::FindCommandLineFlag("log_level");
  const bool level_default =
      level_flag != nullptr && level_flag->CurrentValue() == level_flag->DefaultValue();
  if (!level_default || std::getenv("LAZYRAG_LOG_LEVEL") == nullptr) {
    auto level = ParseLogLevel(absl::GetFlag(FLAGS_log_level));
    if (!level.ok()) {
      std::cerr << binary << ": --log_level: " << level.status().message() << "\n";
      result.exit_code = 2;
      return result;
    }
    SetMinLogLevel(*level);
  }
  auto format = ParseLogFormat(absl::GetFlag(FLAGS_log_format));
  if (!format.ok()) {
    std::cerr << binary << ": --log_format: " << format.status().message() << "\n";
    result.exit_code = 2;
    return result;
  }
  SetLogFormat(*format);
  return result;
}

}  // namespace lazyrag
