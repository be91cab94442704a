#include "common/auth.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/metrics.h"

namespace lazyrag {
namespace {

constexpr char kClientToken[] = "client-token-0123456789";
constexpr char kWorkerToken[] = "worker-token-0123456789";

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/auth_test_", getpid(), "_", name);
}

// A file under TempPath(name), removed when the test ends.
struct TempFile {
  explicit TempFile(const std::string& name) : path(TempPath(name)) {}
  ~TempFile() { std::remove(path.c_str()); }
  const std::string path;
};

void WriteFile(const std::string& path, const std::string& text) {
  // Written beside and renamed over, as a Secret update does: a reader never sees half a file.
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp, std::ios::binary | std::ios::trunc) << text;
  ASSERT_EQ(std::rename(tmp.c_str(), path.c_str()), 0);
}

TEST(ParseTokensFile, ReadsEntriesCommentsAndBlankLines) {
  auto e = ParseTokensFile(absl::StrCat("# tokens\n\n", kClientToken, " acme client  # a comment\n",
                                        kWorkerToken, "\tcluster\tworker\n"),
                           "f");
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->size(), 2u);
  EXPECT_EQ((*e)[0].tenant, "acme");
  EXPECT_EQ((*e)[0].role, Role::kClient);
  EXPECT_EQ((*e)[1].role, Role::kWorker);
}

TEST(ParseTokensFile, RejectsMalformedLinesNamingThem) {
  struct Case {
    std::string text, message;
  } cases[] = {
      {"short acme client\n", "line 1: a token is 16"},
      {absl::StrCat("\n", kClientToken, " acme\n"), "line 2: want 'TOKEN TENANT ROLE'"},
      {absl::StrCat(kClientToken, " ac/me client\n"), "tenant 'ac/me'"},
      {absl::StrCat(kClientToken, " acme admin\n"), "role 'admin'"},
      {absl::StrCat(kClientToken, " a client\n", kClientToken, " b worker\n"), "listed twice"},
      {"x509: acme client\n", "certificate name"},
      {"x509:\x01"
       "bad acme client\n",
       "certificate name"},
      {absl::StrCat("x509:", std::string(256, 'n'), " acme client\n"), "certificate name"},
      {"x509:w cluster worker\nx509:w acme client\n", "certificate name is listed twice"},
  };
  for (const Case& c : cases) {
    auto e = ParseTokensFile(c.text, "f");
    ASSERT_FALSE(e.ok()) << c.text;
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(e.status().message().find(c.message), std::string::npos) << e.status();
  }
}

TEST(TokenStore, AuthenticatesByRole) {
  const TempFile file("roles");
  const std::string& path = file.path;
  WriteFile(path, absl::StrCat(kClientToken, " acme client\n", kWorkerToken, " cluster worker\n"));
  auto store = TokenStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto client = (*store)->Authenticate(kClientToken, Role::kClient);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE(client->authenticated);
  EXPECT_EQ(client->tenant, "acme");
  EXPECT_EQ((*store)->Authenticate(kClientToken, Role::kWorker).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE((*store)->Authenticate(kWorkerToken, Role::kWorker).ok());
  EXPECT_TRUE((*store)->Authenticate(kWorkerToken, Role::kClient).ok());
  EXPECT_EQ((*store)->Authenticate(std::nullopt, Role::kClient).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*store)->Authenticate("client-token-012345678", Role::kClient).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*store)->Authenticate("", Role::kClient).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(TokenStore, AuthenticatesCertificateNamesWhenNoTokenIsSent) {
  const TempFile file("certs");
  WriteFile(file.path,
            absl::StrCat(kClientToken, " acme client\n", "x509:lazyrag-worker cluster worker\n",
                         "x509:acme-client acme client\n"));
  auto store = TokenStore::Open(file.path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto worker = (*store)->Authenticate(std::nullopt, Role::kWorker, "lazyrag-worker");
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(worker->tenant, "cluster");
  EXPECT_EQ(worker->role, Role::kWorker);
  auto client = (*store)->Authenticate(std::nullopt, Role::kWorker, "acme-client");
  EXPECT_EQ(client.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(client.status().message().find("client certificate"), std::string::npos);
  EXPECT_TRUE((*store)->Authenticate(std::nullopt, Role::kClient, "acme-client").ok());
  // Unlisted, and empty, names count for nothing.
  auto unknown = (*store)->Authenticate(std::nullopt, Role::kClient, "localhost");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(unknown.status().message().find("'localhost' is not listed"), std::string::npos);
  EXPECT_EQ((*store)->Authenticate(std::nullopt, Role::kClient, "").status().code(),
            absl::StatusCode::kUnauthenticated);
  // A token, when sent, decides: a client token with a worker's certificate is a client.
  EXPECT_EQ((*store)->Authenticate(kClientToken, Role::kWorker, "lazyrag-worker").status().code(),
            absl::StatusCode::kPermissionDenied);
  // A certificate entry is never a token.
  EXPECT_EQ((*store)->Authenticate("x509:lazyrag-worker", Role::kClient).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(TokenStore, OpenRejectsMissingOrMalformedFile) {
  EXPECT_EQ(TokenStore::Open(TempPath("absent")).status().code(),
            absl::StatusCode::kInvalidArgument);
  const TempFile file("bad");
  const std::string& path = file.path;
  WriteFile(path, "x y z\n");
  EXPECT_EQ(TokenStore::Open(path).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TokenStore, ReloadsWhenTheFileChangesAndKeepsTokensOnABadReload) {
  const TempFile file("reload");
  const std::string& path = file.path;
  WriteFile(path, absl::StrCat(kClientToken, " acme client\n"));
  auto store = TokenStore::Open(path, absl::ZeroDuration());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE((*store)->Authenticate(kClientToken, Role::kClient).ok());
  EXPECT_FALSE((*store)->Authenticate(kWorkerToken, Role::kClient).ok());

  WriteFile(path, absl::StrCat(kWorkerToken, " cluster worker\n"));  // rotated
  (*store)->ReloadIfChanged();
  EXPECT_EQ((*store)->reloads(), 1);
  EXPECT_EQ((*store)->Authenticate(kClientToken, Role::kClient).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE((*store)->Authenticate(kWorkerToken, Role::kWorker).ok());

  WriteFile(path, "not a token file\n");  // a bad edit keeps the last good tokens
  (*store)->ReloadIfChanged();
  EXPECT_EQ((*store)->reloads(), 1);
  EXPECT_TRUE((*store)->Authenticate(kWorkerToken, Role::kWorker).ok());
}

bool Exports(const metrics::Registry& registry, const std::string& sample_line) {
  return registry.Serialize().find(sample_line + "\n") != std::string::npos;
}

TEST(AuthMetrics, EverySeriesExistsAtZeroBeforeAnyCall) {
  metrics::Registry registry;
  AuthMetrics m(&registry);
  EXPECT_TRUE(Exports(registry, "lazyrag_auth_failures_total{reason=\"unauthenticated\"} 0"))
      << registry.Serialize();
  EXPECT_TRUE(Exports(registry, "lazyrag_auth_failures_total{reason=\"permission_denied\"} 0"));
  EXPECT_TRUE(Exports(registry, "lazyrag_auth_token_reloads_total{result=\"ok\"} 0"));
  EXPECT_TRUE(Exports(registry, "lazyrag_auth_token_reloads_total{result=\"error\"} 0"));
  // Codes that are not refusals are not counted.
  m.CountRefusal(absl::OkStatus());
  m.CountRefusal(absl::InvalidArgumentError("x"));
  EXPECT_EQ(m.unauthenticated(), 0);
  EXPECT_EQ(m.permission_denied(), 0);
}

TEST(TokenStore, CountsEveryRefusalByReasonAndEveryReload) {
  const TempFile file("counted");
  const std::string& path = file.path;
  WriteFile(path, absl::StrCat(kClientToken, " acme client\n", kWorkerToken, " cluster worker\n"));
  metrics::Registry registry;
  AuthMetrics m(&registry);
  auto store = TokenStore::Open(path, absl::ZeroDuration(), &m);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(m.reloads_ok(), 0);  // the first read is not a reload

  ASSERT_TRUE((*store)->Authenticate(kClientToken, Role::kClient).ok());
  ASSERT_TRUE((*store)->Authenticate(kWorkerToken, Role::kWorker).ok());
  EXPECT_EQ(m.unauthenticated(), 0);
  EXPECT_EQ(m.permission_denied(), 0);

  // Missing, empty and unknown tokens; a client's token on a worker-only service.
  EXPECT_FALSE((*store)->Authenticate(std::nullopt, Role::kClient).ok());
  EXPECT_FALSE((*store)->Authenticate("", Role::kWorker).ok());
  EXPECT_FALSE((*store)->Authenticate("client-token-012345678", Role::kClient).ok());
  EXPECT_EQ((*store)->Authenticate(kClientToken, Role::kWorker).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(m.unauthenticated(), 3);
  EXPECT_EQ(m.permission_denied(), 1);
  EXPECT_TRUE(Exports(registry, "lazyrag_auth_failures_total{reason=\"unauthenticated\"} 3"))
      << registry.Serialize();
  EXPECT_TRUE(Exports(registry, "lazyrag_auth_failures_total{reason=\"permission_denied\"} 1"));

  WriteFile(path, absl::StrCat(kWorkerToken, " cluster worker\n"));
  (*store)->ReloadIfChanged();
  EXPECT_EQ(m.reloads_ok(), 1);
  WriteFile(path, "not a token file\n");
  (*store)->ReloadIfChanged();
  EXPECT_EQ(m.reloads_ok(), 1);
  EXPECT_EQ(m.reloads_failed(), 1);
  EXPECT_TRUE(Exports(registry, "lazyrag_auth_token_reloads_total{result=\"error\"} 1"));
  // The kept tokens: the rotated-out client is refused and counted.
  EXPECT_FALSE((*store)->Authenticate(kClientToken, Role::kClient).ok());
  EXPECT_EQ(m.unauthenticated(), 4);
}

TEST(BearerTokenOf, ParsesTheBearerScheme) {
  EXPECT_EQ(BearerTokenOf("Bearer abc"), std::optional<std::string_view>("abc"));
  EXPECT_EQ(BearerTokenOf("bearer  abc "), std::optional<std::string_view>("abc"));
  EXPECT_EQ(BearerTokenOf("Basic abc"), std::nullopt);
  EXPECT_EQ(BearerTokenOf("Bearer "), std::nullopt);
  EXPECT_EQ(BearerTokenOf(""), std::nullopt);
}

TEST(BearerToken, ReadsTheFirstLineAndFollowsRotation) {
  const TempFile file("own");
  const std::string& path = file.path;
  WriteFile(path, "# mine\n  tok-one  \n");
  auto t = BearerToken::FromFile(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->Get(), "tok-one");
  EXPECT_EQ((*t)->Header(), "Bearer tok-one");
  // Rotated: the token and its header change together (the file is checked once a second; its
  // modification time tells a new file).
  absl::SleepFor(absl::Milliseconds(1100));
  WriteFile(path, "tok-two\n");
  EXPECT_EQ((*t)->Header(), "Bearer tok-two");
  EXPECT_EQ((*t)->Get(), "tok-two");
  EXPECT_EQ(BearerToken::Fixed("fixed")->Header(), "Bearer fixed");
  EXPECT_EQ(BearerToken::FromFile(TempPath("none")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Namespaces, ClientsLiveInsideTheirTenant) {
  NamespacePolicy policy{{"shared"}};
  Identity off;
  Identity acme{true, "acme", Role::kClient};
  Identity router{true, "cluster", Role::kWorker};
  EXPECT_EQ(*EffectiveNamespace(off, "x", policy), "x");
  EXPECT_EQ(*EffectiveNamespace(acme, "", policy), "acme/");
  EXPECT_EQ(*EffectiveNamespace(acme, "x", policy), "acme/x");
  EXPECT_EQ(*EffectiveNamespace(acme, "globex/x", policy), "acme/globex/x");
  EXPECT_EQ(*EffectiveNamespace(acme, "shared", policy), "shared");
  EXPECT_EQ(*EffectiveNamespace(router, "acme/x", policy), "acme/x");

  EXPECT_TRUE(ValidateNamespacePolicy(policy).ok());
  EXPECT_EQ(ValidateNamespacePolicy({{"a/b"}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateNamespacePolicy({{""}}).code(), absl::StatusCode::kInvalidArgument);

  EXPECT_TRUE(NamespaceVisibleTo(acme, "acme/", policy));
  EXPECT_TRUE(NamespaceVisibleTo(acme, "acme/x", policy));
  EXPECT_TRUE(NamespaceVisibleTo(acme, "shared", policy));
  EXPECT_FALSE(NamespaceVisibleTo(acme, "acmeco/", policy));
  EXPECT_FALSE(NamespaceVisibleTo(acme, "globex/x", policy));
  EXPECT_FALSE(NamespaceVisibleTo(acme, "", policy));
  EXPECT_TRUE(NamespaceVisibleTo(router, "globex/x", policy));
  EXPECT_TRUE(NamespaceVisibleTo(off, "globex/x", policy));
}

}  // namespace
}  // namespace lazyrag
