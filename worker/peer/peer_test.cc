// The peer tier in-process: PeerFirstStore against a real PeerDocumentsService on a loopback
// port (hits, misses, a peer that goes down, a peer that corrupts chunks, the kvstore behind),
// the service's bad-input statuses, and two engines where the second takes documents from the
// first's pool instead of computing them.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/crc32c.h"
#include "common/grpc_server.h"
#include "common/metrics.h"
#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/engine/document_codec.h"
#include "worker/engine/engine.h"
#include "worker/model/model_source.h"
#include "worker/peer/peer_service.h"
#include "worker/peer/peer_store.h"

namespace lazyrag {
namespace {

constexpr char kFingerprint[] = "model-fp";

// An in-memory kvstore stand-in that counts calls; fails every call while `down` is set.
class MemoryStore : public DocumentStore {
 public:
  std::string name() const override { return "memory"; }
  absl::StatusOr<StoredDocument> Get(const std::string &ns, const std::string &id) override {
    absl::MutexLock l(&mu);
    ++gets;
    if (down) return absl::UnavailableError("store down");
    auto it = docs.find(ns + "/" + id);
    if (it == docs.end()) return absl::NotFoundError("absent");
    return it->second;
  }
  absl::Status Put(const std::string &ns, const std::string &id,
                   const StoredDocument &doc) override {
    absl::MutexLock l(&mu);
    ++puts;
    if (down) return absl::UnavailableError("store down");
    docs[ns + "/" + id] = doc;
    return absl::OkStatus();
  }
  int Gets() {
    absl::MutexLock l(&mu);
    return gets;
  }
  int Puts() {
    absl::MutexLock l(&mu);
    return puts;
  }
  absl::Mutex mu;
  std::map<std::string, StoredDocument> docs;
  int gets = 0, puts = 0;
  bool down = false;
};

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
  EXPECT_TRUE(store->accepts_writes());
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
  EXPECT_FALSE(store->accepts_writes());
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

TEST(PeerStoreTest, GetWhileDownAsksThePeersOnly) {
  FakePeer p;
  p.Add("d", StoredDocument{"m", "b", ""});
  MemoryStore kv;
  auto store = PeerStore({p.address()}, &kv);
  auto got = store->GetWhileDown("ns", "d");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->origin, "peer");
  EXPECT_EQ(store->GetWhileDown("ns", "other").status().code(), absl::StatusCode::kUnavailable);
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

std::vector<int32_t> Tokens(int seed, int n) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto &x : t) x = 2 + int(rng() % 250);
  return t;
}

TEST(PeerEngineTest, ExportResidentDocumentIsTheStoredFormAndNeverComputes) {
  auto a = MakeEngine(nullptr, nullptr);
  TokenPrompt p;
  p.documents = {Tokens(1, 40), Tokens(2, 33)};
  p.suffix = Tokens(3, 5);
  TokenRunOptions o;
  o.max_tokens = 4;
  o.ignore_eos = true;
  ASSERT_TRUE(a->RunTokens(p, o).ok());
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
  p.documents = {Tokens(1, 40), Tokens(2, 33)};
  p.suffix = Tokens(3, 5);
  TokenRunOptions o;
  o.max_tokens = 4;
  o.ignore_eos = true;
  ASSERT_TRUE(a->RunTokens(p, o).ok());
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
        TokenRunOptions qo = o;
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

}  // namespace
}  // namespace lazyrag
