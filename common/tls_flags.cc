#include "common/tls_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain this process presents (gRPC over TLS); with --tls_key, --tls_ca");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA bundle that peers' certificates are verified against");

namespace lazyrag {

TlsFiles TlsFilesFromFlags() {
  TlsFiles f;
  f.cert_file = absl::GetFlag(FLAGS_tls_cert);
  f.key_file = absl::GetFlag(FLAGS_tls_key);
  f.ca_file = absl::GetFlag(FLAGS_tls_ca);
  return f;
}

}  // namespace lazyrag
