// lazyrag-cli health: one grpc.health.v1.Health/Check call, plaintext or TLS. The Helm chart's
// readiness and startup probes run it (exec) when TLS is on, since the kubelet's own gRPC probe
// cannot speak TLS.
#pragma once

namespace lazyrag::cli {

// argv[0] is "health". Exit status: 0 SERVING, 1 anything else (NOT_SERVING, unreachable,
// TLS failure, deadline), 2 bad usage. One line on stdout (SERVING) or stderr (why not).
int RunHealthCommand(int argc, char** argv);

}  // namespace lazyrag::cli
