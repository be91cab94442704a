#include "common/auth_flags.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"

ABSL_FLAG(std::string, auth_tokens_file, "",
          "file of 'TOKEN TENANT ROLE' lines (role client or worker; common/auth.h) that callers'"
          " 'authorization: Bearer TOKEN' is checked against on every gRPC and HTTP port, reread"
          " when it changes; empty: no authentication (loopback and development only)");
ABSL_FLAG(std::string, auth_token_file, "",
          "file holding this process's own worker token, sent to the kvstore, peer workers and"
          " (router) workers; empty: none");
ABSL_FLAG(std::string, public_namespaces, "",
          "comma-separated cache namespaces (without '/') that every tenant shares; a client's"
          " other namespaces live inside its tenant's");

namespace lazyrag {

AuthFiles AuthFilesFromFlags() {
  AuthFiles a;
  a.tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  a.token_file = absl::GetFlag(FLAGS_auth_token_file);
  for (absl::string_view ns :
       absl::StrSplit(absl::GetFlag(FLAGS_public_namespaces), ',', absl::SkipWhitespace())) {
    a.namespaces.public_namespaces.emplace_back(ns);
  }
  return a;
}

absl::StatusOr<std::unique_ptr<TokenStore>> OpenTokenStore(const std::string& file,
                                                           AuthMetrics* metrics) {
  if (file.empty()) return std::unique_ptr<TokenStore>();
  return TokenStore::Open(file, absl::Seconds(1), metrics);
}

absl::StatusOr<std::shared_ptr<BearerToken>> OpenBearerToken(const std::string& file) {
  if (file.empty()) return std::shared_ptr<BearerToken>();
  return BearerToken::FromFile(file);
}

}  // namespace lazyrag
