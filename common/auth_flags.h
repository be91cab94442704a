// --auth_tokens_file, --auth_token_file and --public_namespaces, shared by the server binaries
// (like common/tls_flags.h): the files of common/auth.h.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/auth.h"

namespace lazyrag {

struct AuthFiles {
  // The token file a server checks callers against ("": authentication off).
  std::string tokens_file;
  // The file holding this process's own token, sent to other lazyrag servers ("": none).
  std::string token_file;
  NamespacePolicy namespaces;
};

AuthFiles AuthFilesFromFlags();

// TokenStore::Open of `file` (refusals and reloads counted in `metrics`, if not null), or null
// when `file` is empty.
absl::StatusOr<std::unique_ptr<TokenStore>> OpenTokenStore(const std::string& file,
                                                           AuthMetrics* metrics = nullptr);
// BearerToken::FromFile of `file`, or null when `file` is empty.
absl::StatusOr<std::shared_ptr<BearerToken>> OpenBearerToken(const std::string& file);

}  // namespace lazyrag
