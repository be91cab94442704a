// The peer tier between engines on the CPU: an engine exports its resident documents, a second
// engine takes documents from the first's pool instead of computing them, and the fast path end
// to end over a test backend that "shares" its pool in-process, where the second copies pages by
// lease, falls back to bytes when the copy fails, and uses bytes when the peer cannot lend (the
// CPU backend). Part of peer_test.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/auth.h"
#include "common/grpc_server.h"
#include "common/metrics.h"
#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/engine/document_codec.h"
#include "worker/engine/engine.h"
#include "worker/engine/engine_test_util.h"
#include "worker/model/model_source.h"
#include "worker/peer/peer_service.h"
#include "worker/peer/peer_store.h"
#include "worker/peer/peer_test_util.h"

namespace lazyrag::peer_test {
namespace {

// --- Two engines: B takes A's documents from A's pool. ---

std::unique_ptr<Engine> MakeEngine(DocumentStore *store, metrics::Registry *registry) {
  auto loaded = LoadModel("synthetic:tiny");
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  auto backend = CreateCpuBackend(std::move(loaded->weights), {});
  EXPECT_TRUE(backend.ok()) << backend.status();
  EngineOptions o;
  o.num_pages = 256;
  o.page_size = 16;
  o.fingerprint = loaded->fingerprint;
  o.model_name = "tiny";
  o.store = store;
  o.registry = registry;
  auto e = Engine::Create(std::move(*backend), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(*e);
}

using engine_test::Tokens;

// One request over two documents (40 and 33 tokens) through `e`: both stay resident.
void RunTwoDocuments(Engine &e, TokenPrompt *p) {
  p->documents = {Tokens(1, 40), Tokens(2, 33)};
  p->suffix = Tokens(3, 5);
  TokenRunOptions o;
  o.max_tokens = 4;
  o.ignore_eos = true;
  ASSERT_TRUE(e.RunTokens(*p, o).ok());
}

TEST(PeerEngineTest, ExportResidentDocumentIsTheStoredFormAndNeverComputes) {
  auto a = MakeEngine(nullptr, nullptr);
  TokenPrompt p;
  ASSERT_NO_FATAL_FAILURE(RunTwoDocuments(*a, &p));
  const std::string id = a->BlockId(p.documents[1], "");
  auto doc = a->ExportResidentDocument(id);
  ASSERT_TRUE(doc.ok()) << doc.status();
  auto decoded = DecodeDocument(*doc, a->config(), a->backend().kv_dtype());
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->tokens, p.documents[1]);
  EXPECT_EQ(decoded->payload.size(),
            DocumentPayloadBytes(a->config(), a->backend().kv_dtype(), 33));
  EXPECT_EQ(a->Stats().pages_pinned, 0);  // released after the copy
  EXPECT_EQ(a->ExportResidentDocument(a->BlockId(Tokens(9, 20), "")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(a->ExportResidentDocument("").status().code(), absl::StatusCode::kNotFound);
}

TEST(PeerEngineTest, ExportsWhileRequestsRunAreConsistent) {
  auto a = MakeEngine(nullptr, nullptr);
  TokenPrompt p;
  ASSERT_NO_FATAL_FAILURE(RunTwoDocuments(*a, &p));
  const std::string id = a->BlockId(p.documents[0], "");
  auto first = a->ExportResidentDocument(id);
  ASSERT_TRUE(first.ok()) << first.status();
  std::atomic<bool> stop{false};
  std::vector<std::thread> clients;
  for (int c = 0; c < 3; ++c) {
    clients.emplace_back([&, c] {
      for (int k = 0; !stop.load(); ++k) {
        TokenPrompt q = p;
        q.documents.push_back(Tokens(100 + c * 1000 + k, 20));  // new documents keep coming
        q.suffix = Tokens(200 + k, 6);
        TokenRunOptions qo;
        qo.ignore_eos = true;
        qo.max_tokens = 8;
        EXPECT_TRUE(a->RunTokens(q, qo).ok());
      }
    });
  }
  for (int i = 0; i < 30; ++i) {
    auto again = a->ExportResidentDocument(id);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->bytes, first->bytes);
    EXPECT_EQ(again->metadata, first->metadata);
  }
  stop = true;
  for (auto &t : clients) t.join();
}

TEST(PeerEngineTest, SecondEngineTakesDocumentsFromThePeerInsteadOfComputing) {
  metrics::Registry reg_a, reg_b;
  auto a = MakeEngine(nullptr, &reg_a);
  TokenPrompt p;
  p.prefix = Tokens(7, 9);
  p.documents = {Tokens(1, 40), Tokens(2, 33), Tokens(4, 50)};
  p.suffix = Tokens(3, 5);
  TokenRunOptions o;
  o.max_tokens = 6;
  o.ignore_eos = true;
  auto ra = a->RunTokens(p, o);
  ASSERT_TRUE(ra.ok()) << ra.status();

  PeerServiceOptions so;
  so.model_fingerprint = a->options().fingerprint;
  Engine *ea = a.get();
  PeerDocumentsService service(
      [ea](const std::string &id) { return ea->ExportResidentDocument(id); }, so);
  GrpcServer server{GrpcServerOptions{}};
  server.AddService(&service);
  ASSERT_TRUE(server.Start().ok());

  MemoryStore kv;
  PeerStoreOptions po;
  po.peers = {server.address()};
  po.model_fingerprint = a->options().fingerprint;
  po.registry = &reg_b;
  auto peers = OpenPeerFirstStore(po, std::make_unique<Borrowed>(&kv));
  ASSERT_TRUE(peers.ok()) << peers.status();
  auto b = MakeEngine(peers->get(), &reg_b);
  // A new order: same documents, so the same ids.
  std::swap(p.documents[0], p.documents[2]);
  auto rb = b->RunTokens(p, o);
  ASSERT_TRUE(rb.ok()) << rb.status();
  const Usage &u = rb->usage;
  EXPECT_EQ(u.store_document_tokens, u.document_tokens);
  EXPECT_EQ(u.computed_tokens, int64_t(p.suffix.size()));
  EXPECT_EQ(kv.Gets(), 0);
  EXPECT_EQ(kv.Puts(), 0);  // what came from a peer is not written back
  EXPECT_EQ(Metric(reg_b, "lazyrag_doc_computed_total{model=\"tiny\"}"), 0);
  EXPECT_EQ(Metric(reg_b, "lazyrag_doc_cache_hits_total{model=\"tiny\",tier=\"peer\"}"), 3);
  EXPECT_EQ(Metric(reg_b, "lazyrag_worker_peer_fetch_total{result=\"hit\"}"), 4);  // + prefix
  // Created at zero, never counted.
  EXPECT_EQ(Metric(reg_b, "lazyrag_kvstore_requests_total{op=\"get\",result=\"hit\"}"), 0);
  // Equal to a fresh computation of the reordered prompt.
  auto fresh = MakeEngine(nullptr, nullptr);
  auto rf = fresh->RunTokens(p, o);
  ASSERT_TRUE(rf.ok());
  EXPECT_EQ(rb->token_ids, rf->token_ids);
  server.Shutdown(absl::Now());
}

// --- The fast path end to end on the CPU: a backend that "shares" its pool in-process. ---

// Wraps a backend and lends its pool by a name in a process-wide table; CopyPagesFromPeer copies
// whole pages from the named backend (ExportKv / ImportKv of page-aligned runs), or fails on
// demand. Stands in for the CUDA backend's IPC handle and NVLink gather.
class SharingBackend final : public engine_test::ForwardingBackend {
 public:
  explicit SharingBackend(std::unique_ptr<Backend> inner) : ForwardingBackend(std::move(inner)) {
    absl::MutexLock l(&RegistryMu());
    name_ = absl::StrCat("shared-pool-", Registry().size());
    Registry()[name_] = this->inner();
  }
  ~SharingBackend() override {
    absl::MutexLock l(&RegistryMu());
    Registry().erase(name_);
  }
  std::string name() const override { return "sharing-" + inner()->name(); }
  absl::StatusOr<PeerPoolHandle> ExportPoolHandle() override {
    PeerPoolHandle h;
    h.ipc_handle = name_;
    h.device_uuid = "host";
    h.num_layers = config().num_layers;
    h.num_pages = num_pages();
    h.page_size = page_size();
    h.kv_dim = config().kv_dim();
    h.elem_bytes = 4;
    return h;
  }
  absl::Status CopyPagesFromPeer(const PeerPoolHandle &peer, const std::vector<int32_t> &from,
                                 const std::vector<int32_t> &to) override {
    copies.fetch_add(1);
    if (fail_copies.load()) return absl::InternalError("injected copy failure");
    if (from.size() != to.size() || peer.page_size != page_size()) {
      return absl::InvalidArgumentError("layout");
    }
    Backend *src = nullptr;
    {
      absl::MutexLock l(&RegistryMu());
      auto it = Registry().find(peer.ipc_handle);
      if (it == Registry().end()) return absl::NotFoundError("no such pool");
      src = it->second;
    }
    std::string kv;
    const int n = int(from.size()) * page_size();
    if (auto st = src->ExportKv(from, n, &kv); !st.ok()) return st;
    return inner()->ImportKv(to, n, kv);
  }
  std::atomic<bool> fail_copies{false};
  std::atomic<int> copies{0};

 private:
  static absl::Mutex &RegistryMu() {
    static absl::Mutex mu;
    return mu;
  }
  static std::map<std::string, Backend *> &Registry() {
    static auto *m = new std::map<std::string, Backend *>;
    return *m;
  }
  std::string name_;
};

std::unique_ptr<Engine> MakeEngineOn(std::unique_ptr<Backend> backend, DocumentStore *store,
                                     metrics::Registry *registry) {
  auto loaded = LoadModel("synthetic:tiny");
  EngineOptions o;
  o.num_pages = 256;
  o.page_size = 16;
  o.fingerprint = loaded->fingerprint;
  o.model_name = "tiny";
  o.store = store;
  o.registry = registry;
  auto e = Engine::Create(std::move(backend), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(*e);
}

std::unique_ptr<Backend> CpuBackendFor(bool sharing, SharingBackend **out = nullptr) {
  auto loaded = LoadModel("synthetic:tiny");
  auto cpu = CreateCpuBackend(std::move(loaded->weights), {});
  EXPECT_TRUE(cpu.ok()) << cpu.status();
  if (!sharing) return std::move(*cpu);
  auto s = std::make_unique<SharingBackend>(std::move(*cpu));
  if (out != nullptr) *out = s.get();
  return s;
}

DocumentLender LenderOf(Engine *e) {
  DocumentLender l;
  l.pool = [e]() { return e->PoolHandle(); };
  l.pin = [e](const std::string &id) -> absl::StatusOr<LentDocument> {
    auto d = e->PinResidentDocument(id);
    if (!d.ok()) return d.status();
    return LentDocument{d->pages, d->num_tokens, d->tokens};
  };
  l.unpin = [e](const std::string &id) { e->UnpinDocument(id); };
  return l;
}

// A holds documents; B (fast path or not, by the backends) takes them through a PeerFirstStore.
struct FastPathPair {
  metrics::Registry reg_a, reg_b;
  std::unique_ptr<Engine> a;
  std::unique_ptr<PeerDocumentsService> service;
  std::unique_ptr<GrpcServer> server;
  MemoryStore kv;
  std::unique_ptr<DocumentStore> peers;
  SharingBackend *b_backend = nullptr;
  std::unique_ptr<Engine> b;
  TokenPrompt prompt;
  TokenRunOptions opts;

  // bytes_delay: A takes this long to export a document as bytes (leases are not delayed).
  // tokens: A's (null: no authentication); token: the one B sends (null: none).
  FastPathPair(bool a_shares, bool b_shares, absl::Duration bytes_delay = absl::ZeroDuration(),
               TokenStore *tokens = nullptr, std::shared_ptr<BearerToken> token = nullptr) {
    a = MakeEngineOn(CpuBackendFor(a_shares), nullptr, &reg_a);
    prompt.prefix = Tokens(7, 9);
    prompt.documents = {Tokens(1, 40), Tokens(2, 33), Tokens(4, 50)};
    prompt.suffix = Tokens(3, 5);
    opts.max_tokens = 6;
    opts.ignore_eos = true;
    EXPECT_TRUE(a->RunTokens(prompt, opts).ok());
    PeerServiceOptions so;
    so.model_fingerprint = a->options().fingerprint;
    so.registry = &reg_a;
    so.tokens = tokens;
    Engine *ea = a.get();
    service = std::make_unique<PeerDocumentsService>(
        [ea, bytes_delay](const std::string &id) {
          absl::SleepFor(bytes_delay);
          return ea->ExportResidentDocument(id);
        },
        so, LenderOf(ea));
    server = std::make_unique<GrpcServer>(GrpcServerOptions{});
    server->AddService(service.get());
    EXPECT_TRUE(server->Start().ok());
    PeerStoreOptions po;
    po.peers = {server->address()};
    po.model_fingerprint = a->options().fingerprint;
    po.registry = &reg_b;
    po.auth_token = std::move(token);
    auto opened = OpenPeerFirstStore(po, std::make_unique<Borrowed>(&kv));
    EXPECT_TRUE(opened.ok()) << opened.status();
    peers = std::move(*opened);
    b = MakeEngineOn(CpuBackendFor(b_shares, &b_backend), peers.get(), &reg_b);
    std::swap(prompt.documents[0], prompt.documents[2]);  // a new order, the same ids
  }
  ~FastPathPair() {
    b.reset();
    peers.reset();  // sends the releases still queued
    server->Shutdown(absl::Now());
  }
  // Waits until A holds no pin for B (releases are sent in the background).
  void ExpectAllReleased() {
    const absl::Time until = absl::Now() + absl::Seconds(5);
    while ((service->leases() != 0 || a->Stats().pages_pinned != 0) && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_EQ(service->leases(), 0);
    EXPECT_EQ(a->Stats().pages_pinned, 0);
  }
  std::vector<int32_t> Fresh() {
    auto fresh = MakeEngineOn(CpuBackendFor(false), nullptr, nullptr);
    auto rf = fresh->RunTokens(prompt, opts);
    EXPECT_TRUE(rf.ok());
    return rf.ok() ? rf->token_ids : std::vector<int32_t>{};
  }
};

TEST(PeerFastPathTest, DocumentsArriveByLeaseAndPageCopyNotBytes) {
  FastPathPair t(/*a_shares=*/true, /*b_shares=*/true);
  auto rb = t.b->RunTokens(t.prompt, t.opts);
  ASSERT_TRUE(rb.ok()) << rb.status();
  const Usage &u = rb->usage;
  EXPECT_EQ(u.store_document_tokens, u.document_tokens);
  EXPECT_EQ(u.cached_document_tokens, u.document_tokens);
  EXPECT_EQ(u.computed_tokens, int64_t(t.prompt.suffix.size()));
  EXPECT_EQ(t.kv.Gets(), 0);
  EXPECT_EQ(t.kv.Puts(), 0);
  EXPECT_EQ(t.b_backend->copies.load(), 4);  // 3 documents + the prefix block
  EXPECT_EQ(Metric(t.reg_b, "lazyrag_doc_computed_total{model=\"tiny\"}"), 0);
  EXPECT_EQ(Metric(t.reg_b, "lazyrag_doc_cache_hits_total{model=\"tiny\",tier=\"peer\"}"), 3);
  EXPECT_EQ(Metric(t.reg_b, "lazyrag_worker_peer_fetch_total{result=\"lease\"}"), 4);
  EXPECT_EQ(Metric(t.reg_b, "lazyrag_worker_peer_fetch_total{result=\"hit\"}"), 0);
  EXPECT_EQ(Metric(t.reg_b, "lazyrag_worker_peer_device_copy_total{result=\"ok\"}"), 4);
  EXPECT_GT(Metric(t.reg_b, "lazyrag_worker_peer_device_copy_bytes_total"), 0);
  EXPECT_EQ(Metric(t.reg_a, "lazyrag_worker_peer_serve_total{result=\"hit\"}"), 0);
  EXPECT_EQ(rb->token_ids, t.Fresh());
  t.ExpectAllReleased();
  EXPECT_EQ(Metric(t.reg_a, "lazyrag_worker_peer_leases_total{result=\"granted\"}"), 4);
  EXPECT_EQ(Metric(t.reg_a, "lazyrag_worker_peer_leases_total{result=\"released\"}"), 4);
  // Again with the documents in B's pool now: no peer call at all.
  auto again = t.b->RunTokens(t.prompt, t.opts);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->token_ids, rb->token_ids);
  EXPECT_EQ(t.b_backend->copies.load(), 4);
}

TEST(PeerFastPathTest, FailedCopyFallsBackToBytesAndUsageStaysRight) {
  FastPathPair t(/*a_shares=*/true, /*b_shares=*/true);
  t.b_backend->fail_copies = true;
  auto rb = t.b->RunTokens(t.prompt, t.opts);
  ASSERT_TRUE(rb.ok()) << rb.status();
  const Usage &u = rb->usage;
  EXPECT_EQ(u.store_document_tokens, u.document_tokens);
  EXPECT_EQ(u.computed_tokens, int64_t(t.prompt.suffix.size()));
  EXPECT_EQ(Metric(t.reg_b, "lazyrag_doc_computed_total{model=\"tiny\"}"), 0);
  EXPECT_EQ(Metric(t.reg_b, "lazyrag_doc_cache_hits_total{model=\"tiny\",tier=\"peer\"}"), 3);
  // The first failure turns the peer to bytes: every block then arrives as bytes.
  EXPECT_GE(Metric(t.reg_b, "lazyrag_worker_peer_device_copy_total{result=\"internal\"}"), 1);
  EXPECT_EQ(Metric(t.reg_b, "lazyrag_worker_peer_device_copy_total{result=\"ok\"}"), 0);
  EXPECT_EQ(Metric(t.reg_b, "lazyrag_worker_peer_fetch_total{result=\"hit\"}"), 4);
  EXPECT_EQ(t.kv.Gets(), 0);
  EXPECT_EQ(rb->token_ids, t.Fresh());
  t.ExpectAllReleased();
}

// After a failed device copy the document is fetched again, and that fetch is given up for a
// compute past its hedge time like a first one: here the peer then takes 1 s to send the bytes.
TEST(PeerFastPathTest, AFetchAfterAFailedCopyIsGivenUpWhenSlow) {
  FastPathPair t(/*a_shares=*/true, /*b_shares=*/true, /*bytes_delay=*/absl::Seconds(1));
  t.b_backend->fail_copies = true;
  // B has timed a forward step (a prompt without documents), so its fetches have hedge times.
  TokenPrompt warm;
  warm.suffix = Tokens(77, 64);
  ASSERT_TRUE(t.b->RunTokens(warm, t.opts).ok());
  auto rb = t.b->RunTokens(t.prompt, t.opts);
  ASSERT_TRUE(rb.ok()) << rb.status();
  EXPECT_EQ(rb->token_ids, t.Fresh());
  const double failed_copies =
      Metric(t.reg_b, "lazyrag_worker_peer_device_copy_total{result=\"internal\"}");
  EXPECT_GE(failed_copies, 1);
  // Every slow fetch was given up, those after a failed copy included (before, those waited
  // the full second and ended as peer hits).
  EXPECT_GE(Metric(t.reg_b, "lazyrag_kvstore_requests_total{op=\"get\",result=\"hedged\"}"),
            failed_copies);
  EXPECT_EQ(Metric(t.reg_b, "lazyrag_doc_cache_hits_total{model=\"tiny\",tier=\"peer\"}"), 0);
  EXPECT_EQ(rb->usage.store_document_tokens, 0);
  t.ExpectAllReleased();
}

TEST(PeerFastPathTest, PeerOnTheCpuBackendServesBytes) {
  // B could copy pages, but A's pool cannot be lent (CPU backend: UNIMPLEMENTED): path 1.
  FastPathPair t(/*a_shares=*/false, /*b_shares=*/true);
  EXPECT_EQ(t.a->PoolHandle().status().code(), absl::StatusCode::kUnimplemented);
  auto rb = t.b->RunTokens(t.prompt, t.opts);
  ASSERT_TRUE(rb.ok()) << rb.status();
  EXPECT_EQ(rb->usage.store_document_tokens, rb->usage.document_tokens);
  EXPECT_EQ(t.b_backend->copies.load(), 0);
  EXPECT_EQ(Metric(t.reg_b, "lazyrag_worker_peer_fetch_total{result=\"hit\"}"), 4);
  EXPECT_EQ(Metric(t.reg_b, "lazyrag_worker_peer_fetch_total{result=\"lease\"}"), 0);
  EXPECT_EQ(Metric(t.reg_b, "lazyrag_doc_computed_total{model=\"tiny\"}"), 0);
  EXPECT_EQ(rb->token_ids, t.Fresh());
}

TEST(PeerFastPathTest, RequesterOnTheCpuBackendNeverAsksForLeases) {
  // A could lend, B cannot copy (plain CPU backend): B never enables leases, path 1.
  FastPathPair t(/*a_shares=*/true, /*b_shares=*/false);
  auto rb = t.b->RunTokens(t.prompt, t.opts);
  ASSERT_TRUE(rb.ok()) << rb.status();
  EXPECT_EQ(Metric(t.reg_b, "lazyrag_worker_peer_fetch_total{result=\"hit\"}"), 4);
  EXPECT_EQ(Metric(t.reg_b, "lazyrag_worker_peer_fetch_total{result=\"lease\"}"), 0);
  EXPECT_EQ(Metric(t.reg_a, "lazyrag_worker_peer_leases_total{result=\"granted\"}"), 0);
  EXPECT_EQ(rb->token_ids, t.Fresh());
}

// Every call B makes on A carries B's worker token (AddBearerToken on each context): GetPool,
// LeaseDocument and ReleaseLease on the fast path, GetDocument on the bytes path. A, which takes
// worker tokens only, refuses none of them; without the token it refuses B, which computes.
TEST(PeerFastPathTest, EveryPeerCallCarriesTheWorkerToken) {
  constexpr char kWorkerToken[] = "cluster-worker-token-001";
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/peer_engine_test_tokens_", getpid());
  {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << kWorkerToken << " cluster worker\n";
  }
  metrics::Registry auth_registry;
  AuthMetrics auth(&auth_registry);
  auto tokens = TokenStore::Open(path, absl::Seconds(1), &auth);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  for (bool b_shares : {true, false}) {
    SCOPED_TRACE(b_shares ? "fast path" : "bytes");
    FastPathPair t(/*a_shares=*/true, b_shares, absl::ZeroDuration(), tokens->get(),
                   BearerToken::Fixed(kWorkerToken));
    auto rb = t.b->RunTokens(t.prompt, t.opts);
    ASSERT_TRUE(rb.ok()) << rb.status();
    EXPECT_EQ(rb->usage.store_document_tokens, rb->usage.document_tokens);
    EXPECT_EQ(Metric(t.reg_b, b_shares ? "lazyrag_worker_peer_fetch_total{result=\"lease\"}"
                                       : "lazyrag_worker_peer_fetch_total{result=\"hit\"}"),
              4);
    t.ExpectAllReleased();  // a refused ReleaseLease would leave A's pages pinned to expiry
  }
  EXPECT_EQ(auth.unauthenticated(), 0);
  EXPECT_EQ(auth.permission_denied(), 0);

  FastPathPair without(/*a_shares=*/true, /*b_shares=*/true, absl::ZeroDuration(), tokens->get(),
                       /*token=*/nullptr);
  auto rb = without.b->RunTokens(without.prompt, without.opts);
  ASSERT_TRUE(rb.ok()) << rb.status();
  EXPECT_EQ(rb->usage.store_document_tokens, 0);
  EXPECT_GE(Metric(without.reg_b, "lazyrag_worker_peer_fetch_total{result=\"unauthenticated\"}"),
            1);
  EXPECT_GE(auth.unauthenticated(), 1);
  EXPECT_EQ(rb->token_ids, without.Fresh());
  std::remove(path.c_str());
}

}  // namespace
}  // namespace lazyrag::peer_test
