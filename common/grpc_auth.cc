#include "common/grpc_auth.h"

#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/auth_context.h>

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
  if (bearer.has_value()) return tokens->Authenticate(bearer, required);
  // No token: the client certificate the handshake verified, if any (plaintext and TLS without
  // a client certificate have no authenticated peer).
  std::optional<std::string> certificate_name;
  if (const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
      auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& cn : auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
      certificate_name = std::string(cn.data(), cn.size());
      break;
    }
  }
  return tokens->Authenticate(std::nullopt, required, certificate_name);
}

void AddBearerToken(grpc::ClientContext& context, BearerToken* token) {
  if (token != nullptr) context.AddMetadata("authorization", token->Header());
}

}  // namespace lazyrag
