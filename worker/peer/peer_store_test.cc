// PeerFirstStore (peer_store.h) against real PeerDocumentsServices on loopback ports: hits,
// misses, a peer that goes down, a peer that corrupts chunks or cuts its stream short, the kvstore
// behind, and bad options. Part of peer_test.
#include "worker/peer/peer_store.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/crc32c.h"
#include "common/metrics.h"
#include "gtest/gtest.h"
#include "worker/peer/peer_test_util.h"

namespace lazyrag::peer_test {
namespace {

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

// GetInto reads the durable store only (the engine asks the peers first, GetFromFrontTiers).
TEST(PeerStoreTest, GetIntoReadsTheKvstoreBehindThePeersOnly) {
  FakePeer a;
  a.Add("d1", StoredDocument{"peer-meta", Bytes(100, 1), ""});
  MemoryStore kv;
  ASSERT_TRUE(kv.Put("ns", "d1", StoredDocument{"kv-meta", Bytes(100, 2), ""}).ok());
  metrics::Registry reg;
  auto store = PeerStore({a.address()}, &kv, &reg);
  std::string bytes;
  auto meta = store->GetInto(
      "ns", "d1", [&](const std::string &, uint64_t n) -> absl::StatusOr<std::vector<ByteSpan>> {
        bytes.assign(n, '\0');
        return std::vector<ByteSpan>{{bytes.data(), n}};
      });
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(*meta, "kv-meta");
  EXPECT_EQ(bytes, Bytes(100, 2));
  EXPECT_EQ(Metric(reg, "lazyrag_worker_peer_fetch_total{result=\"hit\"}"), 0);
  auto without = PeerStore({a.address()}, nullptr);
  EXPECT_EQ(without->GetInto("ns", "d1", nullptr).status().code(), absl::StatusCode::kNotFound);
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
  EXPECT_EQ(store->GetFromFrontTiers("ns", "other").status().code(),
            absl::StatusCode::kUnavailable);
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

}  // namespace
}  // namespace lazyrag::peer_test
