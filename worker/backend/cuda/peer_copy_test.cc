// Page copies between paged pools (worker/backend/cuda/peer_copy.h) against a host reference:
// argument checks (no GPU needed), then the gather kernel, the page-run copies and the
// pool <-> buffer transport on one GPU, and across two GPUs (pull and push) when there are two.
// Destinations are poisoned before every copy; layouts that are not 8B-shaped are swept.
#include "worker/backend/cuda/peer_copy.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace lazyrag::peer_copy {
namespace {

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

PoolLayout Layout(int layers, int pages, int page_size, int kv_dim) {
  PoolLayout l;
  l.num_layers = layers;
  l.num_pages = pages;
  l.page_size = page_size;
  l.kv_dim = kv_dim;
  l.elem_bytes = 2;
  return l;
}

TEST(PeerCopyTest, ChecksRefuseMismatchedOrOutOfRangePages) {
  const PoolLayout a = Layout(2, 8, 16, 64), b = Layout(2, 4, 16, 64);
  EXPECT_TRUE(CheckPageCopy(a, b, {7, 0}, {3, 1}).ok());
  EXPECT_EQ(CheckPageCopy(a, b, {7, 0}, {4, 1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckPageCopy(a, b, {-1}, {0}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckPageCopy(a, b, {1, 2}, {0}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckPageCopy(a, Layout(2, 8, 8, 64), {0}, {0}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckPageCopy(a, Layout(3, 8, 16, 64), {0}, {0}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Offset(1, 1, 2), a.LayerStrideBytes() + a.KvBytes() + 2 * a.PageBytes());
  EXPECT_EQ(a.PoolBytes(), 2 * 2 * 8 * 16 * 64 * 2);
}

// A device pool with host mirror.
struct Pool {
  PoolLayout layout;
  int device = 0;
  void *dev = nullptr;
  Pool(const PoolLayout &l, int d) : layout(l), device(d) {
    cudaSetDevice(d);
    EXPECT_EQ(cudaMalloc(&dev, l.PoolBytes()), cudaSuccess);
  }
  ~Pool() {
    cudaSetDevice(device);
    cudaFree(dev);
  }
  void Upload(const std::vector<char> &h) {
    cudaSetDevice(device);
    ASSERT_EQ(cudaMemcpy(dev, h.data(), h.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<char> Download() {
    std::vector<char> h(layout.PoolBytes());
    cudaSetDevice(device);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(h.data(), dev, h.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  void Poison() {
    cudaSetDevice(device);
    ASSERT_EQ(cudaMemset(dev, 0xA5, layout.PoolBytes()), cudaSuccess);
  }
};

std::vector<char> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<char> v(n);
  for (char &c : v) c = char(rng());
  return v;
}

// The host reference: expected destination pool after copying src pages into dst pages.
std::vector<char> Expected(std::vector<char> dst, const std::vector<char> &src, const PoolLayout &s,
                           const PoolLayout &d, const std::vector<int32_t> &sp,
                           const std::vector<int32_t> &dp) {
  for (int l = 0; l < s.num_layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      for (size_t i = 0; i < sp.size(); ++i) {
        std::memcpy(dst.data() + d.Offset(l, kv, dp[i]), src.data() + s.Offset(l, kv, sp[i]),
                    s.PageBytes());
      }
    }
  }
  return dst;
}

// Distinct random pages; the first three form a run consecutive in both pools.
void PickPages(int n, int src_pages, int dst_pages, uint32_t seed, std::vector<int32_t> *sp,
               std::vector<int32_t> *dp) {
  std::mt19937 rng(seed);
  std::vector<int32_t> a(src_pages - 3), b(dst_pages - 3);
  std::iota(a.begin(), a.end(), 3);  // 3 .. src_pages-1
  std::iota(b.begin(), b.end(), 0);  // 0 .. dst_pages-4
  std::shuffle(a.begin(), a.end(), rng);
  std::shuffle(b.begin(), b.end(), rng);
  *sp = {0, 1, 2};
  *dp = {dst_pages - 3, dst_pages - 2, dst_pages - 1};
  sp->insert(sp->end(), a.begin(), a.begin() + (n - 3));
  dp->insert(dp->end(), b.begin(), b.begin() + (n - 3));
}

// Runs of pages consecutive in both lists.
int64_t Runs(const std::vector<int32_t> &sp, const std::vector<int32_t> &dp) {
  int64_t runs = sp.empty() ? 0 : 1;
  for (size_t i = 1; i < sp.size(); ++i)
    runs += !(sp[i] == sp[i - 1] + 1 && dp[i] == dp[i - 1] + 1);
  return runs;
}

void RunCopies(int src_device, int dst_device, int run_device) {
  struct Shape {
    int layers, page_size, kv_dim;
  };
  for (Shape sh : {Shape{2, 16, 64}, Shape{3, 7, 24}, Shape{1, 1, 8}, Shape{4, 16, 1024}}) {
    SCOPED_TRACE(testing::Message()
                 << "layers " << sh.layers << " page " << sh.page_size << " kv_dim " << sh.kv_dim);
    const PoolLayout sl = Layout(sh.layers, 23, sh.page_size, sh.kv_dim);
    const PoolLayout dl = Layout(sh.layers, 17, sh.page_size, sh.kv_dim);
    Pool src(sl, src_device), dst(dl, dst_device);
    const std::vector<char> host_src = RandomBytes(sl.PoolBytes(), 11);
    src.Upload(host_src);
    std::vector<int32_t> sp, dp;
    PickPages(9, sl.num_pages, dl.num_pages, 5, &sp, &dp);
    ASSERT_TRUE(CheckPageCopy(sl, dl, sp, dp).ok());

    // Gather kernel on run_device.
    dst.Poison();
    const std::vector<char> expected = Expected(dst.Download(), host_src, sl, dl, sp, dp);
    cudaSetDevice(run_device);
    int32_t *pages = nullptr;
    ASSERT_EQ(cudaMalloc(&pages, 2 * sp.size() * sizeof(int32_t)), cudaSuccess);
    cudaMemcpy(pages, sp.data(), sp.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(pages + sp.size(), dp.data(), dp.size() * 4, cudaMemcpyHostToDevice);
    PageGatherParams p;
    p.src_pool = src.dev;
    p.dst_pool = dst.dev;
    p.src = sl;
    p.dst = dl;
    p.src_pages = pages;
    p.dst_pages = pages + sp.size();
    p.num_pages = int(sp.size());
    ASSERT_TRUE(LaunchPageGather(p, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(dst.Download() == expected) << "gather";

    // Page runs by the copy engines.
    dst.Poison();
    cudaSetDevice(dst_device);
    auto copies = CopyPageRuns(src.dev, src_device, sl, sp, dst.dev, dst_device, dl, dp, nullptr);
    ASSERT_TRUE(copies.ok()) << copies.status();
    EXPECT_EQ(*copies, 2 * sh.layers * Runs(sp, dp));
    EXPECT_LE(Runs(sp, dp), int64_t(sp.size()) - 2);  // the 3-page run is one copy
    EXPECT_TRUE(dst.Download() == expected) << "page runs";

    // Pool -> buffer -> pool (transport order) on the source device, then into dst pages.
    if (src_device == dst_device) {
      cudaSetDevice(src_device);
      void *buf = nullptr;
      const size_t bytes = size_t(2) * sh.layers * sp.size() * sl.PageBytes();
      ASSERT_EQ(cudaMalloc(&buf, bytes), cudaSuccess);
      ASSERT_TRUE(LaunchPagesToBuffer(src.dev, sl, pages, int(sp.size()), buf, true, nullptr).ok());
      std::vector<char> hb(bytes);
      cudaMemcpy(hb.data(), buf, bytes, cudaMemcpyDeviceToHost);
      // Transport order: layer, K|V, page i.
      for (int l = 0; l < sh.layers; ++l) {
        for (int kv = 0; kv < 2; ++kv) {
          for (size_t i = 0; i < sp.size(); ++i) {
            const size_t at = ((size_t(l) * 2 + kv) * sp.size() + i) * sl.PageBytes();
            ASSERT_EQ(std::memcmp(hb.data() + at, host_src.data() + sl.Offset(l, kv, sp[i]),
                                  sl.PageBytes()),
                      0);
          }
        }
      }
      dst.Poison();
      ASSERT_TRUE(
          LaunchPagesToBuffer(dst.dev, dl, pages + sp.size(), int(sp.size()), buf, false, nullptr)
              .ok());
      EXPECT_TRUE(dst.Download() == expected) << "buffer";
      cudaFree(buf);
    }
    cudaSetDevice(run_device);
    cudaFree(pages);
  }
}

TEST(PeerCopyTest, OneDevice) {
  if (DeviceCount() < 1) GTEST_SKIP() << "no CUDA device";
  RunCopies(0, 0, 0);
}

TEST(PeerCopyTest, TwoDevicesPullAndPush) {
  if (DeviceCount() < 2) GTEST_SKIP() << "fewer than two CUDA devices";
  auto enabled = EnablePeerAccess(1, 0);
  if (!enabled.ok()) GTEST_SKIP() << enabled;
  ASSERT_TRUE(EnablePeerAccess(0, 1).ok());
  ASSERT_TRUE(EnablePeerAccess(0, 1).ok());  // idempotent
  RunCopies(0, 1, 1);                        // pull: GPU1 reads GPU0's pool
  RunCopies(0, 1, 0);                        // push: GPU0 writes into GPU1's pool
}

TEST(PeerCopyTest, IpcHandleRefusesBadInput) {
  EXPECT_EQ(OpenPoolIpcHandle("short").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PoolIpcHandle(nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  if (DeviceCount() < 1) return;
  cudaSetDevice(0);
  void *p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 1 << 20), cudaSuccess);
  auto h = PoolIpcHandle(p);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->size(), sizeof(cudaIpcMemHandle_t));
  cudaFree(p);
}

}  // namespace
}  // namespace lazyrag::peer_copy
