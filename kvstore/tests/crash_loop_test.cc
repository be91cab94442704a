// A randomized crash loop in the habit of RocksDB's crash test, against the real lazyrag-kvstore
// binary: writer threads put, get and delete values while the index flushes and compacts (a
// tiny memtable); the shard is killed with SIGKILL at a random moment, random bits are flipped
// in random files of its data directory, and it is restarted. After every restart, and on every
// read while it runs, each value must be whole (exactly the bytes of a version that was put) or
// cleanly absent (NOT_FOUND, or DATA_LOSS for a flipped value), never wrong: never a version
// older than the last acknowledged put, never a value whose delete was acknowledged, never
// absent when nothing that could explain it (a flip, an unacknowledged delete) happened.
//
// Bounded and seeded: LAZYRAG_CRASH_LOOP_SECONDS (default 60) and LAZYRAG_CRASH_LOOP_SEED
// (default: from the clock); the seed and the counts are printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kvstore/client/kvstore_client.h"
#include "kvstore/tests/test_util.h"

namespace lazyrag::kvstore {
namespace {

using testing::KvStoreProcess;
using testing::PatternBytes;
using testing::TempDir;

constexpr int kWriters = 3;
constexpr int kKeys = 48;  // key k belongs to writer k % kWriters: its operations are ordered

uint64_t SizeOf(int version) { return 1 + (uint64_t(version) * 7919) % 300'000; }
std::string BytesOf(int key, int version) {
  return PatternBytes(SizeOf(version), uint64_t(key) << 32 | uint64_t(version));
}
Key KeyOf(int k) { return Key::Raw(absl::StrCat("crash", k)); }

// What the writers know about one key. Touched only by its writer while the shard runs, and by
// the main thread between runs.
struct KeyState {
  int floor = -1;              // version of the last acknowledged put; -1: none, or deleted
  std::vector<int> maybe;      // puts after it that failed (they may have committed)
  bool maybe_deleted = false;  // a delete after it failed (it may have committed)
  int64_t flips_at_floor = 0;  // flips done when `floor` was acknowledged
};

struct Counts {
  std::atomic<int64_t> puts{0}, acked_puts{0}, gets{0}, deletes{0}, verified{0}, whole{0},
      absent{0};
};

class CrashLoop {
 public:
  CrashLoop(uint64_t seed, const std::string& dir)
      : rng_(seed),
        server_(
            LAZYRAG_KVSTORE_BINARY, dir + "/db",
            {"--sync_commits=false", "--index_write_buffer_bytes=65536", "--log_level=warning"}),
        dir_(dir + "/db") {}

  // Checks one read of key `k` against what is known; returns "" when it is allowed. After a
  // restart (`settle`), the state is updated to what was read (nothing is in flight then).
  std::string Check(int k, const absl::StatusOr<Value>& got, bool settle) {
    KeyState& s = keys_[k];
    counts_.verified.fetch_add(1);
    if (got.ok()) {
      int v = -1;
      if (!absl::SimpleAtoi(got->header.metadata, &v) || v < 0) {
        return absl::StrCat("key ", k, ": bad metadata '", got->header.metadata, "'");
      }
      if (got->bytes != BytesOf(k, v)) {
        return absl::StrCat("key ", k, " version ", v, ": bytes are not the ones put");
      }
      if (v != s.floor && std::find(s.maybe.begin(), s.maybe.end(), v) == s.maybe.end()) {
        return absl::StrCat("key ", k, ": read version ", v, ", acknowledged ", s.floor,
                            " (a rolled-back put or a resurrected delete)");
      }
      counts_.whole.fetch_add(1);
      if (settle) s = KeyState{v, {}, false, flips_.load()};
      return "";
    }
    const absl::StatusCode code = got.status().code();
    if (code != absl::StatusCode::kNotFound && code != absl::StatusCode::kDataLoss) {
      return settle ? absl::StrCat("key ", k, ": ", got.status().ToString()) : "";
    }
    if (s.floor >= 0 && !s.maybe_deleted && flips_.load() == s.flips_at_floor) {
      return absl::StrCat("key ", k, ": acknowledged version ", s.floor, " lost (",
                          got.status().ToString(), ") with no flip since");
    }
    counts_.absent.fetch_add(1);
    if (settle) s = KeyState{};
    return "";
  }

  std::unique_ptr<KvClient> Client() {
    KvClientOptions options;
    options.shards = {server_.address()};
    options.max_attempts = 1;
    options.chunk_size = 64 << 10;  // several chunks per value: more places to die
    options.call_timeout = absl::Seconds(10);
    auto client = KvClient::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(client).value() : nullptr;
  }

  void Writer(int w, uint64_t seed, KvClient* client) {
    std::mt19937_64 rng(seed);
    while (!stop_.load()) {
      const int k = w + kWriters * int(rng() % (kKeys / kWriters));
      KeyState& s = keys_[k];
      const int op = int(rng() % 10);
      if (op < 5) {
        const int v = next_version_.fetch_add(1);
        ValueHeader header;
        header.metadata = std::to_string(v);
        counts_.puts.fetch_add(1);
        if (client->Put(KeyOf(k), header, BytesOf(k, v)).ok()) {
          counts_.acked_puts.fetch_add(1);
          s = KeyState{v, {}, false, flips_.load()};
        } else {
          s.maybe.push_back(v);
        }
      } else if (op < 9) {
        counts_.gets.fetch_add(1);
        const std::string bad = Check(k, client->Get(KeyOf(k)), /*settle=*/false);
        if (!bad.empty()) Fail(bad);
      } else {
        counts_.deletes.fetch_add(1);
        if (client->Delete(KeyOf(k)).ok()) {
          s = KeyState{};
        } else {
          s.maybe_deleted = true;
        }
      }
    }
  }

  // Every key, after a restart.
  void VerifyAll() {
    auto client = Client();
    ASSERT_NE(client, nullptr);
    for (int k = 0; k < kKeys; ++k) {
      const std::string bad = Check(k, client->Get(KeyOf(k)), /*settle=*/true);
      ASSERT_TRUE(bad.empty()) << bad << " (seed " << seed_ << ")";
    }
  }

  // Flips one random bit in each of `n` random files of the data directory (values, RocksDB
  // tables, log, manifest, anything).
  void FlipBits(int n) {
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir_)) {
      if (e.is_regular_file() && e.file_size() > 0) files.push_back(e.path());
    }
    if (files.empty()) return;
    for (int i = 0; i < n; ++i) {
      const std::string& path = files[rng_() % files.size()];
      const uint64_t size = std::filesystem::file_size(path);
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      if (!f) {  // value files are read-only
        std::filesystem::permissions(path, std::filesystem::perms::owner_write,
                                     std::filesystem::perm_options::add);
        f.open(path, std::ios::in | std::ios::out | std::ios::binary);
      }
      if (!f) continue;
      const uint64_t offset = rng_() % size;
      char c = 0;
      f.seekg(std::streamoff(offset));
      f.get(c);
      c = char(c ^ (1 << (rng_() % 8)));
      f.seekp(std::streamoff(offset));
      f.put(c);
      flips_.fetch_add(1);
      flipped_[KindOf(path)]++;
    }
  }

  // What a file of the data directory is, for the flip counts.
  static std::string KindOf(const std::filesystem::path& path) {
    const std::string name = path.filename().string();
    if (path.parent_path().filename() == "values") return "value";
    for (const char* prefix : {"MANIFEST", "CURRENT", "OPTIONS", "LOG", "IDENTITY", "LOCK"}) {
      if (name.rfind(prefix, 0) == 0) return prefix;
    }
    if (path.extension() == ".sst" || path.extension() == ".log") {
      return path.extension().string().substr(1);
    }
    return "other";
  }

  // Adds the index flushes and compactions RocksDB logged since the last call (its LOG files
  // go when the index is rebuilt, so they are counted after every crash).
  void CountIndexEvents() {
    int64_t newest = last_event_micros_;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      if (e.path().filename().string().rfind("LOG", 0) != 0) continue;
      std::ifstream in(e.path());
      for (std::string line; std::getline(in, line);) {
        const size_t t = line.find("\"time_micros\": ");
        int64_t micros = 0;
        if (t == std::string::npos ||
            !absl::SimpleAtoi(line.substr(t + 15, line.find_first_of(",}", t) - t - 15), &micros) ||
            micros <= last_event_micros_) {
          continue;
        }
        newest = std::max(newest, micros);
        flushes_ += line.find("\"event\": \"flush_finished\"") != std::string::npos;
        compactions_ += line.find("\"event\": \"compaction_finished\"") != std::string::npos;
      }
    }
    last_event_micros_ = newest;
  }

  void Run(uint64_t seed, absl::Duration budget) {
    seed_ = seed;
    keys_.resize(kKeys);
    const absl::Time end = absl::Now() + budget;
    ASSERT_TRUE(server_.Start().ok());
    int iterations = 0, kills = 0;
    while (absl::Now() < end && !failed_.load()) {
      ++iterations;
      VerifyAll();
      if (::testing::Test::HasFatalFailure()) return;
      stop_ = false;
      std::vector<std::unique_ptr<KvClient>> clients;
      std::vector<std::thread> writers;
      for (int w = 0; w < kWriters; ++w) {
        clients.push_back(Client());
        ASSERT_NE(clients.back(), nullptr);
        writers.emplace_back(&CrashLoop::Writer, this, w, rng_(), clients.back().get());
      }
      absl::SleepFor(absl::Milliseconds(50 + rng_() % 700));
      server_.Kill();  // mid-put, mid-get, mid-flush or mid-compaction
      ++kills;
      stop_ = true;
      for (auto& t : writers) t.join();
      CountIndexEvents();
      if (rng_() % 2 == 0) FlipBits(1 + int(rng_() % 3));
      const absl::Status restarted = server_.Restart();
      ASSERT_TRUE(restarted.ok()) << "the shard did not start after a crash: " << restarted
                                  << " (seed " << seed_ << ")";
    }
    VerifyAll();
    server_.Kill();
    ASSERT_FALSE(failed_.load()) << first_failure_ << " (seed " << seed_ << ")";
    CountIndexEvents();
    std::string by_kind;
    for (const auto& [kind, n] : flipped_) absl::StrAppend(&by_kind, " ", kind, ":", n);
    std::cout << "crash loop: seed " << seed_ << ", " << iterations << " iterations, " << kills
              << " kills, " << flips_.load() << " bit flips (" << by_kind << " ), "
              << counts_.verified.load() << " values verified (" << counts_.whole.load()
              << " whole, " << counts_.absent.load() << " cleanly absent, 0 wrong); "
              << counts_.puts.load() << " puts (" << counts_.acked_puts.load() << " acknowledged), "
              << counts_.gets.load() << " gets, " << counts_.deletes.load() << " deletes; "
              << flushes_ << " index flushes and " << compactions_
              << " compactions finished (and more cut short by the kills)\n";
    EXPECT_GT(counts_.whole.load(), 0);
    EXPECT_GT(kills, 0);
  }

 private:
  void Fail(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.exchange(true)) first_failure_ = why;
  }

  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  KvStoreProcess server_;
  const std::string dir_;
  std::vector<KeyState> keys_;
  std::atomic<bool> stop_{false};
  std::atomic<int> next_version_{0};
  std::atomic<int64_t> flips_{0};
  std::map<std::string, int> flipped_;  // by KindOf
  int64_t last_event_micros_ = 0;
  int64_t flushes_ = 0, compactions_ = 0;
  Counts counts_;
  std::mutex mu_;
  std::atomic<bool> failed_{false};
  std::string first_failure_;
};

TEST(KvStoreCrashLoopTest, EveryAcknowledgedValueIsWholeOrCleanlyAbsentNeverWrong) {
  uint64_t seed = uint64_t(absl::ToUnixNanos(absl::Now()));
  double seconds = 60;
  if (const char* s = std::getenv("LAZYRAG_CRASH_LOOP_SEED")) {
    ASSERT_TRUE(absl::SimpleAtoi(s, &seed));
  }
  if (const char* s = std::getenv("LAZYRAG_CRASH_LOOP_SECONDS")) {
    ASSERT_TRUE(absl::SimpleAtod(s, &seconds));
  }
  std::cout << "crash loop: seed " << seed << " (LAZYRAG_CRASH_LOOP_SEED=" << seed
            << " repeats it), " << seconds << " s\n";
  TempDir dir;
  CrashLoop loop(seed, dir.path());
  loop.Run(seed, absl::Seconds(seconds));
}

}  // namespace
}  // namespace lazyrag::kvstore
