// The kvstore service in-process over real gRPC on loopback: bad input (Must show 6), chunks
// corrupted in transit (Must show 3), layer ranges, metrics.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"
#include "common/metrics.h"
#include "kvstore/client/kvstore_client.h"
#include "kvstore/format.h"
#include "kvstore/kv_engine.h"
#include "kvstore/kvstore_metrics.h"
#include "kvstore/kvstore_server.h"
#include "kvstore/tests/forwarding_engine.h"
#include "kvstore/tests/test_util.h"
#include "lazyrag/v1/kvstore.grpc.pb.h"

namespace lazyrag::kvstore {
namespace {

namespace pb = lazyrag::v1;
using testing::PatternBytes;
using testing::TempDir;

// Wraps an engine; can flip a byte of every chunk it reads *after* the engine verified it,
// which is what a corruption between server and client looks like.
class FaultInjectingEngine final : public testing::ForwardingEngine {
 public:
  using ForwardingEngine::ForwardingEngine;
  std::atomic<bool> corrupt_reads{false};

  absl::StatusOr<std::unique_ptr<ValueReader>> Open(std::string_view key) override {
    auto reader = ForwardingEngine::Open(key);
    if (!reader.ok()) return reader.status();
    return std::unique_ptr<ValueReader>(new Reader(std::move(reader).value(), this));
  }

 private:
  class Reader final : public ValueReader {
   public:
    Reader(std::unique_ptr<ValueReader> inner, FaultInjectingEngine* engine)
        : inner_(std::move(inner)), engine_(engine) {}
    const ValueLayout& layout() const override { return inner_->layout(); }
    absl::Status ReadChunk(uint32_t index, std::string* data, uint32_t* crc) override {
      absl::Status st = inner_->ReadChunk(index, data, crc);
      if (st.ok() && engine_->corrupt_reads && !data->empty()) (*data)[data->size() / 2] ^= 1;
      return st;
    }

   private:
    std::unique_ptr<ValueReader> inner_;
    FaultInjectingEngine* engine_;
  };
};

class KvStoreServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KvStoreServerOptions options;
    options.listen = "127.0.0.1:0";
    options.metrics_port = -1;
    server_ = std::make_unique<KvStoreServer>(
        options, [this](KvStoreMetrics* metrics) -> absl::StatusOr<std::unique_ptr<KvEngine>> {
          RocksEngineOptions o;
          o.data_dir = dir_.path() + "/db";
          o.capacity_bytes = 64 << 20;
          o.sync_commits = false;
          o.metrics = metrics;
          auto inner = OpenRocksEngine(o);
          if (!inner.ok()) return inner.status();
          auto engine = std::make_unique<FaultInjectingEngine>(std::move(inner).value());
          engine_ = engine.get();
          return engine;
        });
    ASSERT_TRUE(server_->Start().ok());
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxMessageBytes);
    args.SetMaxSendMessageSize(32 << 20);  // so the oversized-chunk case reaches the server
    stub_ = pb::KvStore::NewStub(
        grpc::CreateCustomChannel(server_->address(), grpc::InsecureChannelCredentials(), args));
    KvClientOptions co;
    co.shards = {server_->address()};
    co.max_attempts = 1;
    co.registry = &client_registry_;
    client_ = std::move(KvClient::Create(co)).value();
    // A value that every bad request below must leave alone.
    ASSERT_TRUE(client_->Put(Key::Raw("keep"), {}, kKeep).ok());
  }

  void ExpectKeepUnharmed() {
    auto got = client_->Get(Key::Raw("keep"));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->bytes, kKeep);
  }

  static pb::PutRequest Header(const std::string& raw_key, uint64_t size, uint32_t chunk_size) {
    pb::PutRequest m;
    m.mutable_header()->mutable_key()->set_raw(raw_key);
    auto* v = m.mutable_header()->mutable_value();
    v->set_total_size(size);
    v->set_chunk_size(chunk_size);
    v->set_num_chunks(NumChunks(size, chunk_size));
    return m;
  }
  static pb::PutRequest Chunk(uint32_t index, const std::string& data, int crc_delta = 0) {
    pb::PutRequest m;
    m.mutable_chunk()->set_index(index);
    m.mutable_chunk()->set_data(data);
    m.mutable_chunk()->set_crc32c(Crc32c(data) + crc_delta);
    return m;
  }
  // Sends `messages` as one Put stream and returns the status.
  grpc::Status RawPut(const std::vector<pb::PutRequest>& messages) {
    grpc::ClientContext context;
    pb::PutResponse response;
    auto writer = stub_->Put(&context, &response);
    for (const auto& m : messages) {
      if (!writer->Write(m)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }
  double Counter(const std::string& line) {
    return testing::MetricValue(server_->registry().Serialize(), line);
  }

  const std::string kKeep = PatternBytes(3'000'000, 99);
  TempDir dir_;
  std::unique_ptr<KvStoreServer> server_;
  FaultInjectingEngine* engine_ = nullptr;
  std::unique_ptr<pb::KvStore::Stub> stub_;
  metrics::Registry client_registry_;
  std::unique_ptr<KvClient> client_;
};

TEST_F(KvStoreServiceTest, BadPutsGetClearStatusesAndHarmNothing) {
  const std::string a(1000, 'a'), b(1000, 'b');
  struct Case {
    const char* what;
    std::vector<pb::PutRequest> messages;
    grpc::StatusCode code;
    const char* message_part;
  };
  pb::PutRequest empty_key = Header("", 2000, 1000);
  pb::PutRequest big_key = Header(std::string(2000, 'k'), 2000, 1000);
  pb::PutRequest bad_count = Header("keep", 2000, 1000);
  bad_count.mutable_header()->mutable_value()->set_num_chunks(3);
  pb::PutRequest bad_layers = Header("keep", 2000, 1000);
  bad_layers.mutable_header()->mutable_value()->add_layer_offsets(5);
  const std::string five_mib(5 << 20, 'x');
  std::vector<Case> cases = {
      {"wrong checksum",
       {Header("keep", 2000, 1000), Chunk(0, a), Chunk(1, b, 1)},
       grpc::StatusCode::DATA_LOSS,
       "CRC-32C"},
      {"oversized chunk size in header",
       {Header("keep", 8 << 20, 8 << 20)},
       grpc::StatusCode::INVALID_ARGUMENT,
       "chunk_size"},
      {"oversized chunk",
       {Header("keep", 2000, 1000), Chunk(0, five_mib)},
       grpc::StatusCode::INVALID_ARGUMENT,
       "above the limit"},
      {"chunk of the wrong size",
       {Header("keep", 2000, 1000), Chunk(0, "short")},
       grpc::StatusCode::INVALID_ARGUMENT,
       "the header says"},
      {"chunks out of order",
       {Header("keep", 2000, 1000), Chunk(1, b), Chunk(0, a)},
       grpc::StatusCode::INVALID_ARGUMENT,
       "in order"},
      {"repeated chunk",
       {Header("keep", 2000, 1000), Chunk(0, a), Chunk(0, a)},
       grpc::StatusCode::INVALID_ARGUMENT,
       "in order"},
      {"too many chunks",
       {Header("keep", 2000, 1000), Chunk(0, a), Chunk(1, b), Chunk(2, b)},
       grpc::StatusCode::INVALID_ARGUMENT,
       "more chunks"},
      {"missing header", {Chunk(0, a), Chunk(1, b)}, grpc::StatusCode::INVALID_ARGUMENT, "header"},
      {"empty stream", {}, grpc::StatusCode::INVALID_ARGUMENT, "header"},
      {"second header",
       {Header("keep", 2000, 1000), Header("keep", 2000, 1000)},
       grpc::StatusCode::INVALID_ARGUMENT,
       "second header"},
      {"empty key",
       {empty_key, Chunk(0, a), Chunk(1, b)},
       grpc::StatusCode::INVALID_ARGUMENT,
       "empty"},
      {"oversized key",
       {big_key, Chunk(0, a), Chunk(1, b)},
       grpc::StatusCode::INVALID_ARGUMENT,
       "limit"},
      {"num_chunks inconsistent", {bad_count}, grpc::StatusCode::INVALID_ARGUMENT, "num_chunks"},
      {"bad layer table", {bad_layers}, grpc::StatusCode::INVALID_ARGUMENT, "layer_offsets"},
      {"value above capacity",
       {Header("keep", 65 << 20, 1 << 20)},
       grpc::StatusCode::RESOURCE_EXHAUSTED,
       "capacity"},
      {"stream ends early",
       {Header("keep", 2000, 1000), Chunk(0, a)},
       grpc::StatusCode::INVALID_ARGUMENT,
       "ended after 1 of 2"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    grpc::Status st = RawPut(c.messages);
    EXPECT_EQ(st.error_code(), c.code) << st.error_message();
    EXPECT_NE(st.error_message().find(c.message_part), std::string::npos) << st.error_message();
    ExpectKeepUnharmed();
  }
  EXPECT_EQ(Counter("lazyrag_kvstore_corruptions_total{where=\"transit\"}"), 1);
  EXPECT_GE(Counter("lazyrag_kvstore_requests_total{op=\"put\",result=\"invalid_argument\"}"), 12);
  // The failed puts left nothing behind.
  EXPECT_EQ(Counter("lazyrag_kvstore_entries"), 1);
}

// A client that gives up half-way through a Put (it cancels, or its deadline passes) is
// counted as such, not as a malformed request, and leaves nothing behind.
TEST_F(KvStoreServiceTest, PutsCutShortByTheClientAreCountedAsSuch) {
  const std::string a(1000, 'a');
  const auto wait_for = [&](const std::string& line) {
    for (int i = 0; i < 200 && Counter(line) < 1; ++i) absl::SleepFor(absl::Milliseconds(25));
    return Counter(line);
  };
  {
    grpc::ClientContext context;
    pb::PutResponse response;
    auto writer = stub_->Put(&context, &response);
    ASSERT_TRUE(writer->Write(Header("cut", 2000, 1000)));
    ASSERT_TRUE(writer->Write(Chunk(0, a)));
    context.TryCancel();
    EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  const std::string cancelled = "lazyrag_kvstore_requests_total{op=\"put\",result=\"cancelled\"}";
  const std::string late =
      "lazyrag_kvstore_requests_total{op=\"put\",result=\"deadline_exceeded\"}";
  EXPECT_EQ(wait_for(cancelled), 1);
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
    pb::PutResponse response;
    auto writer = stub_->Put(&context, &response);
    ASSERT_TRUE(writer->Write(Header("late", 2000, 1000)));
    ASSERT_TRUE(writer->Write(Chunk(0, a)));
    absl::SleepFor(absl::Milliseconds(600));
    EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  // Usually counted as the deadline; a server that sees the client's cancel more than 100 ms
  // before its own deadline (a loaded machine) can only say cancelled.
  for (int i = 0; i < 200 && std::max(0.0, Counter(cancelled)) + std::max(0.0, Counter(late)) < 2;
       ++i) {
    absl::SleepFor(absl::Milliseconds(25));
  }
  EXPECT_EQ(std::max(0.0, Counter(cancelled)) + std::max(0.0, Counter(late)), 2);
  // -1: no such series (never counted).
  EXPECT_LE(Counter("lazyrag_kvstore_requests_total{op=\"put\",result=\"invalid_argument\"}"), 0);
  EXPECT_EQ(client_->Get(Key::Raw("cut")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->Get(Key::Raw("late")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Counter("lazyrag_kvstore_entries"), 1);
  ExpectKeepUnharmed();
}

TEST_F(KvStoreServiceTest, BadReadsGetClearStatuses) {
  auto missing = client_->Get(Key::Raw("never-stored"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_EQ(client_->Get(Key::Raw("")).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Get(Key::Document("", "ns", "id")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Get(Key::Raw(std::string(5000, 'k'))).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Layer range on a value stored without a layer table.
  EXPECT_EQ(client_->Get(Key::Raw("keep"), {0, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Stat with no keys / too many keys, raw.
  grpc::ClientContext c1, c2;
  pb::StatRequest none, many;
  pb::StatResponse r;
  EXPECT_EQ(stub_->Stat(&c1, none, &r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  for (int i = 0; i < 1025; ++i) many.add_keys()->set_raw("k");
  EXPECT_EQ(stub_->Stat(&c2, many, &r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Deleting an unknown key is not an error.
  auto deleted = client_->Delete(Key::Raw("never-stored"));
  ASSERT_TRUE(deleted.ok());
  EXPECT_FALSE(*deleted);
  ExpectKeepUnharmed();
}

// Chunk-range reads (how one value is read over several streams): bad ranges get clear
// statuses; a version other than the stored one is ABORTED; a store that reports no version
// (this fixture's wrapped engine) is read over one stream, with the same bytes.
TEST_F(KvStoreServiceTest, ChunkRangesAndVersions) {
  auto get = [&](pb::GetRequest r, std::string* bytes = nullptr) {
    grpc::ClientContext context;
    auto reader = stub_->Get(&context, r);
    pb::GetResponse m;
    while (reader->Read(&m)) {
      if (bytes != nullptr && m.has_chunk()) *bytes += m.chunk().data();
    }
    return reader->Finish().error_code();
  };
  pb::GetRequest r;
  r.mutable_key()->set_raw("keep");  // 3,000,000 bytes in 2 MiB chunks: 2 chunks
  r.set_first_chunk(1);
  EXPECT_EQ(get(r), grpc::StatusCode::INVALID_ARGUMENT);  // num_chunks 0
  r.set_num_chunks(5);
  std::string tail;
  EXPECT_EQ(get(r, &tail), grpc::StatusCode::OK);  // clipped to the value
  EXPECT_EQ(tail, kKeep.substr(2 << 20));
  r.set_num_layers(1);
  EXPECT_EQ(get(r), grpc::StatusCode::INVALID_ARGUMENT);  // with a layer range
  r.set_num_layers(0);
  r.set_first_chunk(2);
  EXPECT_EQ(get(r), grpc::StatusCode::OUT_OF_RANGE);
  r.set_first_chunk(0);
  r.set_version(12345);
  EXPECT_EQ(get(r), grpc::StatusCode::ABORTED);

  KvClientOptions co;
  co.shards = {server_->address()};
  co.chunk_size = 64 << 10;  // 40 chunks: more than the first stream's 16
  auto small_chunks = std::move(KvClient::Create(co)).value();
  const std::string v = PatternBytes(40 * (64 << 10) - 7, 9);
  ASSERT_TRUE(small_chunks->Put(Key::Raw("many"), {}, v).ok());
  auto got = small_chunks->Get(Key::Raw("many"));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->bytes == v);
  ExpectKeepUnharmed();
}

TEST_F(KvStoreServiceTest, ChunkCorruptedInTransitIsNeverServed) {
  engine_->corrupt_reads = true;
  auto got = client_->Get(Key::Raw("keep"));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  EXPECT_NE(got.status().message().find("in transit"), std::string::npos) << got.status();
  EXPECT_EQ(testing::MetricValue(client_registry_.Serialize(),
                                 "lazyrag_kvstore_client_corruptions_total"),
            1);
  engine_->corrupt_reads = false;
  ExpectKeepUnharmed();
}

TEST_F(KvStoreServiceTest, LayerRangesMapToByteRanges) {
  // 5 layers of uneven sizes, chunked at 64 KiB so ranges cut through chunks.
  KvClientOptions co;
  co.shards = {server_->address()};
  co.chunk_size = 64 << 10;
  auto client = std::move(KvClient::Create(co)).value();
  const std::vector<uint64_t> offsets = {0, 100'000, 100'000, 250'001, 400'000};
  const std::string value = PatternBytes(500'000, 5);
  ValueHeader header{"layers", offsets};
  const Key key = Key::Document("fp", "", "layered");
  ASSERT_TRUE(client->Put(key, header, value).ok());
  for (uint32_t first = 0; first < 5; ++first) {
    for (uint32_t n = 1; first + n <= 5; ++n) {
      auto got = client->Get(key, {first, n});
      ASSERT_TRUE(got.ok()) << got.status();
      const uint64_t begin = offsets[first];
      const uint64_t end = first + n == 5 ? value.size() : offsets[first + n];
      EXPECT_EQ(got->range_begin, begin);
      EXPECT_TRUE(got->bytes == value.substr(begin, end - begin)) << first << "+" << n;
      EXPECT_EQ(got->header.layer_offsets, offsets);
    }
  }
  EXPECT_EQ(client->Get(key, {4, 2}).status().code(), absl::StatusCode::kOutOfRange);
}

TEST_F(KvStoreServiceTest, MetricsPassPromtool) {
  ASSERT_TRUE(client_->Get(Key::Raw("keep")).ok());
  (void)client_->Get(Key::Raw("absent"));
  const std::string text = server_->registry().Serialize() + client_registry_.Serialize();
  for (const char* name :
       {"lazyrag_kvstore_entries 1", "lazyrag_kvstore_bytes 3000000",
        "lazyrag_kvstore_evictions_total 0",
        "lazyrag_kvstore_requests_total{op=\"get\",result=\"ok\"}",
        "lazyrag_kvstore_requests_total{op=\"get\",result=\"not_found\"}",
        "lazyrag_kvstore_fetch_seconds_bucket", "lazyrag_kvstore_fetch_bytes_total"}) {
    EXPECT_NE(text.find(name), std::string::npos) << name << "\n" << text;
  }
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "promtool not on PATH";
  }
  const std::string path = dir_.path() + "/metrics.txt";
  std::ofstream(path) << text;
  EXPECT_EQ(std::system(("promtool check metrics < " + path).c_str()), 0) << text;
}

// The same-host fast path (kvstore.proto, DescribeRequest) against a real RocksDB engine.
class KvStoreFastPathTest : public ::testing::Test {
 protected:
  // `auth_tokens_file`: KvStoreServerOptions::auth_tokens_file ("": none).
  void Start(bool local_clients, const std::string& auth_tokens_file = "") {
    KvStoreServerOptions options;
    options.listen = "127.0.0.1:0";
    options.metrics_port = -1;
    options.data_dir = dir_.path() + "/db";
    options.sync_commits = false;
    options.local_clients = local_clients;
    options.auth_tokens_file = auth_tokens_file;
    server_ = std::make_unique<KvStoreServer>(options);
    ASSERT_TRUE(server_->Start().ok());
    stub_ = pb::KvStore::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }
  std::unique_ptr<KvClient> Client(bool fast_path, std::shared_ptr<BearerToken> token = nullptr) {
    KvClientOptions co;
    co.shards = {server_->address()};
    co.max_attempts = 1;
    co.local_fast_path = fast_path;
    co.chunk_size = 1 << 20;
    co.auth_token = std::move(token);
    return std::move(KvClient::Create(co)).value();
  }
  // GetInto into a fresh buffer; *local tells which path served it.
  static absl::StatusOr<std::string> Read(KvClient& client, const Key& key, bool* local) {
    std::string out;
    // Three spans (the first shorter than a chunk, the second across chunk edges), as a
    // document read into its token vector and its host-tier range is.
    auto info = client.GetInto(
        key, [&](const ValueHeader&, uint64_t n) -> absl::StatusOr<std::vector<MutableBytes>> {
          out.assign(n, '\0');
          const uint64_t a = std::min<uint64_t>(n, 1000), b = std::min<uint64_t>(n - a, 3'000'000);
          return std::vector<MutableBytes>{
              {out.data(), a}, {out.data() + a, b}, {out.data() + a + b, n - a - b}};
        });
    if (!info.ok()) return info.status();
    *local = info->local;
    return out;
  }
  std::string Incoming(const std::string& name) { return dir_.path() + "/db/incoming/" + name; }
  // A file in incoming/ holding `bytes`.
  void HandOver(const std::string& name, const std::string& bytes) {
    std::ofstream(Incoming(name), std::ios::binary) << bytes;
  }
  pb::PutLocalRequest LocalPut(const std::string& raw_key, const std::string& bytes,
                               const std::string& file, uint32_t chunk = 1000) {
    pb::PutLocalRequest r;
    r.mutable_header()->mutable_key()->set_raw(raw_key);
    auto* v = r.mutable_header()->mutable_value();
    v->set_total_size(bytes.size());
    v->set_chunk_size(chunk);
    v->set_num_chunks(NumChunks(bytes.size(), chunk));
    for (uint64_t at = 0; at < bytes.size(); at += chunk) {
      r.add_chunk_crc32c(Crc32c(std::string_view(bytes).substr(at, chunk)));
    }
    r.set_file(file);
    return r;
  }
  grpc::Status Call(const pb::PutLocalRequest& r) {
    grpc::ClientContext context;
    pb::PutResponse response;
    return stub_->PutLocal(&context, r, &response);
  }

  TempDir dir_;
  std::unique_ptr<KvStoreServer> server_;
  std::unique_ptr<pb::KvStore::Stub> stub_;
};

TEST_F(KvStoreFastPathTest, FilesAndStreamsServeTheSameBytes) {
  Start(/*local_clients=*/true);
  auto fast = Client(true), streamed = Client(false);
  const std::string a = PatternBytes(5'000'003, 1), b = PatternBytes(70 << 20, 2);
  ASSERT_TRUE(fast->Put(Key::Raw("a"), {{"meta"}, {0, 1000}}, a).ok());  // by file
  ASSERT_TRUE(streamed->Put(Key::Raw("b"), {}, b).ok());                 // by stream
  for (KvClient* c : {fast.get(), streamed.get()}) {
    for (const auto& [key, value] : {std::pair{"a", &a}, std::pair{"b", &b}}) {
      bool local = false;
      auto got = Read(*c, Key::Raw(key), &local);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(*got == *value) << key;
      EXPECT_EQ(local, c == fast.get()) << key;
    }
  }
  // Metadata and layer table travel on the fast path too; a layer range is streamed.
  auto got = fast->Get(Key::Raw("a"));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->header.metadata, "meta");
  EXPECT_EQ(got->header.layer_offsets, (std::vector<uint64_t>{0, 1000}));
  auto layer = fast->Get(Key::Raw("a"), {1, 1});
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_TRUE(layer->bytes == a.substr(1000));
  // Nothing is left behind in incoming/.
  EXPECT_TRUE(std::filesystem::is_empty(dir_.path() + "/db/incoming"));
}

// A shard with --auth_tokens_file: the client's token (added to each call's context) lets every
// kind of call through, by file and by stream (multi-stream gets of a large value too); without
// a token, or with an unknown one, every call is UNAUTHENTICATED.
TEST_F(KvStoreFastPathTest, TokenOnEveryCallOfEveryKind) {
  const std::string tokens = dir_.path() + "/tokens";
  std::ofstream(tokens) << "worker-token-0123456789 cluster worker\n";
  Start(/*local_clients=*/true, tokens);
  const std::string big = PatternBytes(40 << 20, 3), small = PatternBytes(5000, 4);
  for (bool fast_path : {true, false}) {
    SCOPED_TRACE(fast_path ? "same-host files" : "gRPC streams");
    auto client = Client(fast_path, BearerToken::Fixed("worker-token-0123456789"));
    ASSERT_TRUE(client->Put(Key::Raw("big"), {}, big).ok());
    ASSERT_TRUE(client->Put(Key::Raw("small"), {}, small).ok());
    bool local = false;
    auto got = Read(*client, Key::Raw("big"), &local);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(*got == big);
    EXPECT_EQ(local, fast_path);
    const Key keys[] = {Key::Raw("big"), Key::Raw("small")};
    auto stat = client->Stat(keys);
    ASSERT_TRUE(stat.ok()) << stat.status();
    ASSERT_EQ(stat->size(), 2u);
    EXPECT_TRUE((*stat)[0].present && (*stat)[1].present);
    auto deleted = client->Delete(Key::Raw("small"));
    ASSERT_TRUE(deleted.ok()) << deleted.status();
    EXPECT_TRUE(*deleted);
  }
  for (auto token : {std::shared_ptr<BearerToken>(), BearerToken::Fixed("not-a-known-token-xyz")}) {
    auto client = Client(true, token);
    EXPECT_EQ(client->Put(Key::Raw("c"), {}, small).code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(client->Get(Key::Raw("big")).status().code(), absl::StatusCode::kUnauthenticated);
  }
}

TEST_F(KvStoreFastPathTest, BadHandOversAreRefusedConsumedAndStoreNothing) {
  Start(true);
  const std::string v = PatternBytes(4500, 3);
  for (const char* name : {"", ".", "..", "../x", "a/b"}) {
    EXPECT_EQ(Call(LocalPut("k", v, name)).error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << name;
  }
  HandOver("crc", v);
  auto bad_crc = LocalPut("k", v, "crc");
  bad_crc.set_chunk_crc32c(2, bad_crc.chunk_crc32c(2) ^ 1);
  EXPECT_EQ(Call(bad_crc).error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_FALSE(std::filesystem::exists(Incoming("crc")));
  HandOver("count", v);
  auto short_list = LocalPut("k", v, "count");
  short_list.mutable_chunk_crc32c()->RemoveLast();
  EXPECT_EQ(Call(short_list).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_FALSE(std::filesystem::exists(Incoming("count")));
  HandOver("short", v.substr(0, 4000));
  EXPECT_EQ(Call(LocalPut("k", v, "short")).error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_EQ(Call(LocalPut("k", v, "missing")).error_code(), grpc::StatusCode::NOT_FOUND);
  std::filesystem::create_symlink(dir_.path() + "/db/local-token", Incoming("link"));
  EXPECT_FALSE(Call(LocalPut("k", v, "link")).ok());
  EXPECT_EQ(Client(true)->Get(Key::Raw("k")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(std::filesystem::is_empty(dir_.path() + "/db/incoming"));
  // And a good one is stored.
  HandOver("good", v);
  ASSERT_TRUE(Call(LocalPut("k", v, "good")).ok());
  auto got = Client(false)->Get(Key::Raw("k"));
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->bytes == v);
}

TEST_F(KvStoreFastPathTest, ShardWithoutLocalClientsIsStreamed) {
  Start(/*local_clients=*/false);
  auto fast = Client(true);
  const std::string v = PatternBytes(3'000'000, 4);
  ASSERT_TRUE(fast->Put(Key::Raw("k"), {}, v).ok());
  bool local = true;
  auto got = Read(*fast, Key::Raw("k"), &local);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == v);
  EXPECT_FALSE(local);
  grpc::ClientContext context;
  pb::GetLocalRequest request;
  request.mutable_key()->set_raw("k");
  pb::GetLocalResponse response;
  EXPECT_EQ(stub_->GetLocal(&context, request, &response).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(KvStoreFastPathTest, ByteFlippedOnDiskIsDataLossCountedByTheShard) {
  Start(true);
  auto fast = Client(true);
  ASSERT_TRUE(fast->Put(Key::Raw("k"), {}, PatternBytes(3'000'000, 5)).ok());
  std::string file;
  for (const auto& e : std::filesystem::directory_iterator(dir_.path() + "/db/values")) {
    file = e.path();
  }
  ASSERT_FALSE(file.empty());
  ASSERT_TRUE(testing::FlipByte(file, 2'500'000).ok());
  bool local = false;
  auto got = Read(*fast, Key::Raw("k"), &local);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  EXPECT_GE(testing::MetricValue(server_->registry().Serialize(),
                                 "lazyrag_kvstore_corruptions_total{where=\"disk\"}"),
            1);
}

// CallOptions::on_chunk sees every byte of a whole-value GetInto exactly once, at its value
// offset, as the bytes in the caller's spans, in steps of at most 512 KiB that never cross a
// span, on both paths and over several streams. With on_chunk_verifies the client skips its
// CRC-32C (the caller verifies), so a byte flipped on disk is delivered and left to the caller;
// without it the same read is DATA_LOSS.
TEST_F(KvStoreFastPathTest, ChunkObserverSeesEveryByteOnceAndMayReplaceTheCrc) {
  Start(true);
  const std::string v = PatternBytes((40 << 20) + 12345, 6);  // > 16 chunks: split over streams
  ASSERT_TRUE(Client(true)->Put(Key::Raw("k"), {}, v).ok());
  for (bool fast_path : {true, false}) {
    auto client = Client(fast_path);
    std::string out;
    absl::Mutex mu;
    std::vector<std::pair<uint64_t, uint64_t>> seen;  // (offset, size)
    bool bytes_match = true;
    CallOptions call;
    call.on_chunk = [&](uint64_t offset, const char* data, uint64_t size) {
      absl::MutexLock lock(&mu);
      seen.emplace_back(offset, size);
      bytes_match &= size <= (512u << 10) && data == out.data() + offset &&
                     std::string_view(data, size) == std::string_view(v).substr(offset, size);
    };
    auto info = client->GetInto(
        Key::Raw("k"),
        [&](const ValueHeader&, uint64_t n) -> absl::StatusOr<std::vector<MutableBytes>> {
          out.assign(n, '\0');
          return std::vector<MutableBytes>{{out.data(), 1000}, {out.data() + 1000, n - 1000}};
        },
        {}, call);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->local, fast_path);
    EXPECT_TRUE(out == v);
    EXPECT_TRUE(bytes_match) << "fast_path " << fast_path;
    std::sort(seen.begin(), seen.end());
    uint64_t at = 0;
    for (const auto& [offset, size] : seen) {
      EXPECT_EQ(offset, at) << "fast_path " << fast_path;
      EXPECT_TRUE(offset >= 1000 || offset + size <= 1000) << "a step crosses a span";
      at = offset + size;
    }
    EXPECT_EQ(at, v.size());
  }

  std::string file;
  for (const auto& e : std::filesystem::directory_iterator(dir_.path() + "/db/values")) {
    file = e.path();
  }
  ASSERT_TRUE(testing::FlipByte(file, 2'500'000).ok());
  auto fast = Client(true);
  CallOptions verifying;
  std::atomic<uint64_t> observed{0};
  verifying.on_chunk = [&](uint64_t, const char*, uint64_t size) { observed += size; };
  verifying.on_chunk_verifies = true;
  std::string out;
  auto dest = [&](const ValueHeader&, uint64_t n) -> absl::StatusOr<std::vector<MutableBytes>> {
    out.assign(n, '\0');
    return std::vector<MutableBytes>{{out.data(), n}};
  };
  auto unchecked = fast->GetInto(Key::Raw("k"), dest, {}, verifying);
  ASSERT_TRUE(unchecked.ok()) << unchecked.status();
  EXPECT_NE(out, v);  // the flipped byte arrived: the caller's check is what finds it
  EXPECT_EQ(observed, v.size());
  CallOptions checking;
  checking.on_chunk = [](uint64_t, const char*, uint64_t) {};
  EXPECT_EQ(fast->GetInto(Key::Raw("k"), dest, {}, checking).status().code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace lazyrag::kvstore
