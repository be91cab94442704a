// gRPC side of common/auth.h: the one check every lazyrag service method runs on its call's
// "authorization: Bearer TOKEN" metadata, and channels that send a process's own token on every
// call.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/channel_arguments.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/auth.h"

namespace lazyrag {

// The caller of `context`. `tokens` null (authentication off): Identity{} (accepted).
// Otherwise as TokenStore::Authenticate: UNAUTHENTICATED without a known token,
// PERMISSION_DENIED when its role may not make calls that need `required`.
absl::StatusOr<Identity> AuthenticateCall(TokenStore* tokens, const grpc::ServerContext& context,
                                          Role required);

// A channel to a lazyrag server that adds "authorization: Bearer <token->Get()>" to every call
// (`token` null: nothing added). The token is sent in the clear over plaintext channels: use TLS
// between hosts. Through a client interceptor, which costs every call an extra completion-queue
// round trip per batch of operations: a client that makes many small calls adds the token to
// each context itself (AddBearerToken) on a channel without one.
std::shared_ptr<grpc::Channel> CreateServiceChannel(
    const std::string& address, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    const grpc::ChannelArguments& args, std::shared_ptr<BearerToken> token);

// Adds "authorization: Bearer <token->Get()>" to the call of `context` (`token` null: nothing).
// REQUIRES: the call has not started.
void AddBearerToken(grpc::ClientContext& context, BearerToken* token);

}  // namespace lazyrag
