// The RocksDB engine without gRPC: atomic commits, abandoned and crashed puts, LRU eviction,
// on-disk corruption, recovery from RocksDB background errors.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/metrics.h"
#include "kvstore/kv_engine.h"
#include "kvstore/kvstore_metrics.h"
#include "kvstore/tests/test_util.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/file_system.h"

namespace lazyrag::kvstore {
namespace {

using testing::PatternBytes;
using testing::TempDir;

// A file system whose write-ahead-log writes and syncs fail while `failures` is positive (each
// failure uses one up), as a failing disk would fail them.
class FailingLogFs final : public rocksdb::FileSystemWrapper {
 public:
  FailingLogFs() : FileSystemWrapper(rocksdb::FileSystem::Default()) {}
  const char* Name() const override { return "FailingLogFs"; }
  static const char* kClassName() { return "FailingLogFs"; }

  rocksdb::IOStatus NewWritableFile(const std::string& name, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->NewWritableFile(name, options, result, dbg);
    if (s.ok() && name.ends_with(".log")) {
      *result = std::make_unique<LogFile>(std::move(*result), &failures);
    }
    return s;
  }

  std::atomic<int> failures{0};

 private:
  class LogFile final : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    LogFile(std::unique_ptr<rocksdb::FSWritableFile> file, std::atomic<int>* failures)
        : FSWritableFileOwnerWrapper(std::move(file)), failures_(failures) {}
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                             rocksdb::IODebugContext* dbg) override {
      if (Fail()) return rocksdb::IOStatus::IOError("injected log write failure");
      return FSWritableFileOwnerWrapper::Append(data, options, dbg);
    }
    rocksdb::IOStatus Sync(const rocksdb::IOOptions& options,
                           rocksdb::IODebugContext* dbg) override {
      if (Fail()) return rocksdb::IOStatus::IOError("injected log sync failure");
      return FSWritableFileOwnerWrapper::Sync(options, dbg);
    }

   private:
    bool Fail() {
      for (int n = failures_->load(); n > 0;) {
        if (failures_->compare_exchange_weak(n, n - 1)) return true;
      }
      return false;
    }
    std::atomic<int>* failures_;
  };
};

class EngineTest : public ::testing::Test {
 protected:
  std::unique_ptr<KvEngine> Open(uint64_t capacity = 1 << 30,
                                 std::shared_ptr<rocksdb::Env> env = nullptr) {
    RocksEngineOptions o;
    o.data_dir = dir_.path() + "/db";
    o.capacity_bytes = capacity;
    o.sync_commits = false;
    o.metrics = &metrics_;
    o.env = std::move(env);
    auto engine = OpenRocksEngine(o);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return std::move(engine).value();
  }

  static ValueLayout LayoutFor(uint64_t size, uint32_t chunk = 1000) {
    ValueLayout l;
    l.total_size = size;
    l.chunk_size = chunk;
    l.num_chunks = NumChunks(size, chunk);
    return l;
  }

  // Stages every chunk of `value`; commits unless told not to.
  static std::unique_ptr<PutSession> Stage(KvEngine& engine, const std::string& key,
                                           const std::string& value) {
    const ValueLayout layout = LayoutFor(value.size());
    auto session = engine.BeginPut(key, layout);
    EXPECT_TRUE(session.ok()) << session.status();
    for (uint32_t i = 0; i < layout.num_chunks; ++i) {
      std::string_view chunk = std::string_view(value).substr(
          layout.ChunkBegin(i), layout.ChunkEnd(i) - layout.ChunkBegin(i));
      EXPECT_TRUE((*session)->AddChunk(i, chunk, Crc32c(chunk)).ok());
    }
    return std::move(session).value();
  }
  static void Put(KvEngine& engine, const std::string& key, const std::string& value) {
    ASSERT_TRUE(Stage(engine, key, value)->Commit().ok());
  }
  static absl::StatusOr<std::string> Read(KvEngine& engine, const std::string& key) {
    auto reader = engine.Open(key);
    if (!reader.ok()) return reader.status();
    std::string out, chunk;
    uint32_t crc;
    for (uint32_t i = 0; i < (*reader)->layout().num_chunks; ++i) {
      absl::Status st = (*reader)->ReadChunk(i, &chunk, &crc);
      if (!st.ok()) return st;
      out += chunk;
    }
    return out;
  }
  // Files under values/ (committed values and staging files of puts in progress).
  int CountValueFiles() {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir_.path() + "/db/values")) {
      n += e.is_regular_file() ? 1 : 0;
    }
    return n;
  }

  TempDir dir_;
  metrics::Registry registry_;
  KvStoreMetrics metrics_{&registry_};
};

TEST_F(EngineTest, CommitIsAtomicAndSurvivesReopen) {
  const std::string v1 = PatternBytes(4500, 1), v2 = PatternBytes(2500, 2);
  {
    auto engine = Open();
    auto session = Stage(*engine, "Rk", v1);
    EXPECT_EQ(engine->Open("Rk").status().code(), absl::StatusCode::kNotFound);  // not yet
    auto replaced = session->Commit();
    ASSERT_TRUE(replaced.ok());
    EXPECT_FALSE(*replaced);
    EXPECT_EQ(*Read(*engine, "Rk"), v1);
    // A reader opened before a re-put keeps reading the old value to the end.
    auto old_reader = engine->Open("Rk");
    ASSERT_TRUE(old_reader.ok());
    auto again = Stage(*engine, "Rk", v2)->Commit();
    ASSERT_TRUE(again.ok());
    EXPECT_TRUE(*again);
    std::string chunk;
    uint32_t crc;
    ASSERT_TRUE((*old_reader)->ReadChunk(4, &chunk, &crc).ok());
    EXPECT_EQ(chunk, v1.substr(4000));
    EXPECT_EQ(*Read(*engine, "Rk"), v2);
  }
  auto engine = Open();
  EXPECT_EQ(*Read(*engine, "Rk"), v2);
  EXPECT_EQ(engine->Usage().bytes, v2.size());
  EXPECT_EQ(CountValueFiles(), 1) << "the old generation's file should be gone";
}

TEST_F(EngineTest, AbandonedAndCrashedPutsLeaveNothing) {
  const std::string v = PatternBytes(4500, 1);
  {
    auto engine = Open();
    Put(*engine, "Rkeep", v);
    // Abandoned (stream error): the session's destructor drops its chunks.
    Stage(*engine, "Rkeep", PatternBytes(4500, 2)).reset();
    Stage(*engine, "Rnew", PatternBytes(4500, 3)).reset();
    EXPECT_EQ(*Read(*engine, "Rkeep"), v);
    EXPECT_EQ(engine->Open("Rnew").status().code(), absl::StatusCode::kNotFound);
    // "Crashed" put: the session is never destroyed, as when the process dies mid-stream (kept
    // reachable from a list never freed, so that LeakSanitizer does not report it).
    static auto* crashed = new std::vector<PutSession*>;
    crashed->push_back(Stage(*engine, "Rkeep", PatternBytes(4500, 4)).release());
    crashed->push_back(Stage(*engine, "Rcrash", PatternBytes(4500, 5)).release());
  }
  EXPECT_EQ(CountValueFiles(), 1 + 2);
  auto engine = Open();  // drops files that no header points at
  EXPECT_EQ(*Read(*engine, "Rkeep"), v);
  EXPECT_EQ(engine->Open("Rcrash").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(CountValueFiles(), 1);
}

// A database of the earlier format (header and chunk rows inside RocksDB) opens empty: its
// values are dropped, to be recomputed, and nothing of them is served.
TEST_F(EngineTest, EarlierFormatRowsAreDroppedAtOpen) {
  {
    rocksdb::Options o;
    o.create_if_missing = true;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(o, dir_.path() + "/db", &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "HRold", std::string(40, 'h')).ok());
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "C\x00\x00\x00\x04Rold", "chunk").ok());
  }
  auto engine = Open();
  EXPECT_EQ(engine->Usage().entries, 0u);
  EXPECT_EQ(engine->Open("Rold").status().code(), absl::StatusCode::kNotFound);
  Put(*engine, "Rnew", PatternBytes(100, 1));
  EXPECT_EQ(*Read(*engine, "Rnew"), PatternBytes(100, 1));
  engine.reset();
  rocksdb::DB* raw = nullptr;
  ASSERT_TRUE(rocksdb::DB::OpenForReadOnly(rocksdb::Options(), dir_.path() + "/db", &raw).ok());
  std::unique_ptr<rocksdb::DB> db(raw);
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    EXPECT_TRUE(it->key()[0] != 'H' && it->key()[0] != 'C') << it->key().ToString();
  }
}

TEST_F(EngineTest, EvictsLeastRecentlyUsedWithinCapacity) {
  auto engine = Open(/*capacity=*/10'000);
  Put(*engine, "Ra", PatternBytes(3000, 1));
  Put(*engine, "Rb", PatternBytes(3000, 2));
  Put(*engine, "Rc", PatternBytes(3000, 3));
  ASSERT_TRUE(Read(*engine, "Ra").ok());      // a is now more recent than b
  Put(*engine, "Rd", PatternBytes(3000, 4));  // must evict b only
  EXPECT_TRUE(Read(*engine, "Ra").ok());
  EXPECT_EQ(engine->Open("Rb").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Read(*engine, "Rc").ok());
  EXPECT_LE(engine->Usage().bytes, 10'000u);
  EXPECT_EQ(metrics_.evictions().Value(), 1);
  EXPECT_EQ(engine->BeginPut("Rhuge", LayoutFor(10'001)).status().code(),
            absl::StatusCode::kResourceExhausted);
  auto evicted = engine->EvictTo(3000);
  ASSERT_TRUE(evicted.ok());
  EXPECT_EQ(*evicted, 2u);
  EXPECT_EQ(engine->Usage().entries, 1u);
  auto stat = engine->Stat("Rc");  // the most recently read of a, c, d is c
  ASSERT_TRUE(stat.ok());
  EXPECT_TRUE(stat->present);
  EXPECT_GT(stat->last_access_unix_ms, 0);
  // A smaller capacity at reopen evicts down to it.
  engine.reset();
  engine = Open(/*capacity=*/1000);
  EXPECT_EQ(engine->Usage().entries, 0u);
}

TEST_F(EngineTest, FlippedByteOnDiskIsDataLoss) {
  {
    auto engine = Open();
    Put(*engine, "Rk", PatternBytes(4500, 1));
  }
  {  // Flip one byte of the value's file; its stored CRC stays.
    auto path = StoredValuePath(dir_.path() + "/db", "Rk");
    ASSERT_TRUE(path.ok()) << path.status();
    ASSERT_TRUE(testing::FlipByte(*path, 1010).ok());
  }
  auto engine = Open();
  auto got = Read(*engine, "Rk");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  EXPECT_EQ(testing::MetricValue(registry_.Serialize(),
                                 "lazyrag_kvstore_corruptions_total{where=\"disk\"}"),
            1);
  // Dropped on that read (index and file): absent now, and the next put stores it whole.
  EXPECT_EQ(engine->Open("Rk").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(engine->Usage().entries, 0u);
  EXPECT_EQ(CountValueFiles(), 0);
  Put(*engine, "Rk", PatternBytes(4500, 1));
  EXPECT_EQ(*Read(*engine, "Rk"), PatternBytes(4500, 1));
}

// Bit rot in the index (a byte flipped in a RocksDB table file): the engine rebuilds the index
// from the value files' trailers at open and starts; every value whose file is intact is served
// (one whose trailer is damaged too is dropped, its file deleted), never a wrong byte, and puts
// work.
TEST_F(EngineTest, CorruptIndexIsRepairedAndTheShardStillOpens) {
  std::vector<std::string> keys;
  for (int i = 0; i < 200; ++i) keys.push_back(absl::StrCat("R", 1000 + i));  // several blocks
  {
    auto engine = Open();
    for (size_t i = 0; i < keys.size(); ++i) Put(*engine, keys[i], PatternBytes(3000, i + 1));
  }
  {  // The index rows into a table file, then one byte of it flipped.
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir_.path() + "/db", &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    ASSERT_TRUE(db->Flush(rocksdb::FlushOptions()).ok());
    ASSERT_TRUE(db->Close().ok());
  }
  std::string sst;
  for (const auto& e : std::filesystem::directory_iterator(dir_.path() + "/db")) {
    if (e.path().extension() == ".sst") sst = e.path();
  }
  ASSERT_FALSE(sst.empty());
  ASSERT_TRUE(testing::FlipByte(sst, 40).ok());  // inside the first data block
  std::string damaged;
  {
    auto path = StoredValuePath(dir_.path() + "/db", "R1005");
    ASSERT_TRUE(path.ok()) << path.status();
    damaged = *path;
  }
  ASSERT_TRUE(testing::FlipByte(damaged, std::filesystem::file_size(damaged) - 3).ok());
  auto engine = Open();
  ASSERT_NE(engine, nullptr);
  int whole = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto got = Read(*engine, keys[i]);
    if (got.ok()) {
      EXPECT_EQ(*got, PatternBytes(3000, i + 1)) << keys[i];
      ++whole;
    } else {
      EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound) << got.status();
    }
  }
  EXPECT_EQ(CountValueFiles(), whole);
  EXPECT_EQ(whole, 199);
  EXPECT_EQ(engine->Open("R1005").status().code(), absl::StatusCode::kNotFound);
  EXPECT_GE(testing::MetricValue(registry_.Serialize(),
                                 "lazyrag_kvstore_corruptions_total{where=\"disk\"}"),
            1);
  Put(*engine, "Rnew", PatternBytes(100, 9));
  EXPECT_EQ(*Read(*engine, "Rnew"), PatternBytes(100, 9));
}

// A failed write-ahead-log write puts RocksDB into its background-error state, in which every
// later write fails until the database is resumed. The engine recovers in place (no restart):
// the put that met the error is retried once after the recovery, and with the disk failing for
// longer, the puts after the failure works again. Nothing acknowledged is lost.
TEST_F(EngineTest, PutsKeepWorkingAfterABackgroundError) {
  auto fs = std::make_shared<FailingLogFs>();
  std::shared_ptr<rocksdb::Env> env(rocksdb::NewCompositeEnv(fs).release());
  auto engine = Open(1 << 30, env);
  Put(*engine, "Rbefore", PatternBytes(2500, 1));

  fs->failures = 1;  // one failed log write: recovered and retried within the same put
  Put(*engine, "Rone", PatternBytes(2500, 2));
  EXPECT_EQ(fs->failures, 0);

  fs->failures = 3;  // fails the put and its retry
  auto failed = Stage(*engine, "Rlost", PatternBytes(2500, 3))->Commit();
  EXPECT_FALSE(failed.ok());
  EXPECT_EQ(engine->Open("Rlost").status().code(), absl::StatusCode::kNotFound);
  fs->failures = 0;
  for (int i = 0; i < 20; ++i) Put(*engine, absl::StrCat("Rafter", i), PatternBytes(2500, 10 + i));

  const std::string metrics = registry_.Serialize();
  EXPECT_GE(testing::MetricValue(metrics, "lazyrag_kvstore_index_errors_total"), 2) << metrics;
  EXPECT_GE(
      testing::MetricValue(metrics, "lazyrag_kvstore_index_recoveries_total{how=\"resume\"}") +
          testing::MetricValue(metrics, "lazyrag_kvstore_index_recoveries_total{how=\"reopen\"}"),
      2)
      << metrics;
  EXPECT_EQ(*Read(*engine, "Rbefore"), PatternBytes(2500, 1));
  EXPECT_EQ(*Read(*engine, "Rone"), PatternBytes(2500, 2));
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(*Read(*engine, absl::StrCat("Rafter", i)), PatternBytes(2500, 10 + i));
  }
  EXPECT_TRUE(engine->Delete("Rbefore").ok());
  // What was acknowledged survives a reopen.
  engine.reset();
  engine = Open();
  EXPECT_EQ(engine->Open("Rbefore").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*Read(*engine, "Rone"), PatternBytes(2500, 2));
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(*Read(*engine, absl::StrCat("Rafter", i)), PatternBytes(2500, 10 + i));
  }
}

// RocksDB's CURRENT file naming a manifest that is not there (a flipped digit) makes RocksDB
// refuse to open with an I/O error, not a corruption: the engine rebuilds the index from the
// value files all the same and serves every value.
TEST_F(EngineTest, IndexThatRocksDbCannotOpenIsRebuilt) {
  {
    auto engine = Open();
    for (int i = 0; i < 10; ++i) Put(*engine, absl::StrCat("R", i), PatternBytes(1500, i + 1));
  }
  {
    std::ofstream current(dir_.path() + "/db/CURRENT", std::ios::trunc);
    current << "MANIFEST-999999\n";
  }
  auto engine = Open();
  ASSERT_NE(engine, nullptr);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(*Read(*engine, absl::StrCat("R", i)), PatternBytes(1500, i + 1));
  }
  Put(*engine, "Rnew", PatternBytes(100, 9));
  EXPECT_EQ(*Read(*engine, "Rnew"), PatternBytes(100, 9));
}

TEST_F(EngineTest, SecondOpenOfOneDirectoryIsUnavailable) {
  auto engine = Open();
  RocksEngineOptions o;
  o.data_dir = dir_.path() + "/db";
  EXPECT_EQ(OpenRocksEngine(o).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace lazyrag::kvstore
