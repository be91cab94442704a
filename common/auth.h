// Authentication and tenancy shared by every lazyrag server (kvstore, worker, router) and their
// clients: bearer tokens read from a file, each naming a tenant and a role, and the cache
// namespace a tenant's request is served in.
//
// Token file (--auth_tokens_file), one token a line, '#' starts a comment, blank lines ignored:
//   TOKEN TENANT ROLE
//   TOKEN   16 to 512 printable ASCII characters without spaces (e.g. `openssl rand -hex 32`)
//   TENANT  1 to 64 of [A-Za-z0-9_.-]; the tenant whose namespace the caller's requests use
//   ROLE    client (Generate, PrepareDocuments, Stats of its own documents) or worker (the
//           cluster's own processes: kvstore and peer calls, a router's calls to workers)
// A line whose first field is `x509:NAME` names a client certificate instead of a token: a TLS
// caller that sends no token and presented a certificate the server verified against its CA
// (common/tls.h) with subject common name NAME is TENANT / ROLE; NAME is 1 to 255 printable
// ASCII characters without spaces. So with mTLS the cluster's own processes need no token (and
// send no header per call), and a certificate the CA signed for anything else is not a worker.
// A token, when sent, decides. A certificate whose name is not listed counts for nothing.
// A malformed line rejects the whole file (INVALID_ARGUMENT naming the line); a duplicate token
// or certificate name too. Tokens are compared as SHA-256 digests with CRYPTO_memcmp against
// every entry, so the time a lookup takes does not depend on how much of a token was right.
//
// No file (the flag empty): authentication is off, every caller is accepted as before (for
// loopback and development only).
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/sha256.h"

namespace lazyrag {
namespace metrics {
class Counter;
class Registry;
}  // namespace metrics

enum class Role { kClient, kWorker };
const char* RoleName(Role role);

// Who is calling, as a server established it.
struct Identity {
  // false: the server has no token file, the caller is unknown and everything is allowed.
  bool authenticated = false;
  std::string tenant;         // "" when not authenticated
  Role role = Role::kClient;  // meaningful when authenticated
  // Whether the caller may do what `required` allows: always without authentication; a worker
  // identity may do everything, a client only client calls.
  bool Allows(Role required) const {
    return !authenticated || role == Role::kWorker || required == Role::kClient;
  }
};

struct TokenEntry {
  Digest256 token_digest;        // SHA-256 of the token; unused for a certificate entry
  std::string certificate_name;  // non-empty: an `x509:NAME` entry, NAME
  std::string tenant;
  Role role = Role::kClient;
};

// A server's refused calls and token-file reloads, as counters on its metrics registry:
//   lazyrag_auth_failures_total{reason="unauthenticated"|"permission_denied"}
//   lazyrag_auth_token_reloads_total{result="ok"|"error"}
// Every series exists at 0 from construction, whether the server has a token file or not, so
// a dashboard's rate() reads 0 rather than nothing. Thread-safe; `registry` must outlive this.
class AuthMetrics {
 public:
  explicit AuthMetrics(metrics::Registry* registry);
  // Counts `refusal` by its code (UNAUTHENTICATED, PERMISSION_DENIED); other codes, OK
  // included, are not refusals and are ignored.
  void CountRefusal(const absl::Status& refusal);
  void CountReload(bool ok);

  double unauthenticated() const;
  double permission_denied() const;
  double reloads_ok() const;
  double reloads_failed() const;

 private:
  metrics::Counter& unauthenticated_;
  metrics::Counter& permission_denied_;
  metrics::Counter& reloads_ok_;
  metrics::Counter& reloads_failed_;
};

// Parses the token file's text (format above). `source` names it in error messages.
absl::StatusOr<std::vector<TokenEntry>> ParseTokensFile(std::string_view text,
                                                        std::string_view source);

// The token file, reloaded when it changes: each lookup stats the file at most once per
// `poll` and rereads it when its modification time, size or inode changed (a rename over it,
// as a Kubernetes Secret update does, included). A reload that fails (unreadable, malformed)
// keeps the tokens it had and logs a warning. Thread-safe.
class TokenStore {
 public:
  // INVALID_ARGUMENT when the file cannot be read or is malformed (the server does not start).
  // `metrics` (null: none), which must outlive the store, counts every refusal of
  // Authenticate and every reload after Open.
  static absl::StatusOr<std::unique_ptr<TokenStore>> Open(std::string path,
                                                          absl::Duration poll = absl::Seconds(1),
                                                          AuthMetrics* metrics = nullptr);

  // The identity of `bearer_token` (the token of an "Authorization: Bearer" header; nullopt
  // when there was none) or, without a token, of `certificate_name` (the subject common name of
  // the client certificate the TLS handshake verified; nullopt without one). UNAUTHENTICATED
  // when neither names a listed identity; PERMISSION_DENIED when the identity may not do what
  // `required` allows (a client's token or certificate on a worker-only service).
  absl::StatusOr<Identity> Authenticate(std::optional<std::string_view> bearer_token, Role required,
                                        std::optional<std::string_view> certificate_name = {});

  // Rereads the file now if it changed (tests; Authenticate does it on its own).
  void ReloadIfChanged();
  // Successful reloads since Open (metrics, tests).
  int reloads() const;

 private:
  struct FileStamp {
    int64_t mtime_ns = 0;
    int64_t size = -1;
    uint64_t inode = 0;
    bool operator==(const FileStamp&) const = default;
  };
  TokenStore(std::string path, absl::Duration poll, AuthMetrics* metrics)
      : path_(std::move(path)), poll_(poll), metrics_(metrics) {}
  absl::Status Load() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Identity> Lookup(std::optional<std::string_view> bearer_token, Role required,
                                  std::optional<std::string_view> certificate_name);
  void MaybeReload();

  const std::string path_;
  const absl::Duration poll_;
  AuthMetrics* const metrics_;  // null: not counted
  // Lookups share it (reader locks), reloads hold it alone.
  mutable absl::Mutex mu_;
  std::vector<TokenEntry> entries_ ABSL_GUARDED_BY(mu_);
  FileStamp stamp_ ABSL_GUARDED_BY(mu_);
  // Unix ns of the next stat of the file: read without the lock on every lookup.
  std::atomic<int64_t> next_check_ns_{std::numeric_limits<int64_t>::min()};
  int reloads_ ABSL_GUARDED_BY(mu_) = 0;
};

// "Bearer TOKEN" (scheme case-insensitive) -> TOKEN; nullopt for anything else.
std::optional<std::string_view> BearerTokenOf(std::string_view authorization_header);

// A process's own token (--auth_token_file: the first non-empty, non-comment line of the file,
// trimmed), sent on its calls to other lazyrag servers. Reread when the file changes (checked at
// most once a second), so a rotated Secret is picked up. Thread-safe.
class BearerToken {
 public:
  // INVALID_ARGUMENT when the file cannot be read or holds no token.
  static absl::StatusOr<std::shared_ptr<BearerToken>> FromFile(std::string path);
  // A fixed token (tests).
  static std::shared_ptr<BearerToken> Fixed(std::string token);
  // The current token; the last good one when a reread fails.
  std::string Get();
  // "Bearer " + Get(), the "authorization" metadata value (built when the token is read, not
  // per call).
  std::string Header();

 private:
  explicit BearerToken(std::string path) : path_(std::move(path)) {}
  // Rereads the file when due and changed.
  void RefreshLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetLocked(std::string token) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const std::string path_;  // "" for a fixed token
  absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
  std::string header_ ABSL_GUARDED_BY(mu_);
  int64_t mtime_ns_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time next_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// Which cache namespaces a tenant may use besides its own (--public_namespaces): names without
// '/' shared by every tenant.
struct NamespacePolicy {
  std::vector<std::string> public_namespaces;
};
// INVALID_ARGUMENT (naming it) for a public namespace that is empty or contains '/'.
absl::Status ValidateNamespacePolicy(const NamespacePolicy& policy);

// The cache namespace a request is served in. Without authentication, or for a worker identity
// (a router forwarding a request whose namespace it already derived), `requested` as given.
// For a client of tenant T: a public namespace as named; otherwise "T/" + `requested` (the
// request's own namespace only narrows inside the tenant's). Tenant namespaces always contain
// '/', public ones never, so the two cannot meet. (Its length is checked where the key is
// made: the kvstore key's limit.)
absl::StatusOr<std::string> EffectiveNamespace(const Identity& caller, const std::string& requested,
                                               const NamespacePolicy& policy);

// Whether documents of namespace `ns` may be shown to `caller` (Stats): everything without
// authentication or to a worker identity; to a client, its tenant's namespaces and the public ones.
bool NamespaceVisibleTo(const Identity& caller, const std::string& ns,
                        const NamespacePolicy& policy);

}  // namespace lazyrag
