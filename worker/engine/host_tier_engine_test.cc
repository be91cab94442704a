// The host-memory tier inside the engine (issue 23, must-show 1), on the CPU backend: a pool with
// room for about two documents and a host tier for a few. A document evicted from the pool is
// promoted back from the host tier with the same outputs; the tier keeps to its capacity and
// drops its least recently used entry; concurrent requests share one promotion; a corrupt host
// copy is recomputed, never served; cancelled requests and insert pressure leave no pin behind
// and never evict a pinned entry; write-backs are sent from the host copy; a negative capacity
// is refused.
#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/metrics.h"
#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/cache/memory_store_test_util.h"
#include "worker/engine/engine.h"
#include "worker/engine/engine_test_util.h"
#include "worker/model/model_source.h"

namespace lazyrag {
namespace {

using engine_test::ModeRun;
using engine_test::RunMode;
using engine_test::Tokens;

constexpr int kPageSize = 16;
constexpr int kDocTokens = 48;  // 3 pages
constexpr int kSuffixTokens = 5;
constexpr int kSteps = 4;  // generated tokens per request
// Two resident documents (6 pages) and a request's own page or two; a third document evicts one.
constexpr int kPoolPages = 8;

// A backend whose host transfers (Backend's synchronous defaults, through ExportKv / ImportKv)
// are counted and whose promotions can be held: while held, a promotion started is reported
// running (PollKvTransfer: nullopt; WaitKvTransfer blocks) until OpenPromotions. Counts the
// ExportKv calls made outside StartKvToHost (a write-back exported on the scheduler thread).
// Transfers are started and polled on the scheduler thread; the counters are read by the test.
class HostTransferBackend final : public engine_test::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;

  void HoldPromotions() {
    absl::MutexLock l(&mu_);
    hold_ = true;
  }
  // Lets every promotion complete, and those started from now on.
  void OpenPromotions() {
    absl::MutexLock l(&mu_);
    hold_ = false;
  }
  // Lets the i-th promotion started (from 0) complete; the others stay held.
  void OpenPromotion(int i) {
    absl::MutexLock l(&mu_);
    if (i < int(started_.size())) held_.erase(started_[i]);
  }
  // Blocks until `n` promotions have been started; false after 10 s without.
  bool AwaitPromotionsStarted(int n) {
    absl::MutexLock l(&mu_);
    auto started = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return promotions_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&started), absl::Seconds(10));
  }
  // Forward steps started from now on wait until OpenForwards (the scheduler thread stops in
  // its next step).
  void HoldForwards() {
    absl::MutexLock l(&mu_);
    hold_forwards_ = true;
  }
  void OpenForwards() {
    absl::MutexLock l(&mu_);
    hold_forwards_ = false;
  }
  // Blocks until a forward step waits at the gate; false after 10 s without.
  bool AwaitForwardHeld() {
    absl::MutexLock l(&mu_);
    auto held = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return forwards_held_ > 0; };
    return mu_.AwaitWithTimeout(absl::Condition(&held), absl::Seconds(10));
  }
  int promotions() const {
    absl::MutexLock l(&mu_);
    return promotions_;
  }
  int copies_to_host() const { return copies_to_host_.load(); }
  int exports() const { return exports_.load(); }

  absl::StatusOr<KvTransferId> StartKvFromHost(const std::vector<int32_t> &pages, int num_tokens,
                                               const char *src) override {
    absl::StatusOr<KvTransferId> id = Backend::StartKvFromHost(pages, num_tokens, src);
    absl::MutexLock l(&mu_);
    ++promotions_;
    started_.push_back(id.ok() ? *id : 0);
    if (id.ok() && hold_) held_.insert(*id);
    return id;
  }
  absl::StatusOr<KvTransferId> StartKvToHost(const std::vector<int32_t> &pages, int num_tokens,
                                             char *dst) override {
    copies_to_host_.fetch_add(1);
    in_copy_to_host_ = true;
    absl::StatusOr<KvTransferId> id = Backend::StartKvToHost(pages, num_tokens, dst);
    in_copy_to_host_ = false;
    return id;
  }
  absl::StatusOr<std::optional<uint64_t>> PollKvTransfer(KvTransferId id) override {
    {
      absl::MutexLock l(&mu_);
      if (held_.count(id) > 0) {
        if (hold_) return std::optional<uint64_t>();
        held_.erase(id);
      }
    }
    return Backend::PollKvTransfer(id);
  }
  absl::StatusOr<uint64_t> WaitKvTransfer(KvTransferId id) override {
    {
      absl::MutexLock l(&mu_);
      auto done = [this, id]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !hold_ || held_.count(id) == 0; };
      mu_.Await(absl::Condition(&done));
      held_.erase(id);
    }
    return Backend::WaitKvTransfer(id);
  }
  absl::Status Forward(const ForwardBatch &b, std::vector<float> *logits) override {
    PassForwardGate();
    return ForwardingBackend::Forward(b, logits);
  }
  absl::Status ForwardArgmax(const ForwardBatch &b, std::vector<int32_t> *ids) override {
    PassForwardGate();
    return ForwardingBackend::ForwardArgmax(b, ids);
  }
  absl::Status ExportKv(const std::vector<int32_t> &pages, int n, std::string *out) override {
    if (!in_copy_to_host_) exports_.fetch_add(1);
    return ForwardingBackend::ExportKv(pages, n, out);
  }

 private:
  void PassForwardGate() {
    absl::MutexLock l(&mu_);
    ++forwards_held_;
    auto open = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !hold_forwards_; };
    mu_.Await(absl::Condition(&open));
    --forwards_held_;
  }

  mutable absl::Mutex mu_;
  bool hold_forwards_ ABSL_GUARDED_BY(mu_) = false;
  int forwards_held_ ABSL_GUARDED_BY(mu_) = 0;
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
  std::set<KvTransferId> held_ ABSL_GUARDED_BY(mu_);
  std::vector<KvTransferId> started_ ABSL_GUARDED_BY(mu_);  // promotions, in start order
  int promotions_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int> copies_to_host_{0};
  std::atomic<int> exports_{0};
  bool in_copy_to_host_ = false;  // scheduler thread only
};

struct TestEngine {
  std::unique_ptr<Engine> engine;
  HostTransferBackend *backend = nullptr;  // owned by `engine`
};

TestEngine MakeEngine(int num_pages, int64_t host_cache_bytes, DocumentStore *store = nullptr,
                      metrics::Registry *registry = nullptr, int64_t fetch_staging_bytes = 0) {
  TestEngine t;
  auto loaded = LoadModel("synthetic:tiny");
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  if (!loaded.ok()) return t;
  auto cpu = CreateCpuBackend(std::move(loaded->weights), {});
  EXPECT_TRUE(cpu.ok()) << cpu.status();
  if (!cpu.ok()) return t;
  auto backend = std::make_unique<HostTransferBackend>(std::move(*cpu));
  t.backend = backend.get();
  EngineOptions o;
  o.page_size = kPageSize;
  o.num_pages = num_pages;
  o.prefill_chunk = 32;
  o.max_batch_tokens = 96;
  o.fingerprint = loaded->fingerprint;
  o.model_name = "tiny";
  o.store = store;
  o.registry = registry;
  o.host_cache_bytes = host_cache_bytes;
  o.fetch_staging_bytes = fetch_staging_bytes;
  auto e = Engine::Create(std::move(backend), o);
  EXPECT_TRUE(e.ok()) << e.status();
  if (e.ok()) t.engine = std::move(*e);
  return t;
}

// An engine without a host tier and with room for everything: the reference outputs.
std::unique_ptr<Engine> MakeReference() { return MakeEngine(256, 0).engine; }

// What one document of kDocTokens takes in the host tier: its KV's transport form rounded up to
// the tier's 256-byte ranges.
int64_t DocRangeBytes(Engine &e) { return (e.backend().KvBytes(kDocTokens) + 255) / 256 * 256; }

// A prompt of one document and a query, without a prefix block (so the pool and the host tier
// hold documents only).
TokenPrompt DocPrompt(int doc_seed, int query_seed) {
  TokenPrompt p;
  p.documents.push_back(Tokens(doc_seed, kDocTokens));
  p.suffix = Tokens(query_seed + 5000, kSuffixTokens);
  return p;
}

bool Resident(Engine &e, const std::string &id) {
  const std::vector<std::string> ids = e.Stats().resident_ids;
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// Waits for a state the scheduler thread reaches with nothing to wait on (polling every
// millisecond, at most 10 s); false on timeout.
bool WaitUntil(const std::function<bool()> &done) {
  for (int i = 0; i < 10000; ++i) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return done();
}

// Runs requests for new documents (prompt `like` with its documents replaced) until `id` has
// been evicted from the pool.
void EvictFromPool(Engine &e, const std::string &id, const TokenPrompt &like, AttentionMode mode,
                   int seed) {
  for (int i = 0; i < 6 && Resident(e, id); ++i) {
    TokenPrompt q = like;
    for (size_t d = 0; d < q.documents.size(); ++d) {
      q.documents[d] = Tokens(seed + 10 * i + int(d), kDocTokens);
    }
    RunMode(e, q, mode, 1);
  }
  ASSERT_FALSE(Resident(e, id)) << "still in the pool";
}

class HostTierServesEvictedDocument : public ::testing::TestWithParam<AttentionMode> {};

// Must-show 1.1: a document evicted from the pool by others is promoted from the host tier:
// counted as a host hit, not computed, and the outputs (greedy tokens and every step's logits)
// are those of the run that computed it.
TEST_P(HostTierServesEvictedDocument, WithTheSameOutputs) {
  const AttentionMode mode = GetParam();
  auto ref = MakeReference();
  ASSERT_NE(ref, nullptr);
  TestEngine t = MakeEngine(kPoolPages, 8 * DocRangeBytes(*ref));
  ASSERT_NE(t.engine, nullptr);
  Engine &e = *t.engine;
  ASSERT_NE(e.host_tier(), nullptr);

  std::mt19937 rng(23);
  const TokenPrompt p =
      engine_test::RagPrompt(rng, e.config().vocab_size, {kDocTokens}, kSuffixTokens);
  const std::string id = e.BlockId(p.documents[0], "");
  const ModeRun first = RunMode(e, p, mode, kSteps);
  ASSERT_EQ(first.logits.size(), size_t(kSteps));
  EXPECT_EQ(first.result.usage.host_document_tokens, 0);
  EXPECT_EQ(first.result.usage.computed_tokens, p.total_tokens());
  // Copied to the host tier once computed (committed by the steps after).
  ASSERT_TRUE(WaitUntil([&] { return e.host_tier()->Contains(id); }));

  ASSERT_NO_FATAL_FAILURE(EvictFromPool(e, id, p, mode, 700));
  ASSERT_TRUE(e.host_tier()->Contains(id));
  const int promotions = t.backend->promotions();

  const ModeRun second = RunMode(e, p, mode, kSteps);
  const Usage &u = second.result.usage;
  EXPECT_EQ(u.host_document_tokens, kDocTokens);
  EXPECT_EQ(u.cached_document_tokens, kDocTokens);
  EXPECT_EQ(u.pool_document_tokens, 0);
  EXPECT_EQ(u.store_document_tokens, 0);
  // The prefix block is in the pool or promoted too; only the query is computed.
  EXPECT_EQ(u.computed_tokens, int64_t(p.suffix.size()));
  EXPECT_GE(t.backend->promotions(), promotions + 1);
  EXPECT_EQ(second.tokens, first.tokens);
  ASSERT_EQ(second.logits.size(), first.logits.size());
  for (size_t s = 0; s < first.logits.size(); ++s) {
    EXPECT_EQ(second.logits[s], first.logits[s]) << "step " << s;
  }
  const EngineStats s = e.Stats();
  EXPECT_EQ(s.host.checksum_failures, 0);
  EXPECT_EQ(s.host.pinned_entries, 0);
  EXPECT_GT(s.evictions, 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, HostTierServesEvictedDocument,
                         ::testing::Values(AttentionMode::kLazy, AttentionMode::kMaterialize),
                         [](const ::testing::TestParamInfo<AttentionMode> &info) {
                           return std::string(AttentionModeName(info.param));
                         });

// Must-show 1.2: a host tier with room for three documents keeps to it and drops the least
// recently used one (a promotion counts as a use); a dropped document is recomputed, with the
// reference's outputs.
TEST(HostTierEngineTest, ATierTooSmallDropsTheLeastRecentlyUsedDocument) {
  auto ref = MakeReference();
  ASSERT_NE(ref, nullptr);
  const int64_t range = DocRangeBytes(*ref);
  // Three ranges; 255 more bytes are not a fourth.
  TestEngine t = MakeEngine(kPoolPages, 3 * range + 255);
  ASSERT_NE(t.engine, nullptr);
  Engine &e = *t.engine;
  ASSERT_EQ(e.Stats().host.capacity_bytes, 3 * range);

  // The tier's occupancy, sampled while the requests run.
  std::atomic<bool> stop{false};
  std::atomic<int64_t> max_used{0};
  std::atomic<int> max_entries{0};
  std::thread sampler([&] {
    while (!stop.load()) {
      const HostTierStats h = e.Stats().host;
      if (h.used_bytes > max_used.load()) max_used.store(h.used_bytes);
      if (h.entries > max_entries.load()) max_entries.store(h.entries);
      absl::SleepFor(absl::Microseconds(50));
    }
  });

  struct Step {
    int doc;                  // seed of its document
    int64_t host_tokens;      // expected Usage.host_document_tokens
    int64_t computed_tokens;  // expected Usage.computed_tokens
  };
  constexpr int A = 101, B = 102, C = 103, D = 104;
  const int64_t computed = kDocTokens + kSuffixTokens;
  // Pool and tier least recently used first.
  const std::vector<Step> steps = {
      {A, 0, computed},                // pool {A}     host [A]
      {B, 0, computed},                // pool {A, B}  host [A, B]
      {C, 0, computed},                // pool {B, C}  host [A, B, C]
      {A, kDocTokens, kSuffixTokens},  // pool {C, A}  host [B, C, A]: promoted, now most recent
      {D, 0, computed},                // pool {A, D}  host [C, A, D]: B dropped (LRU), not A
      {B, 0, computed},                // pool {D, B}  host [A, D, B]: recomputed, C dropped
      {A, kDocTokens, kSuffixTokens},  // pool {B, A}  host [D, B, A]: promoted again
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    const TokenPrompt p = DocPrompt(steps[i].doc, int(i));
    const ModeRun want = RunMode(*ref, p, AttentionMode::kLazy, kSteps);
    const ModeRun got = RunMode(e, p, AttentionMode::kLazy, kSteps);
    EXPECT_EQ(got.result.usage.host_document_tokens, steps[i].host_tokens) << "step " << i;
    EXPECT_EQ(got.result.usage.computed_tokens, steps[i].computed_tokens) << "step " << i;
    EXPECT_EQ(got.tokens, want.tokens) << "step " << i;
    EXPECT_EQ(got.logits, want.logits) << "step " << i;
    const HostTierStats h = e.Stats().host;
    EXPECT_LE(h.used_bytes, h.capacity_bytes) << "step " << i;
    EXPECT_LE(h.entries, 3) << "step " << i;
    if (i == 4) {
      EXPECT_FALSE(e.host_tier()->Contains(e.BlockId(Tokens(B, kDocTokens), "")));
      EXPECT_TRUE(e.host_tier()->Contains(e.BlockId(Tokens(A, kDocTokens), "")));
      EXPECT_TRUE(e.host_tier()->Contains(e.BlockId(Tokens(C, kDocTokens), "")));
    }
  }
  stop.store(true);
  sampler.join();
  const HostTierStats h = e.Stats().host;
  EXPECT_LE(max_used.load(), h.capacity_bytes);
  EXPECT_LE(max_entries.load(), 3);
  EXPECT_EQ(h.evictions, 2);  // B, then C
  EXPECT_EQ(h.checksum_failures, 0);
  EXPECT_EQ(h.pinned_entries, 0);
  EXPECT_EQ(h.pending_entries, 0);
}

// A resident document the tier has dropped (its copy made when it was computed) is copied to
// the tier again when the pool evicts it, and then served from there.
TEST(HostTierEngineTest, AnEvictedDocumentIsDemotedWhenTheTierDroppedIt) {
  auto ref = MakeReference();
  ASSERT_NE(ref, nullptr);
  TestEngine t = MakeEngine(kPoolPages, 2 * DocRangeBytes(*ref));
  ASSERT_NE(t.engine, nullptr);
  Engine &e = *t.engine;
  constexpr int A = 111, B = 112, C = 113, D = 114;
  const std::string a = e.BlockId(Tokens(A, kDocTokens), "");
  // Pool and tier least recently used first.
  RunMode(e, DocPrompt(A, 1), AttentionMode::kLazy, 1);  // pool {A}     host [A]
  RunMode(e, DocPrompt(B, 2), AttentionMode::kLazy, 1);  // pool {A, B}  host [A, B]
  RunMode(e, DocPrompt(A, 3), AttentionMode::kLazy, 1);  // pool {B, A}: A used last
  RunMode(e, DocPrompt(C, 4), AttentionMode::kLazy, 1);  // pool {A, C}  host [B, C]
  ASSERT_TRUE(Resident(e, a));
  ASSERT_FALSE(e.host_tier()->Contains(a));
  EXPECT_EQ(t.backend->copies_to_host(), 3);
  // D evicts A from the pool: copied to the tier before its pages are reused.
  RunMode(e, DocPrompt(D, 5), AttentionMode::kLazy, 1);  // pool {C, D}  host [A, D]
  ASSERT_FALSE(Resident(e, a));
  EXPECT_TRUE(e.host_tier()->Contains(a));
  EXPECT_EQ(t.backend->copies_to_host(), 5);  // A demoted, D computed

  const TokenPrompt p = DocPrompt(A, 6);
  const ModeRun got = RunMode(e, p, AttentionMode::kLazy, kSteps);
  EXPECT_EQ(got.result.usage.host_document_tokens, kDocTokens);
  EXPECT_EQ(got.result.usage.computed_tokens, kSuffixTokens);
  const ModeRun want = RunMode(*ref, p, AttentionMode::kLazy, kSteps);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.logits, want.logits);
  EXPECT_EQ(e.Stats().host.checksum_failures, 0);
}

// Reads a counter of the engine's metrics.
double CounterValue(metrics::Registry &r, const std::string &name) {
  return r.AddCounter(name, "").Add({{"model", "tiny"}}).Value();
}

// Must-show 1.3: two requests that need the same document from the host tier at once share one
// promotion (singleflight across tiers): one is served from the host tier, the other from the
// pool once it is there.
TEST(HostTierEngineTest, ConcurrentRequestsShareOnePromotion) {
  auto ref = MakeReference();
  ASSERT_NE(ref, nullptr);
  metrics::Registry registry;
  TestEngine t = MakeEngine(kPoolPages, 4 * DocRangeBytes(*ref), nullptr, &registry);
  ASSERT_NE(t.engine, nullptr);
  Engine &e = *t.engine;
  const TokenPrompt p1 = DocPrompt(201, 1), p2 = DocPrompt(201, 2);
  const std::string id = e.BlockId(p1.documents[0], "");
  RunMode(e, p1, AttentionMode::kLazy, 1);
  ASSERT_NO_FATAL_FAILURE(EvictFromPool(e, id, p1, AttentionMode::kLazy, 800));
  ASSERT_TRUE(e.host_tier()->Contains(id));
  ASSERT_EQ(t.backend->promotions(), 0);

  // The promotion is held until both requests wait for it.
  t.backend->HoldPromotions();
  ModeRun r1, r2;
  std::thread t1([&] { r1 = RunMode(e, p1, AttentionMode::kLazy, kSteps); });
  std::thread t2([&] { r2 = RunMode(e, p2, AttentionMode::kLazy, kSteps); });
  EXPECT_TRUE(t.backend->AwaitPromotionsStarted(1));
  EXPECT_TRUE(WaitUntil([&] { return e.Stats().running == 2; }));
  EXPECT_EQ(e.Stats().host.pinned_entries, 1);
  t.backend->OpenPromotions();
  t1.join();
  t2.join();

  EXPECT_EQ(t.backend->promotions(), 1);
  EXPECT_EQ(CounterValue(registry, "lazyrag_host_cache_promotions_total"), 1);
  const Usage &u1 = r1.result.usage, &u2 = r2.result.usage;
  EXPECT_EQ(u1.host_document_tokens + u2.host_document_tokens, kDocTokens);
  EXPECT_EQ(u1.pool_document_tokens + u2.pool_document_tokens, kDocTokens);
  EXPECT_EQ(u1.cached_document_tokens, kDocTokens);
  EXPECT_EQ(u2.cached_document_tokens, kDocTokens);
  EXPECT_EQ(u1.computed_tokens, kSuffixTokens);
  EXPECT_EQ(u2.computed_tokens, kSuffixTokens);
  const ModeRun w1 = RunMode(*ref, p1, AttentionMode::kLazy, kSteps);
  const ModeRun w2 = RunMode(*ref, p2, AttentionMode::kLazy, kSteps);
  // Batched together, the two requests' rows are summed in another order than alone: equal to
  // the reference within float rounding.
  engine_test::ExpectRunsMatch(r1, w1, 1e-5, "request 1");
  engine_test::ExpectRunsMatch(r2, w2, 1e-5, "request 2");
  EXPECT_EQ(e.Stats().host.pinned_entries, 0);
}

// Must-show 1.4: a host copy whose bytes changed in host memory fails its checksum on
// promotion: dropped and the document recomputed (the answer unchanged), counted once; the
// recomputed document's fresh copy serves the next miss.
TEST(HostTierEngineTest, ACorruptHostCopyIsRecomputedNotServed) {
  auto ref = MakeReference();
  ASSERT_NE(ref, nullptr);
  TestEngine t = MakeEngine(kPoolPages, 6 * DocRangeBytes(*ref));
  ASSERT_NE(t.engine, nullptr);
  Engine &e = *t.engine;
  const TokenPrompt p = DocPrompt(301, 1);
  const std::string id = e.BlockId(p.documents[0], "");
  const ModeRun first = RunMode(e, p, AttentionMode::kLazy, kSteps);
  ASSERT_TRUE(WaitUntil([&] { return e.host_tier()->Contains(id); }));

  {
    std::optional<HostTier::Ref> ref = e.host_tier()->Acquire(id);
    ASSERT_TRUE(ref.has_value());
    // The arena is writable memory; the tier hands it out read-only.
    const_cast<char *>(ref->data)[ref->bytes / 2] ^= 0x10;
    e.host_tier()->Release(id);
  }
  ASSERT_NO_FATAL_FAILURE(EvictFromPool(e, id, p, AttentionMode::kLazy, 900));
  ASSERT_TRUE(e.host_tier()->Contains(id));

  const ModeRun second = RunMode(e, p, AttentionMode::kLazy, kSteps);
  EXPECT_EQ(second.result.usage.host_document_tokens, 0);
  EXPECT_EQ(second.result.usage.cached_document_tokens, 0);
  EXPECT_EQ(second.result.usage.computed_tokens, kDocTokens + kSuffixTokens);
  EXPECT_EQ(second.tokens, first.tokens);
  EXPECT_EQ(second.logits, first.logits);
  EXPECT_EQ(e.Stats().host.checksum_failures, 1);
  EXPECT_EQ(e.Stats().host.pinned_entries, 0);

  // Recomputed, it was copied to the tier again: the next miss is a clean host hit.
  ASSERT_TRUE(WaitUntil([&] { return e.host_tier()->Contains(id); }));
  ASSERT_NO_FATAL_FAILURE(EvictFromPool(e, id, p, AttentionMode::kLazy, 950));
  const ModeRun third = RunMode(e, p, AttentionMode::kLazy, kSteps);
  EXPECT_EQ(third.result.usage.host_document_tokens, kDocTokens);
  EXPECT_EQ(third.tokens, first.tokens);
  EXPECT_EQ(third.logits, first.logits);
  EXPECT_EQ(e.Stats().host.checksum_failures, 1);
}

// Must-show 1.5 (cancellation): a request cancelled while it waits for a promotion ends at once;
// the promotion keeps its pin on the host copy until it is done, then nothing stays pinned.
TEST(HostTierEngineTest, ACancelledRequestLeavesNoHostPin) {
  auto ref = MakeReference();
  ASSERT_NE(ref, nullptr);
  TestEngine t = MakeEngine(kPoolPages, 4 * DocRangeBytes(*ref));
  ASSERT_NE(t.engine, nullptr);
  Engine &e = *t.engine;
  const TokenPrompt p = DocPrompt(401, 1);
  const std::string id = e.BlockId(p.documents[0], "");
  RunMode(e, p, AttentionMode::kLazy, 1);
  ASSERT_NO_FATAL_FAILURE(EvictFromPool(e, id, p, AttentionMode::kLazy, 1000));
  ASSERT_TRUE(e.host_tier()->Contains(id));

  t.backend->HoldPromotions();
  std::atomic<bool> cancel{false};
  absl::StatusOr<TokenResult> cancelled = absl::UnknownError("not run");
  std::thread runner([&] {
    TokenRunOptions o;
    o.max_tokens = kSteps;
    o.ignore_eos = true;
    o.is_cancelled = [&] { return cancel.load(); };
    cancelled = e.RunTokens(p, o);
  });
  EXPECT_TRUE(t.backend->AwaitPromotionsStarted(1));
  EXPECT_EQ(e.Stats().host.pinned_entries, 1);
  cancel.store(true);
  runner.join();
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled) << cancelled.status();
  // The copy into the pool is still running: its source stays pinned.
  EXPECT_EQ(e.Stats().host.pinned_entries, 1);

  t.backend->OpenPromotions();
  // The next request for the document joins the promotion or finds its result in the pool.
  const ModeRun after = RunMode(e, p, AttentionMode::kLazy, kSteps);
  EXPECT_EQ(after.result.usage.cached_document_tokens, kDocTokens);
  EXPECT_EQ(after.result.usage.computed_tokens, kSuffixTokens);
  const ModeRun want = RunMode(*ref, p, AttentionMode::kLazy, kSteps);
  EXPECT_EQ(after.tokens, want.tokens);
  EXPECT_EQ(after.logits, want.logits);
  EXPECT_EQ(t.backend->promotions(), 1);
  const HostTierStats h = e.Stats().host;
  EXPECT_EQ(h.pinned_entries, 0);
  EXPECT_EQ(h.pending_entries, 0);
  EXPECT_TRUE(e.host_tier()->Contains(id));
}

// Must-show 1.5 (preemption): a request waiting for a promotion is preempted by an older one
// that needs its pages; the promotion runs on for the document (its pin held by the job, not the
// request), the preempted request is served once readmitted, and no pin is left behind.
TEST(HostTierEngineTest, APreemptedRequestLeavesNoHostPin) {
  auto ref = MakeReference();
  ASSERT_NE(ref, nullptr);
  // 12 pages: the two requests' documents (9 pages) and 3 more, fewer than the 4 pages the
  // MATERIALIZE request copies its prompt into.
  constexpr int kPages = 12;
  TestEngine t = MakeEngine(kPages, 8 * DocRangeBytes(*ref));
  ASSERT_NE(t.engine, nullptr);
  Engine &e = *t.engine;
  const TokenPrompt older = DocPrompt(701, 1);  // document Z
  TokenPrompt younger = DocPrompt(702, 2);      // documents B, X
  younger.documents = {Tokens(703, kDocTokens), Tokens(702, kDocTokens)};
  const std::string z = e.BlockId(older.documents[0], "");
  const std::string b = e.BlockId(younger.documents[0], "");
  const std::string x = e.BlockId(younger.documents[1], "");
  // Z and X in the host tier only, B resident.
  RunMode(e, DocPrompt(701, 3), AttentionMode::kLazy, 1);
  RunMode(e, DocPrompt(702, 4), AttentionMode::kLazy, 1);
  ASSERT_NO_FATAL_FAILURE(EvictFromPool(e, z, DocPrompt(0, 5), AttentionMode::kLazy, 1300));
  ASSERT_NO_FATAL_FAILURE(EvictFromPool(e, x, DocPrompt(0, 5), AttentionMode::kLazy, 1350));
  RunMode(e, DocPrompt(703, 6), AttentionMode::kLazy, 1);
  ASSERT_TRUE(Resident(e, b));
  ASSERT_FALSE(Resident(e, z));
  ASSERT_FALSE(Resident(e, x));
  ASSERT_TRUE(e.host_tier()->Contains(z));
  ASSERT_TRUE(e.host_tier()->Contains(x));

  t.backend->HoldPromotions();
  ModeRun r_older, r_younger;
  std::thread t_older([&] { r_older = RunMode(e, older, AttentionMode::kMaterialize, kSteps); });
  EXPECT_TRUE(t.backend->AwaitPromotionsStarted(1));  // Z
  std::thread t_younger([&] { r_younger = RunMode(e, younger, AttentionMode::kLazy, kSteps); });
  EXPECT_TRUE(t.backend->AwaitPromotionsStarted(2));  // X; the younger request pins B
  EXPECT_EQ(e.Stats().host.pinned_entries, 2);
  // Z arrives: the older request needs 4 pages of its own and takes the younger one's. The
  // scheduler is then stopped at its next forward step (the older request's prefill), before
  // the younger request can be admitted again.
  t.backend->HoldForwards();
  t.backend->OpenPromotion(0);
  EXPECT_TRUE(t.backend->AwaitForwardHeld());
  EXPECT_EQ(e.Stats().preemptions, 1);
  EXPECT_FALSE(Resident(e, b));  // its pin went with the preempted request
  // X's promotion still runs, pinned by its job; Z's pin was dropped when it arrived.
  EXPECT_EQ(e.Stats().host.pinned_entries, 1);
  t.backend->OpenPromotions();
  t.backend->OpenForwards();
  t_older.join();
  t_younger.join();

  EXPECT_EQ(r_older.result.usage.host_document_tokens, kDocTokens);
  EXPECT_EQ(r_younger.result.usage.cached_document_tokens, 2 * kDocTokens);
  EXPECT_EQ(r_younger.result.usage.computed_tokens, kSuffixTokens);
  engine_test::ExpectRunsMatch(r_older, RunMode(*ref, older, AttentionMode::kMaterialize, kSteps),
                               1e-5, "older");
  engine_test::ExpectRunsMatch(r_younger, RunMode(*ref, younger, AttentionMode::kLazy, kSteps),
                               1e-5, "younger");
  const HostTierStats h = e.Stats().host;
  EXPECT_EQ(h.pinned_entries, 0);
  EXPECT_EQ(h.pending_entries, 0);
  EXPECT_EQ(h.checksum_failures, 0);
  EXPECT_GE(e.Stats().preemptions, 1);
}

// Must-show 1.5 (pins): while a document is being promoted, documents computed meanwhile fill
// the tier and evict the least recently used entries, never the one being read.
TEST(HostTierEngineTest, APromotingDocumentIsNeverEvictedFromTheHostTier) {
  auto ref = MakeReference();
  ASSERT_NE(ref, nullptr);
  TestEngine t = MakeEngine(kPoolPages, 3 * DocRangeBytes(*ref));
  ASSERT_NE(t.engine, nullptr);
  Engine &e = *t.engine;
  const TokenPrompt p = DocPrompt(501, 1);
  const std::string id = e.BlockId(p.documents[0], "");
  RunMode(e, p, AttentionMode::kLazy, 1);
  ASSERT_NO_FATAL_FAILURE(EvictFromPool(e, id, p, AttentionMode::kLazy, 1100));
  ASSERT_TRUE(e.host_tier()->Contains(id));
  // The document is now the tier's least recently used entry.

  t.backend->HoldPromotions();
  ModeRun promoted;
  std::thread runner([&] { promoted = RunMode(e, p, AttentionMode::kLazy, kSteps); });
  EXPECT_TRUE(t.backend->AwaitPromotionsStarted(1));
  const int64_t evictions_before = e.Stats().host.evictions;
  // Four new documents computed and copied to a tier of three entries, one of them pinned.
  for (int i = 0; i < 4; ++i) {
    const ModeRun r = RunMode(e, DocPrompt(1200 + i, i), AttentionMode::kLazy, 1);
    EXPECT_EQ(r.result.usage.computed_tokens, kDocTokens + kSuffixTokens) << i;
    EXPECT_TRUE(e.host_tier()->Contains(id)) << "evicted while pinned, after document " << i;
  }
  EXPECT_TRUE(WaitUntil([&] { return e.Stats().host.pending_entries == 0; }));
  const HostTierStats during = e.Stats().host;
  EXPECT_GE(during.evictions - evictions_before, 3);
  EXPECT_EQ(during.pinned_entries, 1);
  EXPECT_LE(during.used_bytes, during.capacity_bytes);

  t.backend->OpenPromotions();
  runner.join();
  EXPECT_EQ(promoted.result.usage.host_document_tokens, kDocTokens);
  const ModeRun want = RunMode(*ref, p, AttentionMode::kLazy, kSteps);
  EXPECT_EQ(promoted.tokens, want.tokens);
  EXPECT_EQ(promoted.logits, want.logits);
  EXPECT_TRUE(e.host_tier()->Contains(id));
  EXPECT_EQ(e.Stats().host.pinned_entries, 0);
}

// Must-show 1.6: with a host tier, a computed document's write-back is sent from its host copy
// (one copy to the host, no export on the scheduler thread), and the store then holds a value
// another engine serves with the same outputs.
TEST(HostTierEngineTest, WriteBackIsSentFromTheHostCopy) {
  MemoryDocumentStore store;
  auto ref = MakeReference();
  ASSERT_NE(ref, nullptr);
  TestEngine t = MakeEngine(kPoolPages, 4 * DocRangeBytes(*ref), &store);
  ASSERT_NE(t.engine, nullptr);
  Engine &e = *t.engine;
  const TokenPrompt p = DocPrompt(601, 1);
  const std::string id = e.BlockId(p.documents[0], "");
  const ModeRun first = RunMode(e, p, AttentionMode::kLazy, kSteps);
  EXPECT_EQ(first.result.usage.computed_tokens, kDocTokens + kSuffixTokens);
  {
    absl::MutexLock l(&store.mu);
    auto put = [&store]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(store.mu) { return store.puts >= 1; };
    ASSERT_TRUE(store.mu.AwaitWithTimeout(absl::Condition(&put), absl::Seconds(10)));
    EXPECT_EQ(store.puts, 1);
    EXPECT_EQ(store.docs.count("/" + id), 1u);
  }
  EXPECT_EQ(t.backend->copies_to_host(), 1);
  EXPECT_EQ(t.backend->exports(), 0);

  // The value written is the document's KV: a fresh engine on the store imports it.
  TestEngine reader = MakeEngine(kPoolPages, 0, &store);
  ASSERT_NE(reader.engine, nullptr);
  const ModeRun fetched = RunMode(*reader.engine, p, AttentionMode::kLazy, kSteps);
  EXPECT_EQ(fetched.result.usage.store_document_tokens, kDocTokens);
  EXPECT_EQ(fetched.tokens, first.tokens);
  EXPECT_EQ(fetched.logits, first.logits);
}

// Must-show 1.7: a negative host tier size is refused; 0 means no host tier.
TEST(HostTierEngineTest, NegativeHostCacheBytesIsInvalidArgument) {
  auto loaded = LoadModel("synthetic:tiny");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto backend = CreateCpuBackend(std::move(loaded->weights), {});
  ASSERT_TRUE(backend.ok()) << backend.status();
  EngineOptions o;
  o.num_pages = kPoolPages;
  o.host_cache_bytes = -1;
  auto e = Engine::Create(std::move(*backend), o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("host_cache_bytes"), std::string::npos) << e.status();

  TestEngine none = MakeEngine(kPoolPages, 0);
  ASSERT_NE(none.engine, nullptr);
  EXPECT_EQ(none.engine->host_tier(), nullptr);
  EXPECT_EQ(none.engine->Stats().host.capacity_bytes, 0);
}

// A first worker (no host tier) computes `p`'s document and writes it back to `store`; its run
// and the document's id. Fails the test when the write-back does not arrive.
void ComputeAndStore(MemoryDocumentStore &store, const TokenPrompt &p, ModeRun *first,
                     std::string *id) {
  TestEngine a = MakeEngine(256, 0, &store);
  ASSERT_NE(a.engine, nullptr);
  *id = a.engine->BlockId(p.documents[0], "");
  *first = RunMode(*a.engine, p, AttentionMode::kLazy, kSteps);
  ASSERT_TRUE(WaitUntil([&] { return store.Puts() >= 1; }));
}

// Issue 24: a document fetched from the store lands straight in the host tier (the store's
// GetInto writes into the tier's range), is copied into pool pages from there with the outputs of
// the run that computed it, and stays in the tier with the checksum that copy computed: once
// evicted from the pool it is promoted from the tier (checksum checked), not fetched again.
TEST(HostTierEngineTest, StoreFetchLandsInTheHostTierAndServesFromThere) {
  auto ref = MakeReference();
  ASSERT_NE(ref, nullptr);
  MemoryDocumentStore store;
  const TokenPrompt p = DocPrompt(24, 24);
  ModeRun first;
  std::string id;
  ASSERT_NO_FATAL_FAILURE(ComputeAndStore(store, p, &first, &id));
  TestEngine t = MakeEngine(kPoolPages, 8 * DocRangeBytes(*ref), &store);
  ASSERT_NE(t.engine, nullptr);
  Engine &e = *t.engine;
  const ModeRun fetched = RunMode(e, p, AttentionMode::kLazy, kSteps);
  EXPECT_EQ(fetched.result.usage.store_document_tokens, kDocTokens);
  EXPECT_EQ(fetched.result.usage.computed_tokens, int64_t(p.suffix.size()));
  EXPECT_EQ(fetched.tokens, first.tokens);
  ASSERT_EQ(fetched.logits.size(), first.logits.size());
  for (size_t s = 0; s < first.logits.size(); ++s) {
    EXPECT_EQ(fetched.logits[s], first.logits[s]) << "step " << s;
  }
  {
    absl::MutexLock l(&store.mu);
    EXPECT_EQ(store.gets_into, 1);
  }
  EXPECT_TRUE(e.host_tier()->Contains(id));
  EXPECT_EQ(e.Stats().host.pending_entries, 0);

  ASSERT_NO_FATAL_FAILURE(EvictFromPool(e, id, p, AttentionMode::kLazy, 900));
  const int gets = store.Gets();
  const ModeRun promoted = RunMode(e, p, AttentionMode::kLazy, kSteps);
  EXPECT_EQ(promoted.result.usage.host_document_tokens, kDocTokens);
  EXPECT_EQ(promoted.tokens, first.tokens);
  EXPECT_EQ(store.Gets(), gets);
  EXPECT_EQ(e.Stats().host.checksum_failures, 0);
}

// A fetch the host tier cannot take (no room beside a pinned entry is not needed: a tier too
// small for the document) is read through Get and imported as before.
TEST(HostTierEngineTest, StoreFetchTooLargeForTheTierTakesThePageablePath) {
  auto ref = MakeReference();
  ASSERT_NE(ref, nullptr);
  MemoryDocumentStore store;
  const TokenPrompt p = DocPrompt(25, 25);
  ModeRun first;
  std::string id;
  ASSERT_NO_FATAL_FAILURE(ComputeAndStore(store, p, &first, &id));
  TestEngine t = MakeEngine(kPoolPages, DocRangeBytes(*ref) / 2, &store);
  ASSERT_NE(t.engine, nullptr);
  const ModeRun fetched = RunMode(*t.engine, p, AttentionMode::kLazy, kSteps);
  EXPECT_EQ(fetched.result.usage.store_document_tokens, kDocTokens);
  EXPECT_EQ(fetched.tokens, first.tokens);
  EXPECT_EQ(t.engine->Stats().host.entries, 0);
  EXPECT_EQ(t.engine->Stats().host.pending_entries, 0);
}

// Without a host tier, fetches land in staging memory (EngineOptions::fetch_staging_bytes),
// are copied into their pages from there and leave it: a document evicted from the pool is
// fetched again, and staging never fills up.
TEST(HostTierEngineTest, WithoutAHostTierFetchesLandInStagingMemoryAndLeaveIt) {
  auto ref = MakeReference();
  ASSERT_NE(ref, nullptr);
  MemoryDocumentStore store;
  const TokenPrompt p = DocPrompt(26, 26);
  ModeRun first;
  std::string id;
  ASSERT_NO_FATAL_FAILURE(ComputeAndStore(store, p, &first, &id));
  const int gets_before = store.Gets();  // the first worker's, through Get (no staging)
  // Staging with room for one document only: every fetch must free it again.
  TestEngine t = MakeEngine(kPoolPages, 0, &store, nullptr, DocRangeBytes(*ref));
  ASSERT_NE(t.engine, nullptr);
  Engine &e = *t.engine;
  EXPECT_EQ(e.host_tier(), nullptr);
  for (int round = 0; round < 3; ++round) {
    const ModeRun fetched = RunMode(e, p, AttentionMode::kLazy, kSteps);
    EXPECT_EQ(fetched.result.usage.store_document_tokens, kDocTokens) << round;
    EXPECT_EQ(fetched.tokens, first.tokens) << round;
    ASSERT_NO_FATAL_FAILURE(EvictFromPool(e, id, p, AttentionMode::kLazy, 1000 + 100 * round));
  }
  absl::MutexLock l(&store.mu);
  EXPECT_EQ(store.gets_into, store.gets - gets_before) << "every read went through GetInto";
}

// A negative staging size is refused.
TEST(HostTierEngineTest, NegativeFetchStagingBytesIsInvalidArgument) {
  MemoryDocumentStore store;
  auto loaded = LoadModel("synthetic:tiny");
  ASSERT_TRUE(loaded.ok());
  auto cpu = CreateCpuBackend(std::move(loaded->weights), {});
  ASSERT_TRUE(cpu.ok());
  EngineOptions o;
  o.fingerprint = loaded->fingerprint;
  o.store = &store;
  o.fetch_staging_bytes = -1;
  EXPECT_EQ(Engine::Create(std::move(*cpu), o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lazyrag
