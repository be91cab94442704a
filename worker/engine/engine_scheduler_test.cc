// The continuous-batching scheduler and the store tier, in-process: concurrent
// requests equal sequential ones, singleflight (one compute or one fetch per
// missing document), preemption under page pressure, a bounded queue,
// cancellation and deadlines freeing pages, a failing store falling back to
// compute, a slow or stalled store given up for compute.
#include <atomic>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/cache/memory_store_test_util.h"
#include "worker/engine/engine.h"
#include "worker/engine/engine_test_util.h"
#include "worker/model/model_source.h"

namespace lazyrag {
namespace {

using MemoryStore = MemoryDocumentStore;

// `wrap`: wraps the CPU backend (e.g. to count its calls).
std::unique_ptr<Engine> MakeEngine(
    int num_pages, DocumentStore *store = nullptr, int max_waiting = 256, int max_running = 64,
    const std::function<std::unique_ptr<Backend>(std::unique_ptr<Backend>)> &wrap = nullptr,
    int64_t max_writeback_bytes = kDefaultMaxWritebackBytes, Clock *clock = nullptr) {
  auto loaded = LoadModel("synthetic:tiny");
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  auto backend = CreateCpuBackend(std::move(loaded->weights), {});
  EXPECT_TRUE(backend.ok()) << backend.status();
  if (wrap) *backend = wrap(std::move(*backend));
  EngineOptions o;
  o.page_size = 16;
  o.num_pages = num_pages;
  o.prefill_chunk = 32;
  o.max_batch_tokens = 96;
  o.max_waiting = max_waiting;
  o.max_running = max_running;
  o.fingerprint = loaded->fingerprint;
  o.store = store;
  o.max_writeback_bytes = max_writeback_bytes;
  o.clock = clock;
  auto e = Engine::Create(std::move(*backend), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(*e);
}

using engine_test::ClockedBackend;
using engine_test::FakeClock;
using engine_test::Tokens;

TokenPrompt Prompt(const std::vector<int> &docs, int query_seed) {
  TokenPrompt p;
  p.prefix = Tokens(1000, 9);
  for (int d : docs) p.documents.push_back(Tokens(d, 30 + d * 7 % 40));
  p.suffix = Tokens(query_seed + 5000, 7);
  return p;
}

TokenRunOptions Options(int max_tokens) {
  TokenRunOptions o;
  o.max_tokens = max_tokens;
  o.ignore_eos = true;
  return o;
}

std::vector<TokenPrompt> Workload() {
  std::vector<TokenPrompt> out;
  for (int i = 0; i < 12; ++i) out.push_back(Prompt({i % 5, (i + 2) % 5}, i));
  return out;
}

std::vector<std::vector<int32_t>> RunConcurrently(Engine &e, const std::vector<TokenPrompt> &ps,
                                                  int max_tokens) {
  std::vector<std::vector<int32_t>> out(ps.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ps.size(); ++i) {
    threads.emplace_back([&, i] {
      auto r = e.RunTokens(ps[i], Options(max_tokens));
      EXPECT_TRUE(r.ok()) << r.status();
      if (r.ok()) out[i] = r->token_ids;
    });
  }
  for (auto &t : threads) t.join();
  return out;
}

TEST(EngineSchedulerTest, ConcurrentRequestsEqualSequentialOnesAndComputeDocumentsOnce) {
  const auto ps = Workload();
  auto seq = MakeEngine(1024);
  std::vector<std::vector<int32_t>> ref;
  for (const auto &p : ps) ref.push_back(seq->RunTokens(p, Options(10))->token_ids);
  MemoryStore store;
  auto conc = MakeEngine(1024, &store);
  EXPECT_EQ(RunConcurrently(*conc, ps, 10), ref);
  // Five documents and the prefix block: one fetch (a miss) and one write-back
  // each.
  EXPECT_EQ(store.gets, 6);
  for (int i = 0; i < 100 && store.Puts() < 6; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(store.Puts(), 6);
  // A second engine on the same store fetches instead of computing.
  auto again = MakeEngine(1024, &store);
  auto r = again->RunTokens(ps[3], Options(10));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->token_ids, ref[3]);
  EXPECT_EQ(r->usage.store_document_tokens, r->usage.document_tokens);
  EXPECT_EQ(r->usage.computed_tokens, int64_t(ps[3].suffix.size()));
}

// A kvstore whose hits take `hit_delay` on `clock` (once `clock` is set): far
// slower than recomputing the tiny model's documents.
class SlowStore : public MemoryDocumentStore {
 public:
  explicit SlowStore(absl::Duration hit_delay) : hit_delay_(hit_delay) {}
  absl::StatusOr<StoredDocument> Get(const std::string &ns, const std::string &id) override {
    auto r = MemoryDocumentStore::Get(ns, id);
    if (r.ok() && clock.load() != nullptr) clock.load()->Advance(hit_delay_);
    return r;
  }
  std::atomic<FakeClock *> clock{nullptr};

 private:
  const absl::Duration hit_delay_;
};

// A kvstore whose hits wait while `closed` is set (a stalled fetch); counts the
// hits that reached the gate.
class GatedGetStore : public MemoryDocumentStore {
 public:
  absl::StatusOr<StoredDocument> Get(const std::string &ns, const std::string &id) override {
    auto r = MemoryDocumentStore::Get(ns, id);
    if (r.ok()) {
      absl::MutexLock l(&gate_mu);
      ++gated_hits;
      gate_mu.Await(absl::Condition(
          +[](bool *c) { return !*c; }, &closed));
    }
    return r;
  }
  int GatedHits() {
    absl::MutexLock l(&gate_mu);
    return gated_hits;
  }
  void SetClosed(bool c) {
    absl::MutexLock l(&gate_mu);
    closed = c;
  }
  absl::Mutex gate_mu;
  bool closed = false;
  int gated_hits = 0;
};

// An engine on `store` that has run one request without documents (so it knows
// what a forward step costs) and no fetch. With `clock`: every forward step
// takes 5 ms on it.
std::unique_ptr<Engine> WarmReader(DocumentStore *store, FakeClock *clock = nullptr) {
  auto reader = clock == nullptr
                    ? MakeEngine(1024, store)
                    : MakeEngine(
                          1024, store, 256, 64,
                          [&](std::unique_ptr<Backend> inner) -> std::unique_ptr<Backend> {
                            return std::make_unique<ClockedBackend>(std::move(inner), clock,
                                                                    absl::Milliseconds(5));
                          },
                          kDefaultMaxWritebackBytes, clock);
  TokenPrompt warm;
  warm.suffix = Tokens(77, 64);
  EXPECT_TRUE(reader->RunTokens(warm, Options(1)).ok());
  return reader;
}

// Fetch or compute (worker/engine/fetch_cost.h): once the engine has seen what a kvstore hit
// and a forward step cost, documents that are cheaper to recompute are recomputed.
TEST(EngineSchedulerTest, DocumentsAreRecomputedWhenTheStoreIsSlowerThanComputing) {
  std::vector<TokenPrompt> ps;
  for (int i = 0; i < 5; ++i) ps.push_back(Prompt({i}, i));  // five documents, one each
  SlowStore store(absl::Milliseconds(150));
  auto writer = MakeEngine(1024, &store);
  std::vector<std::vector<int32_t>> ref;
  for (const auto &p : ps) ref.push_back(writer->RunTokens(p, Options(4))->token_ids);
  for (int i = 0; i < 200 && store.Puts() < 6; ++i) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_EQ(store.Puts(), 6);  // five documents and the prefix block

  // From here a hit takes 150 ms and a forward step 5 ms, on a fake clock.
  FakeClock clock;
  store.clock = &clock;
  auto reader = WarmReader(&store, &clock);
  const int gets_before = store.Gets();
  const int puts_before = store.Puts();
  std::vector<int64_t> store_tokens;
  for (size_t i = 0; i < ps.size(); ++i) {
    auto r = reader->RunTokens(ps[i], Options(4));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->token_ids, ref[i]) << "request " << i;
    store_tokens.push_back(r->usage.store_document_tokens);
  }
  // The first request's blocks were fetched before any hit had been timed (its document may
  // come from the store or, its fetch queued behind the prefix block's past the 0.2 s hedge
  // time, be computed); after that every document is computed (no probe within four
  // decisions).
  for (size_t i = 1; i < ps.size(); ++i) EXPECT_EQ(store_tokens[i], 0) << "request " << i;
  EXPECT_GE(store.Gets() - gets_before, 1);  // the prefix block, and the first document
  EXPECT_LE(store.Gets() - gets_before, 2);  // unless given up before it started
  // The recomputed documents are in the store already: none is written back again (the
  // engine asked the store whether it holds them).
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(store.Puts(), puts_before);
  {
    absl::MutexLock l(&store.mu);
    EXPECT_GE(store.contains, 4);
  }
}

// A kvstore whose hits stall (as one busy with write-backs of large documents
// did on the H200, 1.5 s a hit): once the engine knows what a step costs, a
// fetch that runs past its hedge time (twice the predicted compute, at least
// 0.2 s: fetch_cost.h) is given up and the document computed, so the request
// does not wait for the store; the late hit is dropped. The hedge time passes
// on a fake clock while the fetch is held.
TEST(EngineSchedulerTest, AFetchPastItsHedgeTimeIsGivenUpForACompute) {
  const TokenPrompt p = Prompt({2, 4}, 1);
  GatedGetStore store;
  auto writer = MakeEngine(1024, &store);
  auto ref = writer->RunTokens(p, Options(4));
  ASSERT_TRUE(ref.ok()) << ref.status();
  for (int i = 0; i < 200 && store.Puts() < 3; ++i) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_EQ(store.Puts(), 3);  // two documents and the prefix block

  FakeClock clock;
  auto reader = WarmReader(&store, &clock);
  store.SetClosed(true);
  const int gets_before = store.Gets();
  absl::StatusOr<TokenResult> r;
  std::thread request([&] { r = reader->RunTokens(p, Options(4)); });
  // The fetch thread holds the first block's hit; then the hedge time passes.
  for (int i = 0; i < 500 && store.GatedHits() == 0; ++i) absl::SleepFor(absl::Milliseconds(2));
  ASSERT_EQ(store.GatedHits(), 1);
  clock.Advance(absl::Seconds(1));
  request.join();
  store.SetClosed(false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->token_ids, ref->token_ids);
  // Nothing has been fetched before, so the blocks were fetched (the fetch
  // thread took the first and then found the others given up) and computed when
  // the first fetch stalled.
  EXPECT_GE(store.Gets() - gets_before, 1);
  EXPECT_EQ(r->usage.store_document_tokens, 0);
  EXPECT_EQ(r->usage.computed_tokens, ref->usage.computed_tokens);
}

// A kvstore that answers Gets but times out every Put while `slow_puts` is set (as one writing
// 268 MB documents past the 10 s deadline did on the H200).
class SlowPutStore : public MemoryDocumentStore {
 public:
  absl::Status Put(const std::string &ns, const std::string &id,
                   const StoredDocument &doc) override {
    if (slow_puts.load()) {
      failed_puts.fetch_add(1);
      return absl::DeadlineExceededError("put past its deadline");
    }
    return MemoryDocumentStore::Put(ns, id, doc);
  }
  std::atomic<bool> slow_puts{false};
  std::atomic<int> failed_puts{0};
};

// A failed write-back pauses write-backs only: the documents already in the store are still
// fetched by the next request (before, the worker skipped the store for Gets as well).
TEST(EngineSchedulerTest, AFailedWriteBackDoesNotStopFetches) {
  const TokenPrompt stored = Prompt({2, 4}, 1);
  SlowPutStore store;
  auto writer = MakeEngine(1024, &store);
  ASSERT_TRUE(writer->RunTokens(stored, Options(4)).ok());
  for (int i = 0; i < 200 && store.Puts() < 3; ++i) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_EQ(store.Puts(), 3);  // two documents and the prefix block

  store.slow_puts = true;
  auto reader = MakeEngine(1024, &store);
  // A request with a document the store lacks: computed, its write-back fails.
  ASSERT_TRUE(reader->RunTokens(Prompt({3}, 2), Options(2)).ok());
  for (int i = 0; i < 200 && store.failed_puts.load() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_GT(store.failed_puts.load(), 0);
  auto r = reader->RunTokens(Prompt({2, 4}, 3), Options(2));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->usage.document_tokens, 0);
  EXPECT_EQ(r->usage.store_document_tokens, r->usage.document_tokens);
}

// A kvstore whose stored copy of some documents went bad on disk: their Gets answer DATA_LOSS
// (as a shard does, which then drops the value) until a Put stores them again.
class RottenStore : public MemoryDocumentStore {
 public:
  absl::StatusOr<StoredDocument> Get(const std::string &ns, const std::string &id) override {
    {
      absl::MutexLock l(&mu);
      if (rotten.erase(ns + "/" + id) > 0) {
        ++gets;
        docs.erase(ns + "/" + id);
        return absl::DataLossError("chunk 0 failed its CRC-32C check on disk");
      }
    }
    return MemoryDocumentStore::Get(ns, id);
  }
  std::set<std::string> rotten;  // guarded by mu
};

// Bit rot (issue 28): a document whose stored copy is corrupt is recomputed and written back
// over it; the store is not marked down for it, so the request after it still fetches from the
// store at once.
TEST(EngineSchedulerTest, ACorruptStoredDocumentIsRecomputedAndWrittenBackNotMarkedDown) {
  const TokenPrompt stored = Prompt({2, 4}, 1);
  RottenStore store;
  {
    auto writer = MakeEngine(1024, &store);
    ASSERT_TRUE(writer->RunTokens(stored, Options(4)).ok());
    for (int i = 0; i < 200 && store.Puts() < 3; ++i) absl::SleepFor(absl::Milliseconds(10));
    ASSERT_EQ(store.Puts(), 3);  // two documents and the prefix block
  }
  auto reader = MakeEngine(1024, &store);
  const TokenPrompt first = Prompt({2}, 2), second = Prompt({4}, 3);
  const std::string rotten_id = reader->BlockId(first.documents[0], "");
  {
    absl::MutexLock l(&store.mu);
    store.rotten.insert("/" + rotten_id);
  }
  auto a = reader->RunTokens(first, Options(2));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->usage.computed_tokens, a->usage.document_tokens + int64_t(first.suffix.size()) -
                                          a->usage.store_document_tokens -
                                          a->usage.pool_document_tokens);
  auto b = reader->RunTokens(second, Options(2));  // right after: the store is not down
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_GT(b->usage.store_document_tokens, 0);
  // The recomputed document was written back over the corrupt copy.
  auto written_back = [&] {
    absl::MutexLock l(&store.mu);
    return store.docs.count("/" + rotten_id) == 1;
  };
  for (int i = 0; i < 200 && !written_back(); ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_TRUE(written_back());
}

class CountingBackend final : public engine_test::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  absl::Status ExportKv(const std::vector<int32_t> &pages, int n, std::string *out) override {
    exports.fetch_add(1);
    return ForwardingBackend::ExportKv(pages, n, out);
  }
  std::atomic<int> exports{0};
};

// While write-backs are paused (a Put failed less than 2 s ago) a computed
// document is not copied to the host for a write-back that would only be
// skipped (268 MB per document on the 8B model, on the scheduler thread). The
// pause is measured on a fake clock: it lasts until the test moves the clock
// past it, and then computed documents are exported again.
TEST(EngineSchedulerTest, NoExportWhileWriteBacksArePaused) {
  SlowPutStore store;
  store.slow_puts = true;
  FakeClock clock;
  CountingBackend *backend = nullptr;
  auto engine = MakeEngine(
      1024, &store, 256, 64,
      [&](std::unique_ptr<Backend> inner) {
        auto b = std::make_unique<CountingBackend>(std::move(inner));
        backend = b.get();
        return std::unique_ptr<Backend>(std::move(b));
      },
      kDefaultMaxWritebackBytes, &clock);
  ASSERT_NE(backend, nullptr);
  // The first block computed is exported and its Put fails (the documents after
  // it may be computed within the pause that starts then).
  ASSERT_TRUE(engine->RunTokens(Prompt({2, 4}, 1), Options(2)).ok());
  for (int i = 0; i < 200 && store.failed_puts.load() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_GT(store.failed_puts.load(), 0);
  const int exports = backend->exports.load();
  EXPECT_GE(exports, 1);
  EXPECT_LE(exports, 3);  // two documents and the prefix block at most
  // A new document, computed within the pause: no export.
  auto r = engine->RunTokens(Prompt({3}, 2), Options(2));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->usage.computed_tokens, int64_t(Prompt({3}, 2).suffix.size()));
  EXPECT_EQ(backend->exports.load(), exports);
  // Past the pause, with a store that keeps Puts again: the next new document
  // is exported and written back.
  absl::SleepFor(absl::Milliseconds(50));  // the write-back thread has skipped the rest
  store.slow_puts = false;
  clock.Advance(absl::Seconds(3));
  const int puts = store.Puts();
  ASSERT_TRUE(engine->RunTokens(Prompt({1}, 3), Options(2)).ok());
  EXPECT_EQ(backend->exports.load(), exports + 1);
  for (int i = 0; i < 200 && store.Puts() < puts + 1; ++i) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_GE(store.Puts(), puts + 1);
}

// A kvstore whose Puts wait until `open` is set.
class GatedPutStore : public MemoryDocumentStore {
 public:
  absl::Status Put(const std::string &ns, const std::string &id,
                   const StoredDocument &doc) override {
    {
      absl::MutexLock l(&gate_mu);
      gate_mu.Await(absl::Condition(&open));
    }
    return MemoryDocumentStore::Put(ns, id, doc);
  }
  absl::Mutex gate_mu;
  bool open = false;
};

// EngineOptions::max_writeback_bytes: host bytes of KV waiting for the store. With a bound
// below one document, one write-back is let through while none is pending and the documents
// computed while it is sent are neither exported nor queued; once it is sent, the next is.
TEST(EngineSchedulerTest, WriteBacksWaitingForTheStoreAreBoundedInBytes) {
  GatedPutStore store;
  CountingBackend *backend = nullptr;
  auto engine = MakeEngine(
      1024, &store, 256, 64,
      [&](std::unique_ptr<Backend> inner) {
        auto b = std::make_unique<CountingBackend>(std::move(inner));
        backend = b.get();
        return std::unique_ptr<Backend>(std::move(b));
      },
      /*max_writeback_bytes=*/1);
  ASSERT_NE(backend, nullptr);
  // The prefix block and two documents computed; the first one's Put is held at the gate.
  ASSERT_TRUE(engine->RunTokens(Prompt({2, 4}, 1), Options(2)).ok());
  EXPECT_EQ(backend->exports.load(), 1);
  {
    absl::MutexLock l(&store.gate_mu);
    store.open = true;
  }
  for (int i = 0; i < 200 && store.Puts() < 1; ++i) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(store.Puts(), 1);
  absl::SleepFor(absl::Milliseconds(50));  // the write-back thread is done with it
  // Nothing pending: the next computed document is exported and written back.
  ASSERT_TRUE(engine->RunTokens(Prompt({3}, 2), Options(2)).ok());
  EXPECT_EQ(backend->exports.load(), 2);
  for (int i = 0; i < 200 && store.Puts() < 2; ++i) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(store.Puts(), 2);
}

TEST(EngineSchedulerTest, PagePressurePreemptsWithoutChangingOutputs) {
  const auto ps = Workload();
  auto big = MakeEngine(1024);
  std::vector<std::vector<int32_t>> ref;
  for (const auto &p : ps) ref.push_back(big->RunTokens(p, Options(40))->token_ids);
  // 22 pages: the five documents alone need 16, each request 1-4 of its own, so twelve
  // concurrent requests cannot all keep their documents resident.
  auto small = MakeEngine(22);
  EXPECT_EQ(RunConcurrently(*small, ps, 40), ref);
  // A caller sees its result before the scheduler drops the request from its running list.
  EngineStats s = small->Stats();
  for (int i = 0; i < 200 && s.running > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    s = small->Stats();
  }
  EXPECT_GT(s.evictions + s.preemptions, 0);
  EXPECT_EQ(s.pages_pinned, 0);
  EXPECT_EQ(s.running, 0);
}

// MATERIALIZE requests each need their own copy of their documents. With room for only a few
// at once, admission must queue the rest instead of admitting them all and preempting in a
// loop (seen on the H200 before page-aware admission: thousands of preemptions, deadlines).
TEST(EngineSchedulerTest, AdmissionQueuesMaterializeRequestsThatDoNotFitInsteadOfThrashing) {
  const auto ps = Workload();
  TokenRunOptions o = Options(40);
  o.mode = AttentionMode::kMaterialize;
  auto big = MakeEngine(1024);
  std::vector<std::vector<int32_t>> ref;
  for (const auto &p : ps) ref.push_back(big->RunTokens(p, o)->token_ids);
  auto small = MakeEngine(60);  // a request needs ~12 pages of its own + ~6 of documents
  std::vector<std::vector<int32_t>> out(ps.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ps.size(); ++i) {
    threads.emplace_back([&, i] {
      auto r = small->RunTokens(ps[i], o);
      EXPECT_TRUE(r.ok()) << r.status();
      if (r.ok()) out[i] = r->token_ids;
    });
  }
  for (auto &t : threads) t.join();
  EXPECT_EQ(out, ref);
  const EngineStats s = small->Stats();
  EXPECT_EQ(s.preemptions, 0);
  EXPECT_EQ(s.pages_pinned, 0);
}

TEST(EngineSchedulerTest, FullQueueIsResourceExhausted) {
  auto e = MakeEngine(1024, nullptr, /*max_waiting=*/1, /*max_running=*/1);
  std::atomic<int> exhausted{0}, ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 5; ++i) {
    threads.emplace_back([&, i] {
      auto r = e->RunTokens(Prompt({1}, i), Options(300));
      if (r.ok()) ++ok;
      if (absl::IsResourceExhausted(r.status())) ++exhausted;
    });
  }
  for (auto &t : threads) t.join();
  EXPECT_GE(exhausted.load(), 1);
  EXPECT_GE(ok.load(), 1);
  EXPECT_EQ(ok + exhausted, 5);
}

TEST(EngineSchedulerTest, CancellationAndDeadlinesFreePages) {
  auto e = MakeEngine(1024);
  const TokenPrompt p = Prompt({1, 2}, 0);
  ASSERT_TRUE(e->RunTokens(p, Options(2)).ok());
  const int free_before = e->pages().num_free();
  std::atomic<int> seen{0};
  TokenRunOptions o = Options(1500);
  o.is_cancelled = [&] { return seen.load() >= 3; };
  auto r = e->RunTokens(p, o, [&](int32_t) {
    ++seen;
    return true;
  });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(e->pages().num_free(), free_before);
  o = Options(1500);
  o.deadline = absl::Now() + absl::Milliseconds(30);
  EXPECT_EQ(e->RunTokens(p, o).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(e->pages().num_free(), free_before);
  o.deadline = absl::Now() - absl::Seconds(1);
  EXPECT_EQ(e->RunTokens(p, o).status().code(), absl::StatusCode::kDeadlineExceeded);
  // Stopping from the callback (a stop string) ends OK with what was delivered.
  auto stopped = e->RunTokens(p, Options(50), [&](int32_t) { return false; });
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->token_ids.size(), 1u);
  EXPECT_EQ(stopped->finish_reason, FinishReason::kStop);
  EXPECT_EQ(e->pages().num_free(), free_before);
}

TEST(EngineSchedulerTest, StoreDownFallsBackToCompute) {
  MemoryStore store;
  store.down = true;
  auto e = MakeEngine(1024, &store);
  auto r = e->RunTokens(Prompt({3, 4}, 1), Options(4));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->usage.store_document_tokens, 0);
  EXPECT_EQ(r->usage.computed_tokens, Prompt({3, 4}, 1).total_tokens());
}

// Engine::EncodeDocuments: documents made resident (and written back) without a
// request, left unpinned; a request then finds them in the pool; encoding them
// again computes nothing.
TEST(EngineSchedulerTest, EncodeDocumentsMakesDocumentsResidentWithoutARequest) {
  MemoryStore store;
  auto e = MakeEngine(1024, &store);
  const TokenPrompt p = Prompt({1, 2}, 4);
  auto encoded = e->EncodeDocuments(p.documents, "");
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  ASSERT_EQ(encoded->size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ((*encoded)[i].id, e->BlockId(p.documents[i], ""));
    EXPECT_EQ((*encoded)[i].num_tokens, int(p.documents[i].size()));
    EXPECT_TRUE((*encoded)[i].computed);
    EXPECT_TRUE(e->documents().Contains((*encoded)[i].id));
  }
  EngineStats s = e->Stats();
  for (int i = 0; i < 200 && s.running > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
    s = e->Stats();
  }
  EXPECT_EQ(s.pages_pinned, 0);
  EXPECT_EQ(s.running, 0);
  for (int i = 0; i < 200 && store.Puts() < 2; ++i) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(store.Puts(), 2);  // the documents only: no prefix block, no query
  auto r = e->RunTokens(p, Options(2));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->usage.pool_document_tokens, r->usage.document_tokens);
  auto again = e->EncodeDocuments(p.documents, "");
  ASSERT_TRUE(again.ok()) << again.status();
  for (const EncodedDocument &d : *again) EXPECT_FALSE(d.computed);
  EXPECT_EQ(e->EncodeDocuments({{}}, "").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e->EncodeDocuments({{1, 1 << 30}}, "").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A bulk preparation larger than the pool does not push out the documents requests use: the
// documents it made resident that no request has used yet are evicted first (Engine::
// EncodeDocuments runs 8 documents at a time; the pool holds the first 8 beside the used ones).
TEST(EngineSchedulerTest, APreparationLargerThanThePoolKeepsTheDocumentsRequestsUse) {
  auto e = MakeEngine(40);
  const TokenPrompt used = Prompt({1, 2}, 4);  // 3 + 3 pages of documents, 1 of prefix
  ASSERT_TRUE(e->RunTokens(used, Options(2)).ok());
  std::vector<std::vector<int32_t>> bulk;  // 29 + 30 pages of documents 3..10 and 11..18
  for (int d = 3; d <= 18; ++d) bulk.push_back(Prompt({d}, 0).documents[0]);
  auto encoded = e->EncodeDocuments(bulk, "");
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  int resident = 0;
  for (const EncodedDocument &d : *encoded) resident += e->documents().Contains(d.id) ? 1 : 0;
  EXPECT_GT(resident, 0);
  EXPECT_LT(resident, int(bulk.size()));
  for (const auto &doc : used.documents) EXPECT_TRUE(e->documents().Contains(e->BlockId(doc, "")));
  auto r = e->RunTokens(used, Options(2));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->usage.pool_document_tokens, r->usage.document_tokens);
}

// A document named only by id is read from the store once: FetchDocumentTokens
// (for its tokens) keeps what it read, and the request that follows imports it
// (a store hit in its usage) instead of reading it again.
TEST(EngineSchedulerTest, ADocumentKnownOnlyByIdIsReadFromTheStoreOnce) {
  MemoryStore store;
  const TokenPrompt p = Prompt({3}, 5);
  {
    auto writer = MakeEngine(1024, &store);
    ASSERT_TRUE(writer->RunTokens(p, Options(2)).ok());
    for (int i = 0; i < 200 && store.Puts() < 2; ++i) absl::SleepFor(absl::Milliseconds(5));
    ASSERT_EQ(store.Puts(), 2);  // the document and the prefix block
  }
  auto reader = MakeEngine(1024, &store);
  const std::string id = reader->BlockId(p.documents[0], "");
  const int gets_before = store.Gets();
  auto tokens = reader->FetchDocumentTokens("", id);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(*tokens, p.documents[0]);
  EXPECT_EQ(store.Gets() - gets_before, 1);
  auto r = reader->RunTokens(p, Options(2));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->usage.store_document_tokens, r->usage.document_tokens);
  EXPECT_EQ(store.Gets() - gets_before, 2);  // and the prefix block
  std::string other = id;
  other[0] = id[0] == '0' ? '1' : '0';
  EXPECT_EQ(reader->FetchDocumentTokens("", other).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace lazyrag
