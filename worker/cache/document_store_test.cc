// The kvstore-backed document store against a kvstore server on loopback whose engine takes
// 400 ms to begin every Put: a write-back gets its own deadline (put_timeout_s), not the read's;
// Contains on it and on the embedded store.
#include "worker/cache/document_store.h"

#include <gtest/gtest.h>

#include <atomic>

#include "absl/time/clock.h"
#include "kvstore/kv_engine.h"
#include "kvstore/kvstore_server.h"
#include "kvstore/tests/forwarding_engine.h"
#include "kvstore/tests/test_util.h"

namespace lazyrag {
namespace {

constexpr absl::Duration kPutDelay = absl::Milliseconds(400);

class SlowPutEngine final : public kvstore::testing::ForwardingEngine {
 public:
  using ForwardingEngine::ForwardingEngine;
  absl::StatusOr<std::unique_ptr<kvstore::PutSession>> BeginPut(
      std::string_view key, const kvstore::ValueLayout& layout) override {
    absl::SleepFor(kPutDelay);
    return ForwardingEngine::BeginPut(key, layout);
  }
};

class DocumentStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kvstore::KvStoreServerOptions options;
    options.metrics_port = -1;
    server_ = std::make_unique<kvstore::KvStoreServer>(
        options,
        [this](kvstore::KvStoreMetrics* metrics)
            -> absl::StatusOr<std::unique_ptr<kvstore::KvEngine>> {
          kvstore::RocksEngineOptions o;
          o.data_dir = dir_.path() + "/db";
          o.capacity_bytes = 64 << 20;
          o.sync_commits = false;
          o.metrics = metrics;
          auto inner = kvstore::OpenRocksEngine(o);
          if (!inner.ok()) return inner.status();
          return std::unique_ptr<kvstore::KvEngine>(new SlowPutEngine(std::move(*inner)));
        });
    ASSERT_TRUE(server_->Start().ok());
  }
  absl::StatusOr<std::unique_ptr<DocumentStore>> Open(double get_s, double put_s) {
    DocumentStoreOptions o;
    o.spec = server_->address();
    o.model_fingerprint = "test-model";
    o.call_timeout_s = get_s;
    o.put_timeout_s = put_s;
    return OpenDocumentStore(o);
  }

  kvstore::testing::TempDir dir_;
  std::unique_ptr<kvstore::KvStoreServer> server_;
};

TEST_F(DocumentStoreTest, WriteBacksHaveTheirOwnDeadline) {
  const StoredDocument doc{"meta", kvstore::testing::PatternBytes(5'000'000, 7), ""};
  // A read deadline shorter than the store's Put: the write-back still lands.
  auto patient = Open(/*get_s=*/0.1, /*put_s=*/10);
  ASSERT_TRUE(patient.ok()) << patient.status();
  const absl::Status put = (*patient)->Put("ns", "doc", doc);
  EXPECT_TRUE(put.ok()) << put;
  // A Put deadline shorter than the store's Put: it fails, and says why.
  auto hasty = Open(/*get_s=*/10, /*put_s=*/0.1);
  ASSERT_TRUE(hasty.ok()) << hasty.status();
  const absl::Status late = (*hasty)->Put("ns", "other", doc);
  EXPECT_FALSE(late.ok());
  EXPECT_NE(late.message().find("DEADLINE_EXCEEDED"), std::string::npos) << late;
  // Reads keep their own deadline (no Put delay on this path).
  auto got = (*hasty)->Get("ns", "doc");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->metadata, "meta");
  EXPECT_EQ(got->bytes, doc.bytes);
}

// Contains answers from the store's index (Stat), for the kvstore service and the embedded
// engine alike.
TEST_F(DocumentStoreTest, ContainsSaysWhatIsStored) {
  auto remote = Open(/*get_s=*/10, /*put_s=*/10);
  ASSERT_TRUE(remote.ok()) << remote.status();
  DocumentStoreOptions eo;
  eo.spec = "embedded:" + dir_.path() + "/embedded";
  eo.model_fingerprint = "test-model";
  auto embedded = OpenDocumentStore(eo);
  ASSERT_TRUE(embedded.ok()) << embedded.status();
  const StoredDocument doc{"meta", kvstore::testing::PatternBytes(300'000, 3), ""};
  for (DocumentStore* store : {remote->get(), embedded->get()}) {
    SCOPED_TRACE(store->name());
    const auto has = [&](const std::string& ns, const std::string& id) {
      auto r = store->Contains(ns, id);
      EXPECT_TRUE(r.ok()) << r.status();
      return r.ok() && *r;
    };
    EXPECT_FALSE(has("ns", "doc"));
    ASSERT_TRUE(store->Put("ns", "doc", doc).ok());
    EXPECT_TRUE(has("ns", "doc"));
    EXPECT_FALSE(has("other-ns", "doc"));
    EXPECT_FALSE(has("ns", "other"));
  }
}

TEST_F(DocumentStoreTest, RejectsNonPositiveDeadlines) {
  for (auto [get_s, put_s] : {std::pair{0.0, 60.0}, {10.0, 0.0}, {-1.0, 60.0}, {10.0, -5.0}}) {
    auto store = Open(get_s, put_s);
    EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument)
        << get_s << " " << put_s << ": " << store.status();
  }
}

}  // namespace
}  // namespace lazyrag
