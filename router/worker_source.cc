#include "router/worker_source.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace lazyrag::router {
namespace {

// "HOST:PORT" or "[V6]:PORT" -> host, port. Host must not be empty.
absl::Status SplitHostPort(absl::string_view address, std::string* host, int* port) {
  absl::string_view port_text;
  if (absl::StartsWith(address, "[")) {
    size_t close = address.find(']');
    if (close == absl::string_view::npos || close + 1 >= address.size() ||
        address[close + 1] != ':') {
      return absl::InvalidArgumentError(absl::StrCat("bad worker address '", std::string(address),
                                                     "': want HOST:PORT or [IPV6]:PORT"));
    }
    *host = std::string(address.substr(1, close - 1));
    port_text = address.substr(close + 2);
  } else {
    size_t colon = address.rfind(':');
    if (colon == absl::string_view::npos || address.find(':') != colon) {
      return absl::InvalidArgumentError(absl::StrCat("bad worker address '", std::string(address),
                                                     "': want HOST:PORT or [IPV6]:PORT"));
    }
    *host = std::string(address.substr(0, colon));
    port_text = address.substr(colon + 1);
  }
  if (host->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad worker address '", std::string(address), "': no host"));
  }
  if (!absl::SimpleAtoi(port_text, port) || *port <= 0 || *port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad port in worker address '", std::string(address), "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ResolveDns(const std::string& name, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  int rc = getaddrinfo(name.c_str(), nullptr, &hints, &result);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve worker name '", name, "': ", gai_strerror(rc)));
  }
  std::vector<std::string> out;
  for (addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    if (ai->ai_family == AF_INET) {
      auto* sin = reinterpret_cast<sockaddr_in*>(ai->ai_addr);
      inet_ntop(AF_INET, &sin->sin_addr, text, sizeof(text));
      out.push_back(absl::StrCat(text, ":", port));
    } else if (ai->ai_family == AF_INET6) {
      auto* sin6 = reinterpret_cast<sockaddr_in6*>(ai->ai_addr);
      inet_ntop(AF_INET6, &sin6->sin6_addr, text, sizeof(text));
      out.push_back(absl::StrCat("[", text, "]:", port));
    }
  }
  freeaddrinfo(result);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  if (out.empty()) {
    return absl::UnavailableError(absl::StrCat("worker name '", name, "' has no addresses"));
  }
  return out;
}

}  // namespace

absl::StatusOr<WorkerSpec> ParseWorkerSpec(const std::string& flag) {
  WorkerSpec spec;
  // Debian's abseil has its own string_view: work in it here.
  absl::string_view text = absl::StripAsciiWhitespace(flag);
  if (text.empty()) return absl::InvalidArgumentError("--workers is empty");
  if (absl::ConsumePrefix(&text, "dns:")) {
    absl::ConsumePrefix(&text, "///");
    std::string host;
    int port = 0;
    if (absl::Status s = SplitHostPort(text, &host, &port); !s.ok()) return s;
    spec.dns_name = host;
    spec.dns_port = port;
    return spec;
  }
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    std::string host;
    int port = 0;
    if (absl::Status s = SplitHostPort(part, &host, &port); !s.ok()) return s;
    spec.addresses.emplace_back(part);
  }
  if (spec.addresses.empty()) return absl::InvalidArgumentError("--workers lists no address");
  std::sort(spec.addresses.begin(), spec.addresses.end());
  spec.addresses.erase(std::unique(spec.addresses.begin(), spec.addresses.end()),
                       spec.addresses.end());
  return spec;
}

WorkerResolver MakeWorkerResolver(WorkerSpec spec) {
  if (!spec.is_dns()) {
    return [addresses = spec.addresses]() -> absl::StatusOr<std::vector<std::string>> {
      return addresses;
    };
  }
  return [name = spec.dns_name, port = spec.dns_port] { return ResolveDns(name, port); };
}

}  // namespace lazyrag::router
