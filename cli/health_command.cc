#include "cli/health_command.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/tls.h"

namespace lazyrag::cli {
namespace {

constexpr char kUsage[] =
    "usage: lazyrag-cli health --target HOST:PORT [--service NAME] [--timeout_s S]\n"
    "         [--tls_ca F [--tls_cert F --tls_key F]] [--tls_server_name NAME]\n"
    "  One grpc.health.v1.Health/Check call. Exit 0 when SERVING, 1 otherwise, 2 on bad usage.\n"
    "  --tls_ca alone: TLS with a verified server and no client certificate; with --tls_cert and\n"
    "  --tls_key the client presents its certificate too. --tls_server_name: the name the\n"
    "  server's certificate is checked against (default: the target's host).\n";

// Every flag the command takes (tests/deploy/chart_check.py checks the chart's probe commands
// against this list).
constexpr const char* kHealthFlags[] = {"target",   "service", "timeout_s",      "tls_ca",
                                        "tls_cert", "tls_key", "tls_server_name"};

int Usage(const std::string& error) {
  if (!error.empty()) std::cerr << "lazyrag-cli health: " << error << "\n";
  std::cerr << kUsage;
  return 2;
}

// grpc.health.v1.HealthCheckRequest{service}: field 1, length-delimited.
std::string EncodeRequest(const std::string& service) {
  if (service.empty()) return "";
  std::string out = "\x0a";
  size_t n = service.size();
  while (n >= 0x80) {
    out += static_cast<char>((n & 0x7f) | 0x80);
    n >>= 7;
  }
  out += static_cast<char>(n);
  return out + service;
}

// grpc.health.v1.HealthCheckResponse.status (field 1, varint); -1 when unreadable. Other fields
// are not expected (the message has one field).
int DecodeStatus(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  if (bytes.empty()) return 0;  // UNKNOWN, the default value, is not sent
  if (bytes[0] != '\x08') return -1;
  int value = 0, shift = 0;
  for (size_t i = 1; i < bytes.size() && shift < 28; ++i, shift += 7) {
    value |= (static_cast<unsigned char>(bytes[i]) & 0x7f) << shift;
    if ((static_cast<unsigned char>(bytes[i]) & 0x80) == 0) return value;
  }
  return -1;
}

const char* StatusName(int status) {
  switch (status) {
    case 0:
      return "UNKNOWN";
    case 1:
      return "SERVING";
    case 2:
      return "NOT_SERVING";
    case 3:
      return "SERVICE_UNKNOWN";
  }
  return "unreadable reply";
}

}  // namespace

int RunHealthCommand(int argc, char** argv) {
  std::string target, service, server_name;
  TlsFiles tls;
  double timeout_s = 2;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    }
    std::string value;
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0) return Usage("unexpected argument '" + arg + "'");
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return Usage(arg + " needs a value");
    }
    if (std::find(std::begin(kHealthFlags), std::end(kHealthFlags), arg.substr(2)) ==
        std::end(kHealthFlags)) {
      return Usage("unknown flag " + arg);
    }
    if (arg == "--target") {
      target = value;
    } else if (arg == "--service") {
      service = value;
    } else if (arg == "--tls_ca") {
      tls.ca_file = value;
    } else if (arg == "--tls_cert") {
      tls.cert_file = value;
    } else if (arg == "--tls_key") {
      tls.key_file = value;
    } else if (arg == "--tls_server_name") {
      server_name = value;
    } else if (arg == "--timeout_s") {
      if (!absl::SimpleAtod(value, &timeout_s) || !(timeout_s > 0) || timeout_s > 3600) {
        return Usage("--timeout_s must be a number of seconds in (0, 3600]");
      }
    } else {
      return Usage("unknown flag " + arg);
    }
  }
  if (target.empty()) return Usage("--target is required");
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return Usage("--tls_cert and --tls_key go together");
  }
  if (!tls.cert_file.empty() && tls.ca_file.empty()) return Usage("--tls_cert needs --tls_ca");

  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (tls.cert_file.empty() && !tls.ca_file.empty()) {
    // Server verification only: a CA bundle, no client certificate.
    grpc::SslCredentialsOptions o;
    std::ifstream in(tls.ca_file);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in || ss.str().empty()) {
      std::cerr << "lazyrag-cli health: cannot read --tls_ca " << tls.ca_file << "\n";
      return 1;
    }
    o.pem_root_certs = ss.str();
    creds = grpc::SslCredentials(o);
  } else {
    auto c = ChannelCredentialsFor(tls);
    if (!c.ok()) {
      std::cerr << "lazyrag-cli health: " << c.status().message() << "\n";
      return 1;
    }
    creds = *c;
  }
  grpc::ChannelArguments args;
  if (!server_name.empty()) args.SetSslTargetNameOverride(server_name);
  auto channel = grpc::CreateCustomChannel(target, creds, args);
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(timeout_s)));
  const std::string request_bytes = EncodeRequest(service);
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) {
    std::cerr << "lazyrag-cli health: " << target << ": " << status.error_message() << " (code "
              << status.error_code() << ")\n";
    return 1;
  }
  const int serving = DecodeStatus(response);
  if (serving != 1) {
    std::cerr << "lazyrag-cli health: " << target << ": " << StatusName(serving) << "\n";
    return 1;
  }
  std::cout << "SERVING\n";
  return 0;
}

}  // namespace lazyrag::cli
