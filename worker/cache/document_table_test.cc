#include "worker/cache/document_table.h"

#include "gtest/gtest.h"

namespace lazyrag {
namespace {

TEST(DocumentTableTest, PinnedEntriesSurviveEvictionAndLruGoesFirst) {
  PageAllocator alloc(10);
  DocumentTable table(&alloc);
  auto a = table.AllocatePages(4);
  ASSERT_TRUE(a.ok());
  table.Insert("a", {*a, 60});
  auto b = table.AllocatePages(4);
  ASSERT_TRUE(b.ok());
  table.Insert("b", {*b, 64});
  table.Release("a");  // a is unreferenced and oldest
  table.Release("b");
  ASSERT_TRUE(table.Acquire("b").ok());  // b pinned again
  auto c = table.AllocatePages(5);       // needs a's pages
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(table.Contains("a"));
  EXPECT_TRUE(table.Contains("b"));
  EXPECT_EQ(table.Stats().evictions, 1);
  // Only pinned b and c's pages are left in use: nothing more to evict.
  auto d = table.AllocatePages(2);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kResourceExhausted);
  table.FreePages(*c);
  EXPECT_EQ(alloc.num_free(), 6);
  EXPECT_EQ(table.Acquire("zzz").status().code(), absl::StatusCode::kNotFound);
}

// Each entry holds 4 of 16 pages; allocating 4 more pages evicts exactly one entry.
TEST(DocumentTableTest, PreparedEntriesGoFirstUntilARequestUsesThem) {
  using By = DocumentTable::ReleaseBy;
  PageAllocator alloc(16);
  DocumentTable table(&alloc);
  const auto insert = [&](const std::string& id) {
    auto p = table.AllocatePages(4);
    ASSERT_TRUE(p.ok()) << p.status();
    table.Insert(id, {*p, 64});
  };
  const auto evict_one = [&]() -> std::string {  // the pages stay allocated
    std::vector<DocumentTable::Evicted> evicted;
    auto p = table.AllocatePages(4, &evicted);
    EXPECT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(evicted.size(), 1u);
    return evicted.empty() ? "" : evicted[0].id;
  };
  insert("used");
  table.Release("used");  // a request's: most recently used
  insert("p1");           // prepared: the job's pin, then the preparation's
  ASSERT_TRUE(table.Acquire("p1").ok());
  table.Release("p1", By::kJob);
  table.Release("p1", By::kPreparation);
  insert("p2");
  ASSERT_TRUE(table.Acquire("p2").ok());
  table.Release("p2", By::kJob);
  table.Release("p2", By::kPreparation);
  insert("p3");
  ASSERT_TRUE(table.Acquire("p3").ok());
  table.Release("p3", By::kPreparation);
  table.Release("p3", By::kJob);  // the job's release last: most recently used, not a use
  // A request uses p1: from then on it ages like any used entry, prepared again or not.
  ASSERT_TRUE(table.Acquire("p1").ok());
  table.Release("p1");
  ASSERT_TRUE(table.Acquire("p1").ok());
  table.Release("p1", By::kPreparation);
  // Eviction order: prepared-only entries first (latest first), then least recently used.
  EXPECT_EQ(evict_one(), "p2");
  EXPECT_EQ(evict_one(), "used");
  EXPECT_EQ(evict_one(), "p3");
  EXPECT_EQ(evict_one(), "p1");
}

TEST(DocumentTableTest, DuplicateInsertKeepsFirstAndFreesSecond) {
  PageAllocator alloc(4);
  DocumentTable table(&alloc);
  auto p1 = table.AllocatePages(2);
  auto p2 = table.AllocatePages(2);
  DocumentRun r1 = table.Insert("x", {*p1, 20});
  DocumentRun r2 = table.Insert("x", {*p2, 20});
  EXPECT_EQ(r1.pages, r2.pages);
  EXPECT_EQ(alloc.num_free(), 2);
  EXPECT_EQ(table.Stats().pinned_entries, 1);
}

TEST(DocumentTableTest, AcquireWithTokensPinsAndReturnsTheInsertedTokens) {
  PageAllocator alloc(4);
  DocumentTable table(&alloc);
  auto p = table.AllocatePages(2);
  ASSERT_TRUE(p.ok());
  table.Insert("x", {*p, 20}, std::vector<int32_t>(20, 7));
  table.Release("x");
  std::vector<int32_t> tokens;
  auto run = table.Acquire("x", &tokens);
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->pages, *p);
  EXPECT_EQ(tokens, std::vector<int32_t>(20, 7));
  // Pinned: its pages cannot be evicted while the caller holds it.
  EXPECT_EQ(table.AllocatePages(3).status().code(), absl::StatusCode::kResourceExhausted);
  table.Release("x");
  EXPECT_TRUE(table.AllocatePages(3).ok());
  EXPECT_EQ(table.Acquire("x", &tokens).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace lazyrag
