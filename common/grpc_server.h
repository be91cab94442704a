// gRPC server scaffolding shared by kvstore, worker and router: binds HOST:PORT (port 0 picks
// a free one), serves the standard health service (grpc.health.v1.Health) and server
// reflection, and shuts down gracefully.
#pragma once

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace grpc {
class Service;
}

namespace lazyrag {

struct GrpcServerOptions {
  // "HOST:PORT", "[IPV6]:PORT" or ":PORT" (all interfaces). Port 0 picks a free port.
  std::string listen = "127.0.0.1:0";
  // Largest message accepted, bytes. Default 16 MiB (services stream bigger payloads).
  int max_receive_message_bytes = 16 << 20;
  // Largest message sent, bytes. Default 16 MiB.
  int max_send_message_bytes = 16 << 20;
  // TLS (common/tls.h: ServerCredentialsFor); null: plaintext.
  std::shared_ptr<grpc::ServerCredentials> credentials;
};

// Splits "HOST:PORT" / "[HOST]:PORT" / ":PORT". INVALID_ARGUMENT when malformed.
struct HostPort {
  std::string host;  // without brackets; empty means all interfaces
  int port = 0;
};
absl::StatusOr<HostPort> ParseHostPort(const std::string& address);

// One lifecycle object per server process: AddService() the adapters, Start(), and later
// Shutdown(deadline). Services are not owned and must outlive Shutdown().
// Thread safety: Start and Shutdown are called from one thread; port() after Start().
class GrpcServer {
 public:
  explicit GrpcServer(GrpcServerOptions options);
  ~GrpcServer();  // Shutdown(now) if still running
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  // REQUIRES: before Start().
  void AddService(grpc::Service* service);

  // Binds and starts serving. UNAVAILABLE when the address cannot be bound.
  absl::Status Start();

  // The bound port and "host:port" (port filled in); valid after Start().
  int port() const { return port_; }
  std::string address() const;

  // Marks the health service NOT_SERVING, stops accepting calls, lets running calls finish
  // until `deadline`, then cancels the rest. Idempotent.
  void Shutdown(absl::Time deadline);

 private:
  const GrpcServerOptions options_;
  std::vector<grpc::Service*> services_;
  std::unique_ptr<grpc::Server> server_;
  HostPort bound_;
  int port_ = 0;
};

}  // namespace lazyrag
