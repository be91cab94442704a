// Real lazyrag-kvstore processes on loopback (issue 3, "Must show" 1, 2, 3, 4, 5, 7).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kvstore/client/kvstore_client.h"
#include "kvstore/kv_engine.h"
#include "kvstore/tests/test_util.h"
#include "rocksdb/db.h"

namespace lazyrag::kvstore {
namespace {

using testing::FetchMetrics;
using testing::FlipByte;
using testing::KvStoreProcess;
using testing::MetricValue;
using testing::PatternBytes;
using testing::TempDir;

constexpr char kServer[] = LAZYRAG_KVSTORE_BINARY;
constexpr char kCli[] = LAZYRAG_CLI_BINARY;

std::unique_ptr<KvClient> MakeClient(std::vector<std::string> shards, int replication = 0) {
  KvClientOptions options;
  options.shards = std::move(shards);
  options.replication = replication;
  options.call_timeout = absl::Seconds(60);
  options.initial_backoff = absl::Milliseconds(20);
  auto client = KvClient::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return std::move(client).value();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Must show 1: byte-identical round trips from 1 byte to 256 MiB, through the client library
// and through `lazyrag-cli kv`.
TEST(KvStoreProcessTest, RoundTripThroughClientLibrary) {
  TempDir dir;
  KvStoreProcess server(kServer, dir.path() + "/db");
  ASSERT_TRUE(server.Start().ok());
  auto client = MakeClient({server.address()});
  const uint64_t sizes[] = {0,         1,           100, (2u << 20) - 1, 2u << 20, (2u << 20) + 1,
                            9'999'999, 256ull << 20};
  for (uint64_t size : sizes) {
    SCOPED_TRACE(size);
    const Key key = Key::Document("fp", "ns", absl::StrCat("doc-", size));
    const std::string value = PatternBytes(size, size);
    ValueHeader header;
    header.metadata = absl::StrCat("meta-", size);
    auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(client->Put(key, header, value).ok());
    auto put_done = std::chrono::steady_clock::now();
    auto got = client->Get(key);
    auto get_done = std::chrono::steady_clock::now();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->total_size, size);
    EXPECT_EQ(got->header.metadata, header.metadata);
    EXPECT_TRUE(got->bytes == value) << "bytes differ";
    if (size >= (64u << 20)) {
      auto s = [](auto d) { return std::chrono::duration<double>(d).count(); };
      std::cout << "  " << size << " bytes: put " << s(put_done - start) << " s, get "
                << s(get_done - put_done) << " s\n";
    }
  }
}

TEST(KvStoreProcessTest, RoundTripThroughCli) {
  if (std::string(kCli).empty()) GTEST_SKIP() << "lazyrag-cli is not part of this build";
  TempDir dir;
  KvStoreProcess a(kServer, dir.path() + "/a"), b(kServer, dir.path() + "/b");
  ASSERT_TRUE(a.Start().ok());
  ASSERT_TRUE(b.Start().ok());
  const std::string shards = absl::StrCat(a.address(), ",", b.address());
  for (uint64_t size : {uint64_t{1}, uint64_t{5'000'001}, uint64_t{256} << 20}) {
    SCOPED_TRACE(size);
    const std::string in = dir.path() + "/in", out = dir.path() + "/out";
    const std::string value = PatternBytes(size, 7 * size);
    WriteFile(in, value);
    const std::string name = absl::StrCat("operator/file-", size);
    ASSERT_EQ(
        testing::RunProcess({kCli, "kv", "put", "--kvstore", shards, "--key", name, "--file", in}),
        0);
    ASSERT_EQ(
        testing::RunProcess({kCli, "kv", "get", "--kvstore", shards, "--key", name, "--file", out}),
        0);
    EXPECT_TRUE(ReadFile(out) == value) << "bytes differ";
    const std::string stat_out = dir.path() + "/stat";
    ASSERT_EQ(testing::RunProcess(
                  {kCli, "kv", "stat", "--kvstore", shards, "--key", name, "--key", "never-stored"},
                  stat_out),
              0);
    const std::string stat = ReadFile(stat_out);
    EXPECT_NE(stat.find(absl::StrCat(name, " present ", size, " ")), std::string::npos) << stat;
    EXPECT_NE(stat.find("never-stored absent 0 0 0"), std::string::npos) << stat;
  }
  const std::string name = "operator/file-1";
  EXPECT_EQ(testing::RunProcess({kCli, "kv", "delete", "--kvstore", shards, "--key", name}), 0);
  // Unknown key: exit code 3 (NOT_FOUND), and no file is left behind.
  const std::string out = dir.path() + "/missing";
  EXPECT_EQ(
      testing::RunProcess({kCli, "kv", "get", "--kvstore", shards, "--key", name, "--file", out}),
      3);
  EXPECT_FALSE(std::ifstream(out).good());
  // Usage errors: exit code 2.
  EXPECT_EQ(testing::RunProcess({kCli, "kv", "get", "--kvstore", shards}), 2);
  EXPECT_EQ(testing::RunProcess({kCli, "kv", "frobnicate", "--kvstore", shards, "--key", "x"}), 2);
  // An empty key is refused by the client library: exit code 1 with INVALID_ARGUMENT.
  EXPECT_EQ(testing::RunProcess(
                {kCli, "kv", "put", "--kvstore", shards, "--key", "", "--file", "/dev/null"}),
            1);
}

// Must show 2: kill -9 in the middle of puts, restart: each key whole or absent, 20+ trials.
TEST(KvStoreProcessTest, CrashDuringPutsLeavesEveryKeyWholeOrAbsent) {
  TempDir dir;
  KvStoreProcess server(kServer, dir.path() + "/db");
  ASSERT_TRUE(server.Start().ok());
  std::mt19937 rng(42);
  constexpr int kTrials = 24;
  constexpr int kKeys = 6;
  // version[key] = last version whose Put returned OK (-1: none yet).
  std::vector<int> acked(kKeys, -1);
  int version = 0;
  int whole = 0, absent = 0, older = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    SCOPED_TRACE(trial);
    KvClientOptions options;
    options.shards = {server.address()};
    options.max_attempts = 1;
    options.chunk_size = 256 << 10;  // many chunks per value: more places to die
    auto client = KvClient::Create(options);
    ASSERT_TRUE(client.ok());
    std::atomic<bool> stop{false};
    std::mutex mu;
    std::vector<std::thread> writers;
    for (int w = 0; w < 2; ++w) {
      writers.emplace_back([&, w] {
        for (int i = 0; !stop.load(); ++i) {
          const int k = (w + 2 * i) % kKeys;
          int v;
          {
            std::lock_guard<std::mutex> lock(mu);
            v = ++version;
          }
          // The value's size and bytes are a function of its version, recorded in metadata.
          const std::string value = PatternBytes(1'000'000 + 37'000 * (v % 97), v);
          ValueHeader header;
          header.metadata = std::to_string(v);
          if ((*client)->Put(Key::Raw(absl::StrCat("k", k)), header, value).ok()) {
            std::lock_guard<std::mutex> lock(mu);
            acked[k] = std::max(acked[k], v);
          }
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(30 + rng() % 150));
    server.Kill();
    stop = true;
    for (auto& t : writers) t.join();
    ASSERT_TRUE(server.Restart().ok());
    auto reader = MakeClient({server.address()});
    for (int k = 0; k < kKeys; ++k) {
      auto got = reader->Get(Key::Raw(absl::StrCat("k", k)));
      if (!got.ok()) {
        ASSERT_EQ(got.status().code(), absl::StatusCode::kNotFound) << got.status();
        // Absent is only allowed for a key no put was ever acknowledged for.
        ASSERT_EQ(acked[k], -1) << "acknowledged key lost";
        ++absent;
        continue;
      }
      const int v = std::stoi(got->header.metadata);
      ASSERT_TRUE(got->bytes == PatternBytes(1'000'000 + 37'000 * (v % 97), v))
          << "key k" << k << " version " << v << " is not whole";
      ASSERT_GE(v, acked[k]) << "an acknowledged put was rolled back";
      ++whole;
      if (v > acked[k]) ++older;  // a put that committed but was not acknowledged
    }
  }
  std::cout << "  " << kTrials << " crashes: " << whole << " whole reads, " << absent << " absent, "
            << older << " committed-but-unacknowledged\n";
}

// Must show 3 (on disk): bytes flipped in a stored chunk are detected, never served, and
// counted in lazyrag_kvstore_corruptions_total{where="disk"}.
TEST(KvStoreProcessTest, BytesFlippedOnDiskAreDetectedAndCounted) {
  TempDir dir;
  const std::string db_path = dir.path() + "/db";
  KvStoreProcess server(kServer, db_path);
  ASSERT_TRUE(server.Start().ok());
  auto client = MakeClient({server.address()});
  const Key bad = Key::Raw("victim"), good = Key::Raw("bystander");
  const std::string value = PatternBytes(5'000'000, 3);
  ASSERT_TRUE(client->Put(bad, {}, value).ok());
  ASSERT_TRUE(client->Put(good, {}, value).ok());
  server.Stop(15);  // graceful

  {  // Flip one byte in the middle of the victim's second chunk, keeping its stored CRC.
    auto path = StoredValuePath(db_path, "Rvictim");
    ASSERT_TRUE(path.ok()) << path.status();
    ASSERT_TRUE(FlipByte(*path, (2u << 20) + 1000).ok());
  }

  ASSERT_TRUE(server.Restart().ok());
  auto got = client->Get(bad);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  EXPECT_NE(got.status().message().find("CRC-32C"), std::string::npos) << got.status();
  auto other = client->Get(good);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE(other->bytes == value);
  auto metrics = FetchMetrics(server.metrics_port());
  ASSERT_TRUE(metrics.ok());
  EXPECT_GE(MetricValue(*metrics, "lazyrag_kvstore_corruptions_total{where=\"disk\"}"), 1);
  EXPECT_GE(
      MetricValue(*metrics, "lazyrag_kvstore_requests_total{op=\"get\",result=\"data_loss\"}"), 1);
  // Overwriting the damaged value heals it.
  ASSERT_TRUE(client->Put(bad, {}, value).ok());
  auto healed = client->Get(bad);
  ASSERT_TRUE(healed.ok()) << healed.status();
  EXPECT_TRUE(healed->bytes == value);
}

// Must show 4: three shards, R=2, one killed: every get succeeds; after it comes back it
// serves again (shown by then killing another shard).
TEST(KvStoreProcessTest, ThreeShardsSurviveOneKilledAndRecover) {
  TempDir dir;
  std::vector<std::unique_ptr<KvStoreProcess>> shards;
  std::vector<std::string> addresses;
  for (int i = 0; i < 3; ++i) {
    shards.push_back(std::make_unique<KvStoreProcess>(kServer, absl::StrCat(dir.path(), "/s", i)));
    ASSERT_TRUE(shards.back()->Start().ok());
    addresses.push_back(shards.back()->address());
  }
  auto client = MakeClient(addresses, 2);
  constexpr int kKeys = 30;
  std::vector<int> on_shard(3, 0);
  for (int k = 0; k < kKeys; ++k) {
    const Key key = Key::Document("model", "tenant", absl::StrCat("doc", k));
    ASSERT_TRUE(client->Put(key, {}, PatternBytes(100'000 + k, k)).ok());
    auto placement = client->Placement(key);
    ASSERT_TRUE(placement.ok());
    ASSERT_EQ(placement->size(), 2u);
    for (int s : *placement) ++on_shard[s];
  }
  for (int s = 0; s < 3; ++s)
    EXPECT_GT(on_shard[s], 0) << "rendezvous left shard " << s << " empty";
  auto t_start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  };
  auto check_all = [&](const char* phase) {
    std::cout << "  " << elapsed() << " s: " << phase << "\n";
    for (int k = 0; k < kKeys; ++k) {
      auto got = client->Get(Key::Document("model", "tenant", absl::StrCat("doc", k)));
      ASSERT_TRUE(got.ok()) << phase << " doc" << k << ": " << got.status();
      ASSERT_TRUE(got->bytes == PatternBytes(100'000 + k, k)) << phase << " doc" << k;
    }
  };
  check_all("all up");
  shards[0]->Kill();
  auto t0 = std::chrono::steady_clock::now();
  check_all("shard 0 killed");
  std::cout << "  reads with one shard down: "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
            << " s for " << kKeys << " keys\n";
  EXPECT_FALSE(client->Health()[0].healthy);
  ASSERT_TRUE(shards[0]->Restart().ok());
  shards[1]->Kill();  // now keys on {0,1} can only come from shard 0
  check_all("shard 0 back, shard 1 killed");
  ASSERT_TRUE(shards[1]->Restart().ok());
  // A put while a replica is down still succeeds (on the other replica).
  shards[2]->Kill();
  for (int k = 0; k < 3; ++k) {
    EXPECT_TRUE(client->Put(Key::Raw(absl::StrCat("late", k)), {}, "x").ok());
  }
  std::cout << "  " << elapsed() << " s: puts with shard 2 down done\n";
  // Every replica down: UNAVAILABLE, not NOT_FOUND.
  shards[0]->Kill();
  shards[1]->Kill();
  auto down = client->Get(Key::Document("model", "tenant", "doc0"));
  EXPECT_EQ(down.status().code(), absl::StatusCode::kUnavailable) << down.status();
  std::cout << "  " << elapsed() << " s: get with every replica down failed as UNAVAILABLE\n";
}

// Must show 5: writing twice the capacity keeps the store within it; keys read recently
// survive eviction.
TEST(KvStoreProcessTest, CapacityEvictsLeastRecentlyUsed) {
  TempDir dir;
  constexpr uint64_t kCapacity = 8 << 20;
  constexpr uint64_t kValue = 512 << 10;
  KvStoreProcess server(kServer, dir.path() + "/db",
                        {absl::StrCat("--capacity_bytes=", kCapacity)});
  ASSERT_TRUE(server.Start().ok());
  auto client = MakeClient({server.address()});
  const Key hot = Key::Raw("hot");
  ASSERT_TRUE(client->Put(hot, {}, PatternBytes(kValue, 1)).ok());
  for (int i = 0; i < static_cast<int>(2 * kCapacity / kValue); ++i) {
    ASSERT_TRUE(client->Put(Key::Raw(absl::StrCat("cold", i)), {}, PatternBytes(kValue, i)).ok());
    ASSERT_TRUE(client->Get(hot).ok()) << "recently read key evicted after put " << i;
    auto metrics = FetchMetrics(server.metrics_port());
    ASSERT_TRUE(metrics.ok());
    ASSERT_LE(MetricValue(*metrics, "lazyrag_kvstore_bytes"), kCapacity);
  }
  auto metrics = FetchMetrics(server.metrics_port());
  ASSERT_TRUE(metrics.ok());
  EXPECT_GE(MetricValue(*metrics, "lazyrag_kvstore_evictions_total"), kCapacity / kValue);
  EXPECT_EQ(MetricValue(*metrics, "lazyrag_kvstore_entries"), kCapacity / kValue);
  // The oldest cold keys are gone, the newest are there.
  std::vector<Key> keys = {Key::Raw("cold0"),
                           Key::Raw(absl::StrCat("cold", 2 * kCapacity / kValue - 1))};
  auto stat = client->Stat(keys);
  ASSERT_TRUE(stat.ok());
  EXPECT_FALSE((*stat)[0].present);
  EXPECT_TRUE((*stat)[1].present);
  // Still within capacity after a restart.
  server.Stop(15);
  ASSERT_TRUE(server.Restart().ok());
  metrics = FetchMetrics(server.metrics_port());
  ASSERT_TRUE(metrics.ok());
  EXPECT_LE(MetricValue(*metrics, "lazyrag_kvstore_bytes"), kCapacity);
  EXPECT_TRUE(client->Get(hot).ok());
  // A value larger than the whole capacity is refused.
  EXPECT_EQ(client->Put(Key::Raw("huge"), {}, PatternBytes(kCapacity + 1, 0)).code(),
            absl::StatusCode::kResourceExhausted);
}

// Must show 7: two clients putting the same key at once leave one consistent value.
TEST(KvStoreProcessTest, ConcurrentPutsOfOneKeyLeaveOneWholeValue) {
  TempDir dir;
  KvStoreProcess server(kServer, dir.path() + "/db");
  ASSERT_TRUE(server.Start().ok());
  const Key key = Key::Raw("contended");
  auto value_of = [](int writer, int round) {
    return PatternBytes(3'000'000 + writer * 1000, writer * 100 + round);
  };
  for (int round = 0; round < 5; ++round) {
    std::vector<std::thread> threads;
    for (int w = 0; w < 2; ++w) {
      threads.emplace_back([&, w] {
        auto client = MakeClient({server.address()});
        ValueHeader header;
        header.metadata = std::to_string(w);
        EXPECT_TRUE(client->Put(key, header, value_of(w, round)).ok());
      });
    }
    for (auto& t : threads) t.join();
    auto got = MakeClient({server.address()})->Get(key);
    ASSERT_TRUE(got.ok());
    const int w = std::stoi(got->header.metadata);
    EXPECT_TRUE(got->bytes == value_of(w, round)) << "round " << round << " mixed values";
  }
  // Nothing leaked: after a restart (which drops unreferenced chunks) one entry remains.
  server.Stop(15);
  ASSERT_TRUE(server.Restart().ok());
  auto metrics = FetchMetrics(server.metrics_port());
  ASSERT_TRUE(metrics.ok());
  EXPECT_EQ(MetricValue(*metrics, "lazyrag_kvstore_entries"), 1);
}

}  // namespace
}  // namespace lazyrag::kvstore
