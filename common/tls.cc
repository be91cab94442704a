#include "common/tls.h"

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace lazyrag {
namespace {

struct TlsPem {
  std::string cert, key, ca;
};

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", path, ": cannot read"));
  std::stringstream s;
  s << in.rdbuf();
  if (s.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", path, ": empty file"));
  }
  return s.str();
}

absl::StatusOr<TlsPem> Load(const TlsFiles& f) {
  for (const auto& [value, flag] : {std::pair{&f.cert_file, "tls_cert"},
                                    std::pair{&f.key_file, "tls_key"},
                                    std::pair{&f.ca_file, "tls_ca"}}) {
    if (value->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("TLS needs --tls_cert, --tls_key and --tls_ca; --", flag, " is missing"));
    }
  }
  TlsPem p;
  auto cert = ReadPem(f.cert_file, "tls_cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(f.key_file, "tls_key");
  if (!key.ok()) return key.status();
  auto ca = ReadPem(f.ca_file, "tls_ca");
  if (!ca.ok()) return ca.status();
  p.cert = std::move(*cert);
  p.key = std::move(*key);
  p.ca = std::move(*ca);
  return p;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const TlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureServerCredentials();
  auto pem = Load(files);
  if (!pem.ok()) return pem.status();
  grpc::SslServerCredentialsOptions o(
      files.require_client_cert ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = pem->ca;
  o.pem_key_cert_pairs.push_back({pem->key, pem->cert});
  return grpc::SslServerCredentials(o);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFor(
    const TlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureChannelCredentials();
  auto pem = Load(files);
  if (!pem.ok()) return pem.status();
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = pem->ca;
  o.pem_private_key = pem->key;
  o.pem_cert_chain = pem->cert;
  return grpc::SslCredentials(o);
}

}  // namespace lazyrag
