#include "common/auth.h"

#include <openssl/crypto.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/metrics.h"

namespace lazyrag {
namespace {

constexpr size_t kMinTokenBytes = 16;
constexpr absl::string_view kCertificatePrefix = "x509:";
constexpr size_t kMaxCertificateNameBytes = 255;
constexpr size_t kMaxTokenBytes = 512;
constexpr size_t kMaxTenantBytes = 64;

// absl here is built with its own string_view, not std's.
absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }
std::string_view Std(absl::string_view s) { return std::string_view(s.data(), s.size()); }

bool ValidToken(std::string_view t) {
  if (t.size() < kMinTokenBytes || t.size() > kMaxTokenBytes) return false;
  for (char c : t) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

bool ValidTenant(std::string_view t) {
  if (t.empty() || t.size() > kMaxTenantBytes) return false;
  for (char c : t) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '.' && c != '-') return false;
  }
  return true;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot read"));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Modification time (ns), size and inode of `path`; size -1 when it cannot be stat'ed.
struct Stamp {
  int64_t mtime_ns = 0;
  int64_t size = -1;
  uint64_t inode = 0;
};
Stamp StampOf(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return {};
  return {int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec, int64_t(st.st_size),
          uint64_t(st.st_ino)};
}

}  // namespace

const char* RoleName(Role role) { return role == Role::kWorker ? "worker" : "client"; }

namespace {
constexpr char kFailuresName[] = "lazyrag_auth_failures_total";
constexpr char kFailuresHelp[] =
    "Calls refused by authentication (gRPC and HTTP), by reason: unauthenticated (no or an "
    "unknown bearer token) or permission_denied (a client token on a worker-only service)";
constexpr char kReloadsName[] = "lazyrag_auth_token_reloads_total";
constexpr char kReloadsHelp[] =
    "Rereads of --auth_tokens_file after it changed: ok, or error (unreadable or malformed; the "
    "previous tokens stay)";
}  // namespace

AuthMetrics::AuthMetrics(metrics::Registry* registry)
    : unauthenticated_(
          registry->AddCounter(kFailuresName, kFailuresHelp).Add({{"reason", "unauthenticated"}})),
      permission_denied_(registry->AddCounter(kFailuresName, kFailuresHelp)
                             .Add({{"reason", "permission_denied"}})),
      reloads_ok_(registry->AddCounter(kReloadsName, kReloadsHelp).Add({{"result", "ok"}})),
      reloads_failed_(registry->AddCounter(kReloadsName, kReloadsHelp).Add({{"result", "error"}})) {
}

void AuthMetrics::CountRefusal(const absl::Status& refusal) {
  if (absl::IsUnauthenticated(refusal)) {
    unauthenticated_.Increment();
  } else if (absl::IsPermissionDenied(refusal)) {
    permission_denied_.Increment();
  }
}

void AuthMetrics::CountReload(bool ok) { (ok ? reloads_ok_ : reloads_failed_).Increment(); }

double AuthMetrics::unauthenticated() const { return unauthenticated_.Value(); }
double AuthMetrics::permission_denied() const { return permission_denied_.Value(); }
double AuthMetrics::reloads_ok() const { return reloads_ok_.Value(); }
double AuthMetrics::reloads_failed() const { return reloads_failed_.Value(); }

absl::StatusOr<std::vector<TokenEntry>> ParseTokensFile(std::string_view text,
                                                        std::string_view source) {
  std::vector<TokenEntry> out;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(Absl(text), '\n')) {
    ++line_number;
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    const std::string where = absl::StrCat(Absl(source), " line ", line_number, ": ");
    if (fields.size() != 3) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "want 'TOKEN TENANT ROLE', got ", fields.size(), " fields"));
    }
    TokenEntry e;
    if (absl::StartsWith(fields[0], kCertificatePrefix)) {
      const absl::string_view name = fields[0].substr(kCertificatePrefix.size());
      if (name.empty() || name.size() > kMaxCertificateNameBytes ||
          !absl::c_all_of(name, [](char c) { return c > ' ' && c <= '~'; })) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "a certificate name (x509:NAME) is 1 to ", kMaxCertificateNameBytes,
                         " printable ASCII characters without spaces"));
      }
      e.certificate_name = std::string(name);
    } else if (!ValidToken(Std(fields[0]))) {
      return absl::InvalidArgumentError(absl::StrCat(where, "a token is ", kMinTokenBytes, " to ",
                                                     kMaxTokenBytes,
                                                     " printable ASCII characters without spaces"));
    }
    if (!ValidTenant(Std(fields[1]))) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "tenant '", fields[1], "' is not 1 to 64 of [A-Za-z0-9_.-]"));
    }
    if (fields[2] == "client") {
      e.role = Role::kClient;
    } else if (fields[2] == "worker") {
      e.role = Role::kWorker;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "role '", fields[2], "' is not client or worker"));
    }
    if (e.certificate_name.empty()) e.token_digest = Sha256Of(Std(fields[0]));
    e.tenant = std::string(fields[1]);
    for (const TokenEntry& seen : out) {
      if (!e.certificate_name.empty() && seen.certificate_name == e.certificate_name) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "the certificate name is listed twice"));
      }
      if (e.certificate_name.empty() && seen.certificate_name.empty() &&
          seen.token_digest == e.token_digest) {
        return absl::InvalidArgumentError(absl::StrCat(where, "the token is listed twice"));
      }
    }
    out.push_back(std::move(e));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<TokenStore>> TokenStore::Open(std::string path, absl::Duration poll,
                                                             AuthMetrics* metrics) {
  std::unique_ptr<TokenStore> store(new TokenStore(std::move(path), poll, metrics));
  absl::MutexLock lock(&store->mu_);
  if (absl::Status st = store->Load(); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--auth_tokens_file ", st.message()));
  }
  store->next_check_ns_ = absl::ToUnixNanos(absl::Now() + poll);
  return store;
}

absl::Status TokenStore::Load() {
  const Stamp before = StampOf(path_);
  auto text = ReadWholeFile(path_);
  if (!text.ok()) return text.status();
  auto entries = ParseTokensFile(*text, path_);
  if (!entries.ok()) return entries.status();
  entries_ = std::move(*entries);
  stamp_ = {before.mtime_ns, before.size, before.inode};
  return absl::OkStatus();
}

void TokenStore::MaybeReload() {
  const int64_t now_ns = absl::GetCurrentTimeNanos();
  if (now_ns < next_check_ns_.load(std::memory_order_relaxed)) return;
  absl::MutexLock lock(&mu_);
  if (now_ns < next_check_ns_.load(std::memory_order_relaxed)) return;  // another thread did
  next_check_ns_ = absl::ToUnixNanos(absl::FromUnixNanos(now_ns) + poll_);
  const Stamp s = StampOf(path_);
  if (FileStamp{s.mtime_ns, s.size, s.inode} == stamp_) return;
  if (absl::Status st = Load(); !st.ok()) {
    LOG_WARNING << "auth tokens file not reloaded, keeping the previous tokens: " << st;
    stamp_ = {s.mtime_ns, s.size, s.inode};  // warn once per change
    if (metrics_ != nullptr) metrics_->CountReload(false);
    return;
  }
  ++reloads_;
  if (metrics_ != nullptr) metrics_->CountReload(true);
  const auto certificates = absl::c_count_if(
      entries_, [](const TokenEntry& e) { return !e.certificate_name.empty(); });
  LOG_INFO << "auth tokens file reloaded: " << entries_.size() - certificates << " tokens, "
           << certificates << " certificate names";
}

void TokenStore::ReloadIfChanged() {
  next_check_ns_ = std::numeric_limits<int64_t>::min();
  MaybeReload();
}

int TokenStore::reloads() const {
  absl::MutexLock lock(&mu_);
  return reloads_;
}

absl::StatusOr<Identity> TokenStore::Authenticate(
    std::optional<std::string_view> bearer_token, Role required,
    std::optional<std::string_view> certificate_name) {
  absl::StatusOr<Identity> id = Lookup(bearer_token, required, certificate_name);
  if (!id.ok() && metrics_ != nullptr) metrics_->CountRefusal(id.status());
  return id;
}

absl::StatusOr<Identity> TokenStore::Lookup(std::optional<std::string_view> bearer_token,
                                            Role required,
                                            std::optional<std::string_view> certificate_name) {
  const bool has_token = bearer_token.has_value() && !bearer_token->empty();
  const bool has_certificate = certificate_name.has_value() && !certificate_name->empty();
  if (!has_token && !has_certificate) {
    return absl::UnauthenticatedError(
        "missing bearer token (Authorization: Bearer TOKEN) or listed client certificate");
  }
  MaybeReload();
  absl::ReaderMutexLock lock(&mu_);
  const TokenEntry* found = nullptr;
  if (has_token) {
    const Digest256 digest = Sha256Of(*bearer_token);
    // Every token entry is compared, in constant time each, whatever matched.
    for (const TokenEntry& e : entries_) {
      if (e.certificate_name.empty() &&
          CRYPTO_memcmp(e.token_digest.data(), digest.data(), digest.size()) == 0) {
        found = &e;
      }
    }
    if (found == nullptr) return absl::UnauthenticatedError("unknown bearer token");
  } else {
    // Certificate names are not secrets: the handshake proved the caller holds the key.
    for (const TokenEntry& e : entries_) {
      if (!e.certificate_name.empty() && e.certificate_name == *certificate_name) found = &e;
    }
    if (found == nullptr) {
      return absl::UnauthenticatedError(
          absl::StrCat("no bearer token, and the client certificate '", Absl(*certificate_name),
                       "' is not listed (x509:NAME)"));
    }
  }
  Identity id{true, found->tenant, found->role};
  if (!id.Allows(required)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "this service takes ", RoleName(required), " identities only; the ",
        has_token ? "token" : "client certificate", " is a ", RoleName(id.role), "'s"));
  }
  return id;
}

std::optional<std::string_view> BearerTokenOf(std::string_view header) {
  constexpr std::string_view kScheme = "bearer ";
  if (header.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(Absl(header.substr(0, kScheme.size())), Absl(kScheme))) {
    return std::nullopt;
  }
  std::string_view token = Std(absl::StripAsciiWhitespace(Absl(header.substr(kScheme.size()))));
  if (token.empty()) return std::nullopt;
  return token;
}

absl::StatusOr<std::shared_ptr<BearerToken>> BearerToken::FromFile(std::string path) {
  std::shared_ptr<BearerToken> t(new BearerToken(std::move(path)));
  t->Get();
  absl::MutexLock lock(&t->mu_);
  if (t->token_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth_token_file ", t->path_, ": cannot read it or it holds no token"));
  }
  return t;
}

std::shared_ptr<BearerToken> BearerToken::Fixed(std::string token) {
  std::shared_ptr<BearerToken> t(new BearerToken(""));
  absl::MutexLock lock(&t->mu_);
  t->SetLocked(std::move(token));
  return t;
}

std::string BearerToken::Get() {
  absl::MutexLock lock(&mu_);
  RefreshLocked();
  return token_;
}

std::string BearerToken::Header() {
  absl::MutexLock lock(&mu_);
  RefreshLocked();
  return header_;
}

void BearerToken::SetLocked(std::string token) {
  token_ = std::move(token);
  header_ = absl::StrCat("Bearer ", token_);
}

void BearerToken::RefreshLocked() {
  if (path_.empty()) return;
  const absl::Time now = absl::Now();
  if (now < next_check_) return;
  next_check_ = now + absl::Seconds(1);
  const Stamp s = StampOf(path_);
  if (s.size < 0 || s.mtime_ns == mtime_ns_) return;
  auto text = ReadWholeFile(path_);
  if (!text.ok()) return;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    SetLocked(std::string(line));
    mtime_ns_ = s.mtime_ns;
    break;
  }
}

absl::Status ValidateNamespacePolicy(const NamespacePolicy& policy) {
  for (const std::string& ns : policy.public_namespaces) {
    if (ns.empty() || ns.find('/') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--public_namespaces: '", ns, "' is not a namespace name (non-empty, without '/')"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> EffectiveNamespace(const Identity& caller, const std::string& requested,
                                               const NamespacePolicy& policy) {
  if (!caller.authenticated || caller.role == Role::kWorker) return requested;
  for (const std::string& p : policy.public_namespaces) {
    if (requested == p) return requested;
  }
  return absl::StrCat(caller.tenant, "/", requested);
}

bool NamespaceVisibleTo(const Identity& caller, const std::string& ns,
                        const NamespacePolicy& policy) {
  if (!caller.authenticated || caller.role == Role::kWorker) return true;
  if (absl::StartsWith(ns, absl::StrCat(caller.tenant, "/"))) return true;
  for (const std::string& p : policy.public_namespaces) {
    if (ns == p) return true;
  }
  return false;
}

}  // namespace lazyrag
