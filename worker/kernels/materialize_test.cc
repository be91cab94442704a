// The MATERIALIZE kernel (worker/kernels/materialize.cu): its argument checks, against the CPU
// reference (MaterializeCpu), and materialized KV under plain attention against LAZY attention.
// Part of kernels_test.
#include "worker/kernels/materialize.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/kernels/kernels_test_support.h"
#include "worker/kernels/lazy_attention.h"

namespace lazyrag::kernels::testing {
namespace {

TEST(MaterializeArgs, RejectsBadShapes) {
  MaterializeParams m;
  m.head_dim = 80;
  m.num_kv_heads = 8;
  EXPECT_EQ(Materialize(m, nullptr).code(), absl::StatusCode::kInvalidArgument);
  m.head_dim = 128;
  m.num_kv_heads = 0;
  EXPECT_EQ(Materialize(m, nullptr).code(), absl::StatusCode::kInvalidArgument);
  m.num_kv_heads = 8;
  EXPECT_TRUE(Materialize(m, nullptr).ok());  // no copies: a no-op
  m.num_copies = 1;
  m.max_len = 10;  // null pointers
  EXPECT_EQ(Materialize(m, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------
// MATERIALIZE.

struct DeviceCopies {
  std::vector<int32_t> src_indptr{0}, src_pages, dst_indptr{0}, dst_pages, len, dst_offset, delta,
      src_offset;
  void Add(const MaterializeCopy& c) {
    src_pages.insert(src_pages.end(), c.src_pages.begin(), c.src_pages.end());
    src_indptr.push_back(int32_t(src_pages.size()));
    dst_pages.insert(dst_pages.end(), c.dst_pages.begin(), c.dst_pages.end());
    dst_indptr.push_back(int32_t(dst_pages.size()));
    len.push_back(c.len);
    dst_offset.push_back(c.dst_offset);
    delta.push_back(c.delta);
    src_offset.push_back(c.src_offset);
  }
};

// Runs the materialize kernel over all layers of the pool, in place on pool.k / pool.v.
void RunMaterializeGpu(KvPool& pool, const std::vector<float>& inv_freq,
                       const std::vector<MaterializeCopy>& copies) {
  DeviceCopies c;
  int max_len = 0;
  for (const MaterializeCopy& m : copies) {
    c.Add(m);
    max_len = std::max(max_len, m.len);
  }
  DeviceArray<uint16_t> k(pool.k), v(pool.v);
  DeviceArray<float> f(inv_freq);
  DeviceArray<int32_t> si(c.src_indptr), sp(c.src_pages), di(c.dst_indptr), dp(c.dst_pages),
      len(c.len), off(c.dst_offset), delta(c.delta), src_off(c.src_offset);
  MaterializeParams m;
  m.k_cache = k.get();
  m.v_cache = v.get();
  m.layer_stride = pool.LayerElems();
  m.num_layers = pool.layers;
  m.page_size = pool.ps;
  m.num_kv_heads = pool.hkv;
  m.head_dim = pool.d;
  m.inv_freq = f.get();
  m.num_copies = int(copies.size());
  m.src_page_indptr = si.get();
  m.src_pages = sp.get();
  m.dst_page_indptr = di.get();
  m.dst_pages = dp.get();
  m.len = len.get();
  m.dst_offset = off.get();
  m.delta = delta.get();
  m.src_offset = src_off.get();
  m.max_len = max_len;
  const absl::Status st = Materialize(m, nullptr);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  pool.k = k.Download();
  pool.v = v.Download();
}

TEST(Materialize, MatchesCpu) {
  GPU_TEST_SETUP(rng);
  for (int d : {64, 128}) {
    for (int ps : {16, 64}) {
      KvPool pool(ps, 4, d, PagesFor(10000, ps) + 16, rng, /*layers=*/2);
      const std::vector<Doc> docs = MakeDocs(pool, 3, 50, 1500, rng);
      int total = 0;
      for (const Doc& doc : docs) total += doc.len;
      const int offset = 13;  // request prefix before the documents
      std::vector<int32_t> run = pool.Alloc(offset + total);
      std::vector<MaterializeCopy> copies;
      int start = offset;
      for (const Doc& doc : docs) {
        copies.push_back({doc.pages, doc.len, run, start, start});
        start += doc.len;
      }
      copies[1].delta = 0;  // a plain copy too
      // A copy that leaves the document's first tokens out (they are recomputed per request).
      const int skip = std::min(20, copies[2].len - 1);
      copies[2].src_offset = skip;
      copies[2].dst_offset += skip;
      copies[2].len -= skip;
      std::vector<float> k = ToFloat(pool.k), v = ToFloat(pool.v);
      const std::vector<float> inv_freq = InvFreq(d);
      for (int l = 0; l < pool.layers; ++l) {
        MaterializeCpu(copies, ps, pool.hkv, d, inv_freq.data(), k.data() + l * pool.LayerElems(),
                       v.data() + l * pool.LayerElems());
      }
      RunMaterializeGpu(pool, inv_freq, copies);
      // Unused slots stay NaN in both; values must agree to bf16 rounding.
      std::vector<float> gk = ToFloat(pool.k), gv = ToFloat(pool.v);
      size_t bad = 0;
      for (size_t i = 0; i < k.size(); ++i) {
        auto same = [](float a, float b, float tol) {
          return (std::isnan(a) && std::isnan(b)) || std::fabs(a - b) <= tol;
        };
        if (!same(gk[i], k[i], 1e-3f + 8e-3f * std::fabs(k[i]))) ++bad;
        if (!same(gv[i], v[i], 0.f)) ++bad;
      }
      EXPECT_EQ(bad, 0u) << "d=" << d << " ps=" << ps;
    }
  }
}

// MATERIALIZE then plain attention (one segment from 0, no deltas) == LAZY attention.
TEST(Materialize, ThenAttentionMatchesLazy) {
  GPU_TEST_SETUP(rng);
  for (bool decode : {false, true}) {
    Sizes s;
    s.page_size = 16;
    s.group = 4;
    KvPool pool(s.page_size, s.num_kv_heads, s.head_dim, 1500, rng);
    const std::vector<Doc> docs = MakeDocs(pool, 5, 100, 900, rng);
    const Problem lazy = MakeRagBatch(s, pool, docs, 3, 5, 20, decode ? 1 : 32, rng);
    // Materialized view: each request's segments copied into one fresh run, rotated by
    // their deltas; one segment from 0 of the same total length, same query positions.
    Problem mat = lazy;
    mat.view = SegmentViewHost();
    mat.view.page_size = s.page_size;
    std::vector<MaterializeCopy> copies;
    for (int b = 0; b < lazy.view.num_requests(); ++b) {
      int total = 0;
      for (int sg = lazy.view.seg_indptr[b]; sg < lazy.view.seg_indptr[b + 1]; ++sg) {
        total += lazy.view.seg_len[sg];
      }
      std::vector<int32_t> run = pool.Alloc(total);
      for (int sg = lazy.view.seg_indptr[b]; sg < lazy.view.seg_indptr[b + 1]; ++sg) {
        std::vector<int32_t> src(lazy.view.page_indices.begin() + lazy.view.page_indptr[sg],
                                 lazy.view.page_indices.begin() + lazy.view.page_indptr[sg + 1]);
        copies.push_back(
            {src, lazy.view.seg_len[sg], run, lazy.view.seg_start[sg], lazy.view.seg_start[sg]});
      }
      mat.view.AddSegment(0, total, run);
      mat.view.EndRequest(
          std::vector<int32_t>(lazy.view.q_pos.begin() + lazy.view.q_indptr[b],
                               lazy.view.q_pos.begin() + lazy.view.q_indptr[b + 1]));
    }
    const std::vector<float> lazy_out = RunGpu(lazy, pool, {decode, KeyLayout::kRotatedLocal, 0});
    RunMaterializeGpu(pool, lazy.inv_freq, copies);
    const std::vector<float> mat_out = RunGpu(mat, pool, {decode, KeyLayout::kRotatedLocal, 0});
    ExpectClose(mat_out, lazy_out, decode ? "materialize vs lazy decode" : "materialize vs lazy");
    ExpectClose(lazy_out, RunCpu(lazy, pool, KeyLayout::kRotatedLocal), "lazy vs cpu");
  }
}

}  // namespace
}  // namespace lazyrag::kernels::testing
