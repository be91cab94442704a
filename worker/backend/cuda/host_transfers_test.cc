// KvCopyChunks: the copy engines' pieces of a page run cover its transport form exactly (host
// code; runs without a GPU). The copies themselves: cuda_backend_test's
// KvToHostAndBackIsBitIdentical.
#include "worker/backend/cuda/host_transfers.h"

#include <gtest/gtest.h>

#include <vector>

namespace lazyrag::cuda_backend {
namespace {

cuda_model::KvTransportParams Layout(int num_layers, int page_size, int kv_dim, int num_tokens,
                                     int64_t num_pages) {
  cuda_model::KvTransportParams kv;
  kv.num_layers = num_layers;
  kv.page_size = page_size;
  kv.kv_dim = kv_dim;
  kv.num_tokens = num_tokens;
  kv.v_offset = num_pages * page_size * kv_dim;
  kv.layer_stride = 2 * kv.v_offset;
  return kv;
}

// Every element of the transport form maps to the pool element the transport kernels use
// (kv_transport.cu's PoolUnit), once.
void ExpectCoversRun(const cuda_model::KvTransportParams& kv, const std::vector<int32_t>& pages,
                     const std::vector<KvCopyChunk>& chunks) {
  const int64_t total = int64_t(kv.num_layers) * 2 * kv.num_tokens * kv.kv_dim;
  std::vector<int> seen(size_t(total), 0);
  for (const KvCopyChunk& c : chunks) {
    ASSERT_GT(c.elems, 0);
    for (int64_t e = 0; e < c.elems; ++e) {
      const int64_t b = c.buffer_elem + e;
      ASSERT_GE(b, 0);
      ASSERT_LT(b, total);
      ++seen[size_t(b)];
      const int64_t col = b % kv.kv_dim;
      const int64_t j = (b / kv.kv_dim) % kv.num_tokens;
      const int64_t plane = b / kv.kv_dim / kv.num_tokens;
      const int64_t slot =
          int64_t(pages[size_t(j / kv.page_size)]) * kv.page_size + j % kv.page_size;
      const int64_t pool =
          (plane / 2) * kv.layer_stride + (plane % 2) * kv.v_offset + slot * kv.kv_dim + col;
      ASSERT_EQ(c.pool_elem + e, pool) << "buffer element " << b;
    }
  }
  for (int64_t b = 0; b < total; ++b) ASSERT_EQ(seen[size_t(b)], 1) << "buffer element " << b;
}

TEST(KvCopyChunksTest, ConsecutivePagesAreOnePiecePerLayerAndKind) {
  const auto kv = Layout(3, 16, 8, 45, 64);
  const std::vector<int32_t> pages{10, 11, 12};
  const std::vector<KvCopyChunk> chunks = KvCopyChunks(kv, pages);
  ASSERT_EQ(chunks.size(), 6u);  // 3 layers x K, V
  for (const KvCopyChunk& c : chunks) EXPECT_EQ(c.elems, 45 * 8);
  ExpectCoversRun(kv, pages, chunks);
}

TEST(KvCopyChunksTest, ScatteredAndDescendingPagesSplitIntoRuns) {
  const auto kv = Layout(2, 4, 4, 17, 40);
  // Runs: {7}, {2, 3}, {30}, {29} (the last page holds one token).
  const std::vector<int32_t> pages{7, 2, 3, 30, 29};
  const std::vector<KvCopyChunk> chunks = KvCopyChunks(kv, pages);
  EXPECT_EQ(chunks.size(), 4u * 2 * 2);
  ExpectCoversRun(kv, pages, chunks);
}

TEST(KvCopyChunksTest, PartialLastPageAndSinglePage) {
  for (int n : {1, 3, 16, 17, 31, 32, 33}) {
    const auto kv = Layout(2, 16, 4, n, 8);
    std::vector<int32_t> pages;
    for (int q = 0; q < (n + 15) / 16; ++q) pages.push_back(4 + q);
    ExpectCoversRun(kv, pages, KvCopyChunks(kv, pages));
  }
}

TEST(KvCopyChunksTest, NoTokensNoPieces) {
  const auto kv = Layout(2, 16, 4, 0, 8);
  EXPECT_TRUE(KvCopyChunks(kv, {}).empty());
}

}  // namespace
}  // namespace lazyrag::cuda_backend
