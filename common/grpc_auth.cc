#include "common/grpc_auth.h"

#include <optional>
#include <string>
#include <string_view>

namespace lazyrag {

absl::StatusOr<Identity> AuthenticateCall(TokenStore* tokens, const grpc::ServerContext& context,
                                          Role required) {
  if (tokens == nullptr) return Identity{};
  std::optional<std::string_view> bearer;
  auto range = context.client_metadata().equal_range("authorization");
  for (auto it = range.first; it != range.second; ++it) {
    bearer = BearerTokenOf(std::string_view(it->second.data(), it->second.size()));
    if (bearer.has_value()) break;
  }
  return tokens->Authenticate(bearer, required);
}

void AddBearerToken(grpc::ClientContext& context, BearerToken* token) {
  if (token != nullptr) context.AddMetadata("authorization", token->Header());
}

}  // namespace lazyrag
