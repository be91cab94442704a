// Unit tests of the routing policy and the worker list: no gRPC, no processes.
#include "router/routing_policy.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "router/worker_source.h"

namespace lazyrag::router {
namespace {

const std::string kA = "10.0.0.1:7000";
const std::string kB = "10.0.0.2:7000";
const std::string kC = "10.0.0.3:7000";

std::vector<DocumentRef> Docs(const std::vector<std::string>& keys, int64_t tokens = 100) {
  std::vector<DocumentRef> out;
  for (const std::string& k : keys) out.push_back({k, tokens});
  return out;
}

// Routes and finishes at once (the request "succeeded" only when `learn`).
std::string RouteOnce(RoutingPolicy& policy, const std::vector<DocumentRef>& docs,
                      bool learn = false, RouteReason* reason = nullptr) {
  absl::StatusOr<RouteDecision> d = policy.Route(docs);
  EXPECT_TRUE(d.ok()) << d.status();
  if (!d.ok()) return "";
  if (reason != nullptr) *reason = d->reason;
  policy.Finish(d->worker, docs, learn);
  return d->worker;
}

TEST(RoutingPolicyTest, HashFallbackIsStableAndIgnoresDocumentOrder) {
  RoutingPolicy policy({});
  policy.SetWorkers({kA, kB, kC});
  RouteReason reason;
  std::string first = RouteOnce(policy, Docs({"d1", "d2", "d3"}), false, &reason);
  EXPECT_EQ(reason, RouteReason::kHash);
  EXPECT_EQ(RouteOnce(policy, Docs({"d3", "d1", "d2"})), first);
  EXPECT_EQ(RouteOnce(policy, Docs({"d2", "d3", "d1", "d1"})), first);
  // Another policy (another router replica) agrees.
  RoutingPolicy other({});
  other.SetWorkers({kC, kA, kB});
  EXPECT_EQ(RouteOnce(other, Docs({"d1", "d2", "d3"})), first);
}

TEST(RoutingPolicyTest, HashFallbackSpreadsSetsAndMovesFewWhenAWorkerJoins) {
  RoutingPolicy policy({});
  policy.SetWorkers({kA, kB, kC});
  std::map<int, std::string> before;
  std::map<std::string, int> per_worker;
  for (int i = 0; i < 300; ++i) {
    before[i] = RouteOnce(policy, Docs({absl::StrCat("doc", i), absl::StrCat("x", i)}));
    per_worker[before[i]]++;
  }
  ASSERT_EQ(per_worker.size(), 3u);
  for (const auto& [w, n] : per_worker) EXPECT_GT(n, 50) << w;

  const std::string kD = "10.0.0.4:7000";
  policy.SetWorkers({kA, kB, kC, kD});
  int moved = 0;
  for (int i = 0; i < 300; ++i) {
    std::string now = RouteOnce(policy, Docs({absl::StrCat("doc", i), absl::StrCat("x", i)}));
    if (now != before[i]) {
      ++moved;
      EXPECT_EQ(now, kD) << "a set moved between two old workers";
    }
  }
  EXPECT_GT(moved, 30);
  EXPECT_LT(moved, 150);
}

TEST(RoutingPolicyTest, RepeatedDocumentSetGoesWhereItWasRouted) {
  RoutingPolicy policy({});
  policy.SetWorkers({kA, kB});
  std::string holder = RouteOnce(policy, Docs({"a", "b", "c"}), /*learn=*/true);
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<RouteDecision> d = policy.Route(Docs({"c", "a", "b"}));
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(d->worker, holder);
    EXPECT_EQ(d->reason, RouteReason::kAffinity);
    EXPECT_TRUE(d->affinity_hit());
    EXPECT_EQ(d->missing_tokens, 0);
    policy.Finish(d->worker, Docs({"c", "a", "b"}), true);
  }
  // A set sharing two of three documents still prefers the holder.
  absl::StatusOr<RouteDecision> d = policy.Route(Docs({"a", "b", "new"}));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->worker, holder);
  EXPECT_EQ(d->missing_tokens, 100);
  EXPECT_EQ(d->document_tokens, 300);
}

TEST(RoutingPolicyTest, ResidencyReportedInStatsAttractsRequests) {
  RoutingPolicy policy({});
  policy.SetWorkers({kA, kB, kC});
  const std::string hashed = RouteOnce(policy, Docs({"id-hot"}));
  const std::string holder = hashed == kA ? kB : kA;
  WorkerLoadReport report;
  report.resident_document_ids = {"id-hot"};
  policy.UpdateStats(holder, policy.BeginStatsPoll(holder), report);
  RouteReason reason;
  EXPECT_EQ(RouteOnce(policy, Docs({"id-hot"}), false, &reason), holder);
  EXPECT_EQ(reason, RouteReason::kAffinity);
}

TEST(RoutingPolicyTest, TextKeysFollowTheIdsWorkersReturn) {
  RoutingPolicy policy({});
  policy.SetWorkers({kA, kB});
  const std::vector<DocumentRef> docs = {{TextDocumentKey("", "some text"), 10}};
  absl::StatusOr<RouteDecision> d = policy.Route(docs);
  ASSERT_TRUE(d.ok());
  const std::string first = d->worker;
  const std::string other = first == kA ? kB : kA;
  policy.Finish(first, docs, true, {"id-1"});
  EXPECT_EQ(RouteOnce(policy, docs), first);
  // The first worker evicts it (a Stats poll without it); the other reports it by id.
  policy.UpdateStats(first, policy.BeginStatsPoll(first), {});
  WorkerLoadReport report;
  report.resident_document_ids = {"id-1"};
  policy.UpdateStats(other, policy.BeginStatsPoll(other), report);
  RouteReason reason;
  EXPECT_EQ(RouteOnce(policy, docs, false, &reason), other);
  EXPECT_EQ(reason, RouteReason::kAffinity);
}

TEST(RoutingPolicyTest, StatsForgetEvictedDocumentsButNotThoseRoutedDuringThePoll) {
  RoutingPolicy policy({});
  policy.SetWorkers({kA, kB});
  std::string holder = RouteOnce(policy, Docs({"x"}), true);
  StatsTicket ticket = policy.BeginStatsPoll(holder);
  RouteOnce(policy, Docs({"y"}), true);  // learned while the poll is in flight
  policy.UpdateStats(holder, ticket, {});
  EXPECT_EQ(policy.Route(Docs({"x"}))->reason, RouteReason::kHash);  // "x" was evicted
  policy.Finish(holder, Docs({"x"}), false);
  absl::StatusOr<RouteDecision> y = policy.Route(Docs({"y"}));
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(y->reason, RouteReason::kAffinity);
  policy.Finish(y->worker, Docs({"y"}), false);
}

TEST(RoutingPolicyTest, CostTradesMissingTokensAgainstLoad) {
  RoutingPolicyOptions options;
  options.load_weight = 10;
  options.imbalance_threshold = 1000;
  RoutingPolicy policy(options);
  policy.SetWorkers({kA, kB});
  policy.LearnDocumentTokens("doc", "doc", 95);
  WorkerLoadReport holds;
  holds.resident_document_ids = {"doc"};
  policy.UpdateStats(kA, policy.BeginStatsPoll(kA), holds);
  // A holds the 95-token document: it wins while 10 x load(A) < 95 + 10 x load(B).
  std::vector<std::string> chosen;
  for (int i = 0; i < 12; ++i) chosen.push_back(policy.Route(Docs({"doc"}))->worker);
  int on_a = static_cast<int>(std::count(chosen.begin(), chosen.end(), kA));
  // A takes 10 (cost 0..90 < 95), then B (95) and A (100 vs 105) alternate.
  EXPECT_EQ(std::vector<std::string>(chosen.begin(), chosen.begin() + 10),
            std::vector<std::string>(10, kA));
  EXPECT_EQ(chosen[10], kB);
  EXPECT_EQ(on_a, 11);
}

TEST(RoutingPolicyTest, BalanceWinsOncePastTheImbalanceThreshold) {
  RoutingPolicyOptions options;
  options.load_weight = 0;  // pure affinity below the threshold
  options.imbalance_threshold = 2;
  RoutingPolicy policy(options);
  policy.SetWorkers({kA, kB});
  WorkerLoadReport holds;
  holds.resident_document_ids = {"hot"};
  policy.UpdateStats(kA, policy.BeginStatsPoll(kA), holds);
  std::vector<RouteDecision> decisions;
  for (int i = 0; i < 8; ++i) decisions.push_back(*policy.Route(Docs({"hot"})));
  // A: loads 0,1,2 -> A; at 3 vs 0 the difference exceeds 2 -> B; then A again (3 vs 1 is 2).
  for (int i = 0; i < 3; ++i) EXPECT_EQ(decisions[i].worker, kA) << i;
  EXPECT_EQ(decisions[3].worker, kB);
  EXPECT_EQ(decisions[3].reason, RouteReason::kBalance);
  EXPECT_EQ(decisions[4].worker, kA);
  EXPECT_EQ(decisions[4].reason, RouteReason::kAffinity);
  int on_b = 0;
  for (const RouteDecision& d : decisions) on_b += d.worker == kB;
  EXPECT_GE(on_b, 2);
  // Loads as the workers report them count too (others' running + waiting).
  for (const RouteDecision& d : decisions) policy.Finish(d.worker, Docs({"hot"}), false);
  WorkerLoadReport busy = holds;
  busy.running = 4;
  busy.waiting = 3;
  policy.UpdateStats(kA, policy.BeginStatsPoll(kA), busy);
  absl::StatusOr<RouteDecision> d = policy.Route(Docs({"hot"}));
  EXPECT_EQ(d->worker, kB);
  EXPECT_EQ(d->reason, RouteReason::kBalance);
}

TEST(RoutingPolicyTest, OwnInFlightRequestsAreNotCountedTwice) {
  RoutingPolicy policy({});
  policy.SetWorkers({kA});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(policy.Route(Docs({"d"})).ok());
  WorkerLoadReport report;
  report.running = 5;  // 3 of them are this router's
  policy.UpdateStats(kA, policy.BeginStatsPoll(kA), report);
  ASSERT_EQ(policy.Workers().size(), 1u);
  EXPECT_EQ(policy.Workers()[0].in_flight, 3);
  EXPECT_EQ(policy.Workers()[0].load, 5);
}

TEST(RoutingPolicyTest, RequestsRoutedDuringAStatsPollAreNotCountedTwice) {
  RoutingPolicy policy({});
  policy.SetWorkers({kA});
  StatsTicket ticket = policy.BeginStatsPoll(kA);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(policy.Route(Docs({"d"})).ok());
  WorkerLoadReport report;
  report.running = 4;  // the four that arrived while the poll was in flight
  policy.UpdateStats(kA, ticket, report);
  EXPECT_EQ(policy.Workers()[0].load, 4);
}

TEST(RoutingPolicyTest, EjectedAndExcludedWorkersAreNotChosen) {
  RoutingPolicy policy({});
  policy.SetWorkers({kA, kB});
  EXPECT_TRUE(policy.SetHealthy(kA, false));
  EXPECT_FALSE(policy.SetHealthy(kA, false));
  EXPECT_FALSE(policy.SetHealthy("unknown:1", false));
  for (int i = 0; i < 10; ++i) EXPECT_EQ(RouteOnce(policy, Docs({absl::StrCat("d", i)})), kB);
  absl::StatusOr<RouteDecision> none = policy.Route(Docs({"d"}), {kB});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(policy.SetHealthy(kA, true));
  EXPECT_EQ(RouteOnce(policy, Docs({"d"}), false), RouteOnce(policy, Docs({"d"}), false));
  absl::StatusOr<RouteDecision> retry = policy.Route(Docs({"d"}), {kA});
  ASSERT_TRUE(retry.ok());
  EXPECT_EQ(retry->worker, kB);
  policy.SetHealthy(kB, false);
  policy.SetHealthy(kA, false);
  none = policy.Route(Docs({"d"}));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(none.status().message(), "no healthy worker");
  RoutingPolicy empty({});
  EXPECT_EQ(empty.Route(Docs({"d"})).status().code(), absl::StatusCode::kUnavailable);
}

TEST(RoutingPolicyTest, RequestsWithoutDocumentsGoToTheLeastLoaded) {
  RoutingPolicy policy({});
  policy.SetWorkers({kA, kB, kC});
  std::map<std::string, int> count;
  for (int i = 0; i < 9; ++i) {
    absl::StatusOr<RouteDecision> d = policy.Route({});
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(d->reason, RouteReason::kLeastLoaded);
    count[d->worker]++;  // not finished: loads grow evenly
  }
  EXPECT_EQ(count, (std::map<std::string, int>{{kA, 3}, {kB, 3}, {kC, 3}}));
}

TEST(RoutingPolicyTest, WorkersThatStayKeepWhatIsKnownOfThem) {
  RoutingPolicy policy({});
  policy.SetWorkers({kA, kB});
  std::string holder = RouteOnce(policy, Docs({"kept"}), true);
  policy.SetWorkers({kC, kA, kB});
  EXPECT_EQ(RouteOnce(policy, Docs({"kept"})), holder);
  std::string other = holder == kA ? kB : kA;
  policy.SetWorkers({other});
  EXPECT_EQ(RouteOnce(policy, Docs({"kept"})), other);
  EXPECT_EQ(policy.Workers().size(), 1u);
}

TEST(RoutingPolicyTest, TextKeysDependOnNamespaceAndNeverLookLikeIds) {
  EXPECT_EQ(TextDocumentKey("", "abc"), TextDocumentKey("", "abc"));
  EXPECT_NE(TextDocumentKey("", "abc"), TextDocumentKey("tenant", "abc"));
  EXPECT_NE(TextDocumentKey("a", "bc"), TextDocumentKey("ab", "c"));
  EXPECT_EQ(TextDocumentKey("", "abc").rfind("text:", 0), 0u);
}

TEST(RoutingPolicyTest, RetryableCodes) {
  using absl::StatusCode;
  for (StatusCode c : {StatusCode::kUnavailable, StatusCode::kResourceExhausted,
                       StatusCode::kAborted, StatusCode::kUnknown, StatusCode::kCancelled}) {
    EXPECT_TRUE(IsRetryableBeforeFirstToken(c, false)) << static_cast<int>(c);
    EXPECT_FALSE(IsRetryableBeforeFirstToken(c, true)) << static_cast<int>(c);
  }
  for (StatusCode c : {StatusCode::kOk, StatusCode::kInvalidArgument, StatusCode::kNotFound,
                       StatusCode::kDeadlineExceeded, StatusCode::kInternal}) {
    EXPECT_FALSE(IsRetryableBeforeFirstToken(c, false)) << static_cast<int>(c);
  }
}

TEST(WorkerSourceTest, ParsesListsAndDnsNames) {
  absl::StatusOr<WorkerSpec> list = ParseWorkerSpec(" b:2, a:1 ,[::1]:3,a:1");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_FALSE(list->is_dns());
  EXPECT_EQ(list->addresses, (std::vector<std::string>{"[::1]:3", "a:1", "b:2"}));
  EXPECT_EQ(*MakeWorkerResolver(*list)(), list->addresses);

  for (const char* text : {"dns:///workers.ns.svc:7000", "dns:workers.ns.svc:7000"}) {
    absl::StatusOr<WorkerSpec> dns = ParseWorkerSpec(text);
    ASSERT_TRUE(dns.ok()) << text;
    EXPECT_TRUE(dns->is_dns());
    EXPECT_EQ(dns->dns_name, "workers.ns.svc");
    EXPECT_EQ(dns->dns_port, 7000);
  }
}

TEST(WorkerSourceTest, RejectsMalformedLists) {
  for (const char* text : {"", " ", ",", "host", "host:", ":7000", "host:0", "host:70000", "host:x",
                           "a:1,b", "dns:///name", "dns:///", "[::1]7000"}) {
    absl::StatusOr<WorkerSpec> spec = ParseWorkerSpec(text);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << "'" << text << "'";
  }
}

TEST(WorkerSourceTest, ResolvesANameToEveryAddress) {
  absl::StatusOr<WorkerSpec> spec = ParseWorkerSpec("dns:///localhost:7001");
  ASSERT_TRUE(spec.ok());
  absl::StatusOr<std::vector<std::string>> addresses = MakeWorkerResolver(*spec)();
  ASSERT_TRUE(addresses.ok()) << addresses.status();
  EXPECT_NE(std::find(addresses->begin(), addresses->end(), "127.0.0.1:7001"), addresses->end());

  spec = ParseWorkerSpec("dns:///no-such-host.invalid:7001");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(MakeWorkerResolver(*spec)().status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace lazyrag::router
