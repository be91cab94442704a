#include "common/tls_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain this process presents (gRPC over TLS); with --tls_key, --tls_ca");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA bundle that peers' certificates are verified against");
ABSL_FLAG(bool, tls_require_client_cert, true,
          "with TLS on, servers refuse clients without a certificate signed by --tls_ca (mTLS)");

namespace lazyrag {

TlsFiles TlsFilesFromFlags() {
  TlsFiles f;
  f.cert_file = absl::GetFlag(FLAGS_tls_cert);
  f.key_file = absl::GetFlag(FLAGS_tls_key);
  f.ca_file = absl::GetFlag(FLAGS_tls_ca);
  f.require_client_cert = absl::GetFlag(FLAGS_tls_require_client_cert);
  return f;
}

}  // namespace lazyrag
