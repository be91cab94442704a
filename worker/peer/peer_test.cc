// The peer tier in-process: PeerFirstStore against a real PeerDocumentsService on a loopback
// port (hits, misses, a peer that goes down, a peer that corrupts chunks, the kvstore behind),
// the service's bad-input statuses, and two engines where the second takes documents from the
// first's pool instead of computing them. The fast path's protocol on the CPU: the lease table
// (grant, release, expiry, bad input), and two engines over a test backend that "shares" its pool
// in-process, where the second copies pages by lease, falls back to bytes when the copy fails,
// and uses bytes when the peer cannot lend (the CPU backend).
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/crc32c.h"
#include "common/document_id.h"
#include "common/grpc_server.h"
#include "common/metrics.h"
#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/engine/document_codec.h"
#include "worker/cache/memory_store_test_util.h"
#include "worker/engine/engine.h"
#include "worker/engine/engine_test_util.h"
#include "worker/model/model_source.h"
#include "worker/peer/peer_service.h"
#include "worker/peer/peer_store.h"

namespace lazyrag {
namespace {

constexpr char kFingerprint[] = "model-fp";

using MemoryStore = MemoryDocumentStore;

// Wraps a store it does not own (the tests keep a pointer to look at its counters).
class Borrowed : public DocumentStore {
 public:
  explicit Borrowed(DocumentStore *s) : s_(s) {}
  std::string name() const override { return s_->name(); }
  absl::StatusOr<StoredDocument> Get(const std::string &ns, const std::string &id) override {
    return s_->Get(ns, id);
  }
  absl::Status Put(const std::string &ns, const std::string &id, const StoredDocument &d) override {
    return s_->Put(ns, id, d);
  }

 private:
  DocumentStore *s_;
};

std::string Bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char &c : s) c = char(rng());
  return s;
}

double Metric(const metrics::Registry &r, const std::string &line_prefix) {
  const std::string text = r.Serialize();
  size_t pos = 0;
  while ((pos = text.find(line_prefix + " ", pos)) != std::string::npos) {
    if (pos == 0 || text[pos - 1] == '\n') return std::stod(text.substr(pos + line_prefix.size()));
    ++pos;
  }
  return -1;
}

// A worker's PeerDocuments service over a map of documents, on a loopback port.
class FakePeer {
 public:
  explicit FakePeer(PeerServiceOptions o = {}) {
    if (o.model_fingerprint.empty()) o.model_fingerprint = kFingerprint;
    service_ = std::make_unique<PeerDocumentsService>(
        [this](const std::string &id) -> absl::StatusOr<StoredDocument> {
          calls.fetch_add(1);
          if (block_ != nullptr) block_->WaitForNotification();
          absl::MutexLock l(&mu_);
          auto it = docs_.find(id);
          if (it == docs_.end()) return absl::NotFoundError("not resident");
          return it->second;
        },
        o);
    server_ = std::make_unique<GrpcServer>(GrpcServerOptions{});
    server_->AddService(service_.get());
    EXPECT_TRUE(server_->Start().ok());
  }
  void Add(const std::string &id, StoredDocument d) {
    absl::MutexLock l(&mu_);
    docs_[id] = std::move(d);
  }
  std::string address() const { return server_->address(); }
  void Stop() { server_->Shutdown(absl::Now()); }
  void BlockExports(absl::Notification *n) { block_ = n; }
  std::atomic<int> calls{0};

 private:
  absl::Mutex mu_;
  std::map<std::string, StoredDocument> docs_;
  absl::Notification *block_ = nullptr;
  std::unique_ptr<PeerDocumentsService> service_;
  std::unique_ptr<GrpcServer> server_;
};

std::unique_ptr<DocumentStore> PeerStore(std::vector<std::string> peers, DocumentStore *inner,
                                         metrics::Registry *registry = nullptr,
                                         uint32_t chunk_size = 0) {
  PeerStoreOptions o;
  o.peers = std::move(peers);
  o.model_fingerprint = kFingerprint;
  o.call_timeout_s = 5;
  o.down_s = 60;
  o.chunk_size = chunk_size;
  o.registry = registry;
  auto s = OpenPeerFirstStore(o, inner ? std::make_unique<Borrowed>(inner) : nullptr);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(*s);
}

TEST(PeerStoreTest, PeerHitNeverReachesTheKvstoreAndIsCheckedChunkByChunk) {
  FakePeer a, b;
  const StoredDocument doc{"meta", Bytes(10'000, 1), ""};
  b.Add("d1", doc);
  MemoryStore kv;
  metrics::Registry reg;
  // 1000-byte chunks: the document travels as 10 checked chunks; a asks first and misses.
  auto store = PeerStore({a.address(), b.address()}, &kv, &reg, 1000);
  auto got = store->Get("ns", "d1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->metadata, "meta");
  EXPECT_EQ(got->bytes, doc.bytes);
  EXPECT_EQ(got->origin, "peer");
  EXPECT_EQ(kv.Gets(), 0);
  EXPECT_EQ(Metric(reg, "lazyrag_worker_peer_fetch_total{result=\"hit\"}"), 1);
  EXPECT_EQ(Metric(reg, "lazyrag_worker_peer_fetch_total{result=\"miss\"}"), 1);
  EXPECT_EQ(Metric(reg, "lazyrag_worker_peer_fetch_bytes_total"), 10'000);
  // Put goes to the kvstore only; a document no peer holds comes from it.
  ASSERT_TRUE(store->Put("ns", "d2", StoredDocument{"m2", "payload", ""}).ok());
  EXPECT_EQ(kv.Puts(), 1);
  EXPECT_TRUE(store->durable());
  got = store->Get("ns", "d2");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->bytes, "payload");
  EXPECT_EQ(got->origin, "");
  EXPECT_EQ(kv.Gets(), 1);
  EXPECT_EQ(store->Get("ns", "d3").status().code(), absl::StatusCode::kNotFound);
}

TEST(PeerStoreTest, EmptyDocumentAndExactChunkMultiples) {
  FakePeer p;
  p.Add("empty", StoredDocument{"m", "", ""});
  p.Add("exact", StoredDocument{"m", Bytes(4096, 2), ""});
  auto store = PeerStore({p.address()}, nullptr, nullptr, 1024);
  auto e = store->Get("", "empty");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->bytes, "");
  auto x = store->Get("", "exact");
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ(x->bytes.size(), 4096u);
}

TEST(PeerStoreTest, PeersOnlyMissIsNotFoundAndKeepsNothing) {
  FakePeer p;
  auto store = PeerStore({p.address()}, nullptr);
  EXPECT_FALSE(store->durable());
  auto got = store->Get("ns", "nope");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(got.status().message().find("no peer holds"), std::string::npos);
  EXPECT_TRUE(store->Put("ns", "x", StoredDocument{}).ok());
}

TEST(PeerStoreTest, DownPeerFallsBackToTheKvstoreAndIsSkippedAfterwards) {
  auto peer = std::make_unique<FakePeer>();
  peer->Add("d", StoredDocument{"m", "kv-bytes-from-peer", ""});
  const std::string address = peer->address();
  MemoryStore kv;
  kv.docs["ns/d"] = StoredDocument{"m", "kv-bytes", ""};
  metrics::Registry reg;
  auto store = PeerStore({address}, &kv, &reg);
  ASSERT_EQ(store->Get("ns", "d")->origin, "peer");
  peer->Stop();
  peer.reset();
  auto got = store->Get("ns", "d");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->bytes, "kv-bytes");
  EXPECT_EQ(Metric(reg, "lazyrag_worker_peer_fetch_total{result=\"unavailable\"}"), 1);
  // Marked down: the next Get does not even try it.
  ASSERT_TRUE(store->Get("ns", "d").ok());
  EXPECT_EQ(Metric(reg, "lazyrag_worker_peer_fetch_total{result=\"skipped\"}"), 1);
  EXPECT_EQ(kv.Gets(), 2);
  // The kvstore down too: its own error comes back (the engine then computes).
  kv.down = true;
  EXPECT_EQ(store->Get("ns", "d").status().code(), absl::StatusCode::kUnavailable);
}

TEST(PeerStoreTest, GetFromFrontTiersAsksThePeersOnly) {
  FakePeer p;
  p.Add("d", StoredDocument{"m", "b", ""});
  MemoryStore kv;
  auto store = PeerStore({p.address()}, &kv);
  auto got = store->GetFromFrontTiers("ns", "d");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->origin, "peer");
  EXPECT_EQ(store->GetFromFrontTiers("ns", "other").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(kv.Gets(), 0);
}

// A peer whose chunks fail their checksum, or whose stream is cut short.
class CorruptPeer final : public v1::PeerDocuments::Service {
 public:
  explicit CorruptPeer(bool truncate) : truncate_(truncate) {}
  grpc::Status GetDocument(grpc::ServerContext *, const v1::PeerGetRequest *,
                           grpc::ServerWriter<v1::PeerGetResponse> *w) override {
    v1::PeerGetResponse m;
    m.mutable_header()->set_total_size(20);
    m.mutable_header()->set_chunk_size(10);
    m.mutable_header()->set_num_chunks(2);
    w->Write(m);
    m.Clear();
    m.mutable_chunk()->set_index(0);
    m.mutable_chunk()->set_data("0123456789");
    m.mutable_chunk()->set_crc32c(truncate_ ? Crc32c("0123456789") : 12345);
    w->Write(m);
    return grpc::Status::OK;  // truncate: the second chunk never comes
  }

 private:
  bool truncate_;
};

TEST(PeerStoreTest, CorruptOrTruncatedPeerIsDataLossAndTheKvstoreServes) {
  for (bool truncate : {false, true}) {
    SCOPED_TRACE(truncate ? "truncated" : "bad crc");
    CorruptPeer bad(truncate);
    GrpcServer server{GrpcServerOptions{}};
    server.AddService(&bad);
    ASSERT_TRUE(server.Start().ok());
    MemoryStore kv;
    kv.docs["ns/d"] = StoredDocument{"m", "good", ""};
    metrics::Registry reg;
    auto store = PeerStore({server.address()}, &kv, &reg);
    auto got = store->Get("ns", "d");
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->bytes, "good");
    EXPECT_EQ(got->origin, "");
    EXPECT_EQ(Metric(reg, "lazyrag_worker_peer_fetch_total{result=\"data_loss\"}"), 1);
    server.Shutdown(absl::Now());
  }
}

TEST(PeerStoreTest, BadOptionsAreInvalidArgument) {
  PeerStoreOptions o;
  o.model_fingerprint = kFingerprint;
  EXPECT_EQ(OpenPeerFirstStore(o, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  for (const char *bad : {"nohost", ":7000", "h:0", "h:99999", "h:x"}) {
    o.peers = {bad};
    auto s = OpenPeerFirstStore(o, nullptr);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.status().message().find(bad), std::string::npos) << s.status();
  }
  o.peers = {"127.0.0.1:7000"};
  o.model_fingerprint = "";
  EXPECT_EQ(OpenPeerFirstStore(o, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitPeerList(" a:1, b:2 ,,"), (std::vector<std::string>{"a:1", "b:2"}));
}

grpc::Status CallPeer(const std::string &address, const v1::PeerGetRequest &req,
                      int *messages = nullptr) {
  auto stub =
      v1::PeerDocuments::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto reader = stub->GetDocument(&ctx, req);
  v1::PeerGetResponse m;
  int n = 0;
  while (reader->Read(&m)) ++n;
  if (messages != nullptr) *messages = n;
  return reader->Finish();
}

TEST(PeerServiceTest, BadInputGetsAClearStatus) {
  PeerServiceOptions o;
  o.max_concurrent = 1;
  FakePeer p(o);
  p.Add("d", StoredDocument{"m", "bytes", ""});
  v1::PeerGetRequest good;
  good.set_model_fingerprint(kFingerprint);
  good.set_document_id("d");
  auto expect = [&](const v1::PeerGetRequest &r, grpc::StatusCode code, const std::string &what) {
    int messages = -1;
    grpc::Status st = CallPeer(p.address(), r, &messages);
    EXPECT_EQ(st.error_code(), code) << what << ": " << st.error_message();
    EXPECT_FALSE(st.error_message().empty()) << what;
    EXPECT_EQ(messages, 0) << what;
  };
  int messages = 0;
  ASSERT_TRUE(CallPeer(p.address(), good, &messages).ok());
  EXPECT_EQ(messages, 2);  // header + one chunk
  v1::PeerGetRequest r = good;
  r.clear_document_id();
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "empty id");
  r = good;
  r.set_document_id(std::string(300, 'a'));
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "long id");
  r = good;
  r.clear_model_fingerprint();
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "empty fingerprint");
  r = good;
  r.set_chunk_size(5 << 20);
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "chunk above 4 MiB");
  r = good;
  r.set_model_fingerprint("another-model");
  expect(r, grpc::StatusCode::FAILED_PRECONDITION, "other model");
  r = good;
  r.set_document_id("absent");
  expect(r, grpc::StatusCode::NOT_FOUND, "not resident");
  // One transfer at a time here: a second one meanwhile is RESOURCE_EXHAUSTED.
  absl::Notification release;
  p.BlockExports(&release);
  const int before = p.calls.load();
  std::thread first([&] { EXPECT_TRUE(CallPeer(p.address(), good).ok()); });
  while (p.calls.load() == before) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  expect(good, grpc::StatusCode::RESOURCE_EXHAUSTED, "busy");
  release.Notify();
  first.join();
}

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
  EXPECT_EQ(Metric(reg_b, "lazyrag_kvstore_requests_total{op=\"get\",result=\"hit\"}"), -1);
  // Equal to a fresh computation of the reordered prompt.
  auto fresh = MakeEngine(nullptr, nullptr);
  auto rf = fresh->RunTokens(p, o);
  ASSERT_TRUE(rf.ok());
  EXPECT_EQ(rb->token_ids, rf->token_ids);
  server.Shutdown(absl::Now());
}

// --- The fast path's lease table (no engine). ---

// A lender over a set of resident ids that counts pins.
struct FakeLender {
  absl::Mutex mu;
  std::map<std::string, int> pins;
  absl::Status pool_status = absl::OkStatus();
  DocumentLender Lender(const std::vector<std::string> &resident) {
    DocumentLender l;
    l.pool = [this]() -> absl::StatusOr<PeerPoolHandle> {
      if (!pool_status.ok()) return pool_status;
      PeerPoolHandle h;
      h.ipc_handle = "handle";
      h.num_layers = 2;
      h.num_pages = 8;
      h.page_size = 4;
      h.kv_dim = 8;
      h.elem_bytes = 2;
      return h;
    };
    l.pin = [this, resident](const std::string &id) -> absl::StatusOr<LentDocument> {
      if (std::find(resident.begin(), resident.end(), id) == resident.end()) {
        return absl::NotFoundError("not resident");
      }
      absl::MutexLock lock(&mu);
      ++pins[id];
      return LentDocument{{3, 5}, 6, {1, 2, 3, 4, 5, 6}};
    };
    l.unpin = [this](const std::string &id) {
      absl::MutexLock lock(&mu);
      --pins[id];
    };
    return l;
  }
  int Pins(const std::string &id) {
    absl::MutexLock lock(&mu);
    return pins[id];
  }
};

v1::PeerLeaseRequest LeaseRequest(const std::string &id, uint32_t ms = 0) {
  v1::PeerLeaseRequest r;
  r.set_model_fingerprint(kFingerprint);
  r.set_document_id(id);
  r.set_lease_ms(ms);
  return r;
}

TEST(PeerLeaseTest, GrantReleaseAndBadInput) {
  FakeLender fl;
  PeerServiceOptions o;
  o.model_fingerprint = kFingerprint;
  o.max_leases = 2;
  metrics::Registry reg;
  o.registry = &reg;
  PeerDocumentsService svc([](const std::string &) { return absl::NotFoundError("x"); }, o,
                           fl.Lender({"d"}));
  v1::PeerPoolRequest pr;
  pr.set_model_fingerprint(kFingerprint);
  auto pool = svc.Pool(pr);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->ipc_handle(), "handle");
  EXPECT_EQ(pool->page_size(), 4u);
  pr.set_model_fingerprint("other");
  EXPECT_EQ(svc.Pool(pr).status().code(), absl::StatusCode::kFailedPrecondition);
  pr.clear_model_fingerprint();
  EXPECT_EQ(svc.Pool(pr).status().code(), absl::StatusCode::kInvalidArgument);

  auto lease = svc.Lease(LeaseRequest("d"));
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_NE(lease->lease_id(), 0u);
  EXPECT_EQ(lease->expires_in_ms(), 10000u);
  EXPECT_EQ(lease->num_tokens(), 6u);
  EXPECT_EQ(lease->pages_size(), 2);
  EXPECT_EQ(lease->token_ids_size(), 6);
  EXPECT_EQ(lease->pool().ipc_handle(), "handle");
  EXPECT_EQ(fl.Pins("d"), 1);
  EXPECT_EQ(svc.leases(), 1);
  EXPECT_EQ(Metric(reg, "lazyrag_worker_peer_leases_outstanding"), 1);
  // Bad input and refusals pin nothing.
  auto code = [&](const v1::PeerLeaseRequest &r) { return svc.Lease(r).status().code(); };
  EXPECT_EQ(code(LeaseRequest("absent")), absl::StatusCode::kNotFound);
  EXPECT_EQ(code(LeaseRequest("")), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(LeaseRequest(std::string(300, 'a'))), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(LeaseRequest("d", 60001)), absl::StatusCode::kInvalidArgument);
  v1::PeerLeaseRequest other = LeaseRequest("d");
  other.set_model_fingerprint("other");
  EXPECT_EQ(code(other), absl::StatusCode::kFailedPrecondition);
  other.clear_model_fingerprint();
  EXPECT_EQ(code(other), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fl.Pins("d"), 1);
  // max_leases = 2.
  auto second = svc.Lease(LeaseRequest("d"));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(code(LeaseRequest("d")), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(fl.Pins("d"), 2);
  // Release: once each; unknown and 0 are refused.
  EXPECT_TRUE(svc.Release(lease->lease_id()).ok());
  EXPECT_EQ(fl.Pins("d"), 1);
  EXPECT_EQ(svc.Release(lease->lease_id()).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(svc.Release(987654).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(svc.Release(0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fl.Pins("d"), 1);
  // The destructor unpins what is left (here: StopLeases, then new leases are UNAVAILABLE).
  svc.StopLeases();
  EXPECT_EQ(fl.Pins("d"), 0);
  EXPECT_EQ(code(LeaseRequest("d")), absl::StatusCode::kUnavailable);
  EXPECT_EQ(fl.Pins("d"), 0);
}

TEST(PeerLeaseTest, ExpiredLeaseIsUnpinnedAndUnknownAfterwards) {
  FakeLender fl;
  PeerServiceOptions o;
  o.model_fingerprint = kFingerprint;
  metrics::Registry reg;
  o.registry = &reg;
  PeerDocumentsService svc([](const std::string &) { return absl::NotFoundError("x"); }, o,
                           fl.Lender({"d"}));
  auto short_lease = svc.Lease(LeaseRequest("d", 100));
  auto long_lease = svc.Lease(LeaseRequest("d", 30000));
  ASSERT_TRUE(short_lease.ok() && long_lease.ok());
  EXPECT_EQ(short_lease->expires_in_ms(), 100u);
  EXPECT_EQ(fl.Pins("d"), 2);
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (fl.Pins("d") != 1 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(fl.Pins("d"), 1);  // the short one expired; the long one holds
  EXPECT_EQ(svc.leases(), 1);
  EXPECT_EQ(svc.Release(short_lease->lease_id()).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Metric(reg, "lazyrag_worker_peer_leases_total{result=\"expired\"}"), 1);
  EXPECT_TRUE(svc.Release(long_lease->lease_id()).ok());
  EXPECT_EQ(fl.Pins("d"), 0);
}

TEST(PeerLeaseTest, PoolThatCannotBeLentOverGrpc) {
  // No lender at all (a service built for bytes only), and a lender whose pool is refused (the
  // CPU backend: UNIMPLEMENTED; tensor parallelism: FAILED_PRECONDITION).
  for (int variant = 0; variant < 3; ++variant) {
    FakeLender fl;
    fl.pool_status = variant == 1 ? absl::UnimplementedError("cpu backend")
                                  : absl::FailedPreconditionError("tensor parallel");
    PeerServiceOptions o;
    o.model_fingerprint = kFingerprint;
    auto svc = variant == 0 ? std::make_unique<PeerDocumentsService>(
                                  [](const std::string &) { return absl::NotFoundError("x"); }, o)
                            : std::make_unique<PeerDocumentsService>(
                                  [](const std::string &) { return absl::NotFoundError("x"); }, o,
                                  fl.Lender({"d"}));
    GrpcServer server{GrpcServerOptions{}};
    server.AddService(svc.get());
    ASSERT_TRUE(server.Start().ok());
    auto stub = v1::PeerDocuments::NewStub(
        grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
    const grpc::StatusCode want =
        variant == 2 ? grpc::StatusCode::FAILED_PRECONDITION : grpc::StatusCode::UNIMPLEMENTED;
    {
      grpc::ClientContext ctx;
      v1::PeerPoolRequest req;
      req.set_model_fingerprint(kFingerprint);
      v1::PeerPool resp;
      grpc::Status st = stub->GetPool(&ctx, req, &resp);
      EXPECT_EQ(st.error_code(), want) << variant << ": " << st.error_message();
      EXPECT_FALSE(st.error_message().empty());
    }
    {
      grpc::ClientContext ctx;
      v1::PeerLease resp;
      grpc::Status st = stub->LeaseDocument(&ctx, LeaseRequest("d"), &resp);
      EXPECT_EQ(st.error_code(), want) << variant << ": " << st.error_message();
    }
    {
      grpc::ClientContext ctx;
      v1::PeerReleaseRequest req;
      req.set_lease_id(42);
      v1::PeerReleaseResponse resp;
      grpc::Status st = stub->ReleaseLease(&ctx, req, &resp);
      EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message();
    }
    EXPECT_EQ(fl.Pins("d"), 0);
    server.Shutdown(absl::Now());
  }
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
  FastPathPair(bool a_shares, bool b_shares, absl::Duration bytes_delay = absl::ZeroDuration()) {
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

}  // namespace
}  // namespace lazyrag
