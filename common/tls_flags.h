// --tls_cert, --tls_key and --tls_ca, shared by the server binaries (kvstore, worker, router)
// and the CLI: the files of common/tls.h. Empty (the default): plaintext gRPC.
#pragma once

#include "common/tls.h"

namespace lazyrag {

TlsFiles TlsFilesFromFlags();

}  // namespace lazyrag
