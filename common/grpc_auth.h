// gRPC side of common/auth.h: the one check every lazyrag service method runs on its call's
// "authorization: Bearer TOKEN" metadata, and the one way a client sends its token.
//
// Contract for clients: every call to a lazyrag server (router -> workers, workers -> kvstore
// shards and peers, lazyrag-cli, tests) calls AddBearerToken on its ClientContext before the call
// starts. Channels carry no token (no client interceptor: one would cost every call an extra
// completion-queue round trip per batch of operations), so a context without it is sent
// unauthenticated. The token is sent in the clear over plaintext channels: use TLS between hosts.
#pragma once

#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>

#include "absl/status/statusor.h"
#include "common/auth.h"

namespace lazyrag {

// The caller of `context`. `tokens` null (authentication off): Identity{} (accepted).
// Otherwise as TokenStore::Authenticate of the call's bearer token or, when it sends none, of
// the subject common name of the client certificate its TLS handshake verified (an `x509:NAME`
// entry): UNAUTHENTICATED without a listed identity, PERMISSION_DENIED when its role may not
// make calls that need `required`.
absl::StatusOr<Identity> AuthenticateCall(TokenStore* tokens, const grpc::ServerContext& context,
                                          Role required);

// Adds "authorization: Bearer <token->Get()>" to the call of `context` (`token` null: nothing,
// for a process without --auth_token_file). The token is read when this is called, so a rotated
// token file reaches later calls (BearerToken rereads it). Call once per context.
// REQUIRES: the call of `context` has not started.
void AddBearerToken(grpc::ClientContext& context, BearerToken* token);

}  // namespace lazyrag
