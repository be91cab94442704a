// TLS for every gRPC endpoint (kvstore, worker, router) and the clients between them. Each
// process is given one certificate chain, its key and the CA bundle peers are verified against
// (--tls_cert, --tls_key, --tls_ca; the Helm chart mounts them from one Secret). Servers present
// their certificate and require a client certificate signed by the CA (mTLS; with
// --tls_require_client_cert=false they only verify one when it is offered); clients verify the
// server against the CA and present their own certificate. No files: plaintext, as before.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace grpc {
class ChannelCredentials;
class ServerCredentials;
}  // namespace grpc

namespace lazyrag {

struct TlsFiles {
  std::string cert_file;  // PEM certificate chain
  std::string key_file;   // PEM private key of the chain's first certificate
  std::string ca_file;    // PEM CA bundle
  // Servers: refuse a client that presents no certificate signed by the CA. Default true.
  bool require_client_cert = true;
  bool enabled() const { return !cert_file.empty() || !key_file.empty() || !ca_file.empty(); }
};

// Plaintext credentials when `files` is empty. INVALID_ARGUMENT when only some of the three are
// given (naming the missing flag) or a file cannot be read or is empty.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(const TlsFiles& files);
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFor(
    const TlsFiles& files);

}  // namespace lazyrag
