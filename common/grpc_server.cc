#include "common/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace lazyrag {

absl::StatusOr<HostPort> ParseHostPort(const std::string& address) {
  HostPort out;
  std::string port_text;
  if (!address.empty() && address[0] == '[') {
    size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return absl::InvalidArgumentError(absl::StrCat("bad address '", address, "'"));
    }
    out.host = address.substr(1, close - 1);
    port_text = address.substr(close + 2);
  } else {
    size_t colon = address.rfind(':');
    if (colon == std::string::npos || address.find(':') != colon) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad address '", address, "': want HOST:PORT or [IPV6]:PORT"));
    }
    out.host = address.substr(0, colon);
    port_text = address.substr(colon + 1);
  }
  if (!absl::SimpleAtoi(port_text, &out.port) || out.port < 0 || out.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("bad port in '", address, "'"));
  }
  return out;
}

GrpcServer::GrpcServer(GrpcServerOptions options) : options_(std::move(options)) {}

GrpcServer::~GrpcServer() { Shutdown(absl::Now()); }

void GrpcServer::AddService(grpc::Service* service) { services_.push_back(service); }

absl::Status GrpcServer::Start() {
  if (server_ != nullptr) return absl::FailedPreconditionError("server already started");
  auto parsed = ParseHostPort(options_.listen);
  if (!parsed.ok()) return parsed.status();
  bound_ = *parsed;
  std::string host = bound_.host.empty() ? "0.0.0.0" : bound_.host;
  if (host.find(':') != std::string::npos) host = absl::StrCat("[", host, "]");

  // Both are process-wide switches read when a server is built.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  grpc::ServerBuilder builder;
  int selected_port = 0;
  builder.AddListeningPort(absl::StrCat(host, ":", bound_.port),
                           options_.credentials != nullptr ? options_.credentials
                                                           : grpc::InsecureServerCredentials(),
                           &selected_port);
  builder.SetMaxReceiveMessageSize(options_.max_receive_message_bytes);
  builder.SetMaxSendMessageSize(options_.max_send_message_bytes);
  for (grpc::Service* service : services_) builder.RegisterService(service);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || selected_port == 0) {
    server_.reset();
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.listen));
  }
  port_ = selected_port;
  if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(true);
  return absl::OkStatus();
}

std::string GrpcServer::address() const {
  std::string host = bound_.host.empty() ? "0.0.0.0" : bound_.host;
  if (host.find(':') != std::string::npos) host = absl::StrCat("[", host, "]");
  return absl::StrCat(host, ":", port_);
}

void GrpcServer::Shutdown(absl::Time deadline) {
  if (server_ == nullptr) return;
  if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(false);
  server_->Shutdown(absl::ToChronoTime(deadline));
  server_->Wait();
  server_.reset();
}

}  // namespace lazyrag
