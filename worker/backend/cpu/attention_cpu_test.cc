#include "worker/attention/attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <numeric>
#include <random>

#include "common/native_blas.h"
#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/attention/rope.h"

namespace lazyrag {
namespace {

struct Case {
  int page_size, num_heads, num_kv_heads, head_dim;
};

// A random pool and a random batch: each request has 1..4 segments with lengths that are not
// page multiples, pages in shuffled order, and 1..5 query rows after the segments.
struct RandomBatch {
  SegmentViewHost view;
  std::vector<float> q, k, v;
  int num_pages = 0;
};

RandomBatch MakeBatch(const Case& c, int requests, std::mt19937& rng) {
  RandomBatch rb;
  rb.view.page_size = c.page_size;
  std::uniform_int_distribution<int> seg_count(1, 4), seg_len(1, 3 * c.page_size + 5), nq(1, 5);
  std::vector<std::vector<std::pair<int, int>>> plan;  // per request: (len, pages)
  int total_pages = 0;
  for (int b = 0; b < requests; ++b) {
    plan.emplace_back();
    int n = seg_count(rng);
    for (int s = 0; s < n; ++s) {
      int len = seg_len(rng);
      int pages = (len + c.page_size - 1) / c.page_size;
      plan.back().push_back({len, pages});
      total_pages += pages;
    }
  }
  std::vector<int32_t> perm(total_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  int next = 0, num_q = 0;
  for (int b = 0; b < requests; ++b) {
    int start = 0;
    for (auto [len, pages] : plan[b]) {
      std::vector<int32_t> ps(perm.begin() + next, perm.begin() + next + pages);
      next += pages;
      rb.view.AddSegment(start, len, ps);
      start += len;
    }
    // Queries: some inside the last segment (causal), some after everything.
    int rows = nq(rng);
    std::vector<int32_t> pos;
    for (int r = 0; r < rows; ++r) pos.push_back(std::max(0, start - rows + r + (r % 2)));
    rb.view.EndRequest(pos);
    num_q += rows;
  }
  rb.num_pages = total_pages;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  rb.q.resize(size_t(num_q) * c.num_heads * c.head_dim);
  rb.k.resize(size_t(total_pages) * c.page_size * c.num_kv_heads * c.head_dim);
  rb.v.resize(rb.k.size());
  for (auto* vec : {&rb.q, &rb.k, &rb.v}) for (float& x : *vec) x = nd(rng);
  return rb;
}

ModelConfig RopeConfig(int head_dim) {
  ModelConfig c;
  c.head_dim = head_dim;
  c.rope_theta = 10000.0f;
  return c;
}

// PagedAttentionBlas against PagedAttentionCpu on `rb`, element by element.
void ExpectBlasMatchesReference(const Case& c, const RandomBatch& rb, const std::string& what) {
  auto inv = RopeInvFreq(RopeConfig(c.head_dim));
  AttentionShape shape{c.num_heads, c.num_kv_heads, c.head_dim, 1.0f / std::sqrt(float(c.head_dim))};
  std::vector<float> ref(rb.q.size(), NAN), fast(rb.q.size(), NAN);
  SegmentView view = rb.view.View();
  PagedAttentionCpu(shape, view, inv.data(), rb.q.data(), rb.k.data(), rb.v.data(), ref.data());
  PagedAttentionBlas(shape, view, inv.data(), rb.q.data(), rb.k.data(), rb.v.data(), fast.data());
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_NEAR(ref[i], fast[i], 1e-4f * (1 + std::fabs(ref[i]))) << what << " i " << i;
  }
}

TEST(AttentionCpuTest, BlasMatchesReference) {
  std::mt19937 rng(7);
  for (Case c : {Case{1, 4, 4, 16}, Case{16, 6, 2, 32}, Case{64, 8, 2, 64}, Case{16, 9, 3, 64}}) {
    ExpectBlasMatchesReference(c, MakeBatch(c, 3, rng), "page " + std::to_string(c.page_size));
  }
}

// LAZY over shared, locally rotated segments equals plain attention over keys materialised at
// their logical positions (one segment at 0): the identity the whole design rests on.
TEST(AttentionCpuTest, LazyEqualsMaterialize) {
  std::mt19937 rng(11);
  for (Case c : {Case{1, 4, 1, 16}, Case{16, 6, 2, 32}, Case{64, 8, 2, 64}}) {
    RandomBatch rb = MakeBatch(c, 4, rng);
    auto inv = RopeInvFreq(RopeConfig(c.head_dim));
    AttentionShape shape{c.num_heads, c.num_kv_heads, c.head_dim, 1.0f / std::sqrt(float(c.head_dim))};
    // Materialise every request into fresh pages appended to the pool.
    const int64_t page_elems = int64_t(c.page_size) * c.num_kv_heads * c.head_dim;
    SegmentViewHost mat;
    mat.page_size = c.page_size;
    std::vector<MaterializeCopy> copies;
    int next_page = rb.num_pages;
    for (int b = 0; b < rb.view.num_requests(); ++b) {
      int total = 0;
      for (int s = rb.view.seg_indptr[b]; s < rb.view.seg_indptr[b + 1]; ++s) total += rb.view.seg_len[s];
      int pages = (total + c.page_size - 1) / c.page_size;
      std::vector<int32_t> dst(pages);
      std::iota(dst.begin(), dst.end(), next_page);
      next_page += pages;
      for (int s = rb.view.seg_indptr[b]; s < rb.view.seg_indptr[b + 1]; ++s) {
        MaterializeCopy m;
        m.src_pages.assign(rb.view.page_indices.begin() + rb.view.page_indptr[s],
                           rb.view.page_indices.begin() + rb.view.page_indptr[s + 1]);
        m.len = rb.view.seg_len[s];
        m.dst_pages = dst;
        m.dst_offset = rb.view.seg_start[s];
        m.delta = rb.view.seg_start[s];
        copies.push_back(m);
      }
      mat.AddSegment(0, total, dst);
      mat.EndRequest(std::vector<int32_t>(rb.view.q_pos.begin() + rb.view.q_indptr[b],
                                          rb.view.q_pos.begin() + rb.view.q_indptr[b + 1]));
    }
    rb.k.resize(size_t(next_page) * page_elems, NAN);
    rb.v.resize(size_t(next_page) * page_elems, NAN);
    MaterializeCpu(copies, c.page_size, c.num_kv_heads, c.head_dim, inv.data(), rb.k.data(), rb.v.data());
    std::vector<float> lazy(rb.q.size(), NAN), eager(rb.q.size(), NAN);
    PagedAttentionCpu(shape, rb.view.View(), inv.data(), rb.q.data(), rb.k.data(), rb.v.data(), lazy.data());
    PagedAttentionCpu(shape, mat.View(), inv.data(), rb.q.data(), rb.k.data(), rb.v.data(), eager.data());
    for (size_t i = 0; i < lazy.size(); ++i) ASSERT_NEAR(lazy[i], eager[i], 1e-4f * (1 + std::fabs(lazy[i])));
  }
}

TEST(AttentionCpuTest, UnrotatedKeyLayoutMatchesLazy) {
  std::mt19937 rng(5);
  Case c{16, 4, 2, 32};
  RandomBatch rb = MakeBatch(c, 2, rng);
  auto inv = RopeInvFreq(RopeConfig(c.head_dim));
  AttentionShape shape{c.num_heads, c.num_kv_heads, c.head_dim, 1.0f / std::sqrt(float(c.head_dim))};
  // Un-rotate keys of each segment from local position j back to 0.
  std::vector<float> k_unrot = rb.k;
  for (int s = 0; s < rb.view.num_segments(); ++s) {
    for (int j = 0; j < rb.view.seg_len[s]; ++j) {
      int64_t slot = int64_t(rb.view.page_indices[rb.view.page_indptr[s] + j / c.page_size]) * c.page_size + j % c.page_size;
      for (int h = 0; h < c.num_kv_heads; ++h) {
        RopeRotate(&k_unrot[(slot * c.num_kv_heads + h) * c.head_dim], c.head_dim, inv.data(), -j);
      }
    }
  }
  std::vector<float> a(rb.q.size()), b(rb.q.size());
  PagedAttentionCpu(shape, rb.view.View(), inv.data(), rb.q.data(), rb.k.data(), rb.v.data(), a.data());
  PagedAttentionCpu(shape, rb.view.View(), inv.data(), rb.q.data(), k_unrot.data(), rb.v.data(), b.data(), KeyLayout::kUnrotated);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4f * (1 + std::fabs(a[i])));
}

// Issue 25's segment fields: random skips, score scales and biases on every segment.
void RandomQualityFields(SegmentViewHost* v, std::mt19937& rng) {
  std::uniform_real_distribution<float> scale(0.5f, 2.0f), bias(-1.5f, 1.5f);
  for (int s = 0; s < v->num_segments(); ++s) {
    v->seg_skip[s] = int32_t(rng() % (v->seg_len[s] + 1));
    v->seg_scale[s] = scale(rng);
    v->seg_bias[s] = bias(rng);
  }
}

TEST(AttentionCpuTest, BlasMatchesReferenceWithSkipsAndScales) {
  std::mt19937 rng(17);
  for (Case c : {Case{1, 4, 4, 16}, Case{16, 6, 2, 32}, Case{64, 8, 2, 64}}) {
    RandomBatch rb = MakeBatch(c, 3, rng);
    RandomQualityFields(&rb.view, rng);
    ExpectBlasMatchesReference(c, rb, "page " + std::to_string(c.page_size));
  }
}

// Requests longer than one BLAS row block (32 query rows): a causal prefill over two segments
// whose first rows see none of the second segment, rows after all keys, and a one-row request;
// plain and with skips and scales.
TEST(AttentionCpuTest, BlasMatchesReferenceOnLongRequests) {
  std::mt19937 rng(23);
  const Case c{16, 6, 2, 32};
  struct Request {
    std::vector<int> seg_lens;
    int first_pos, rows;
  };
  const std::vector<Request> requests = {{{45, 70}, 0, 115}, {{30, 50}, 80, 40}, {{20}, 3, 1}};
  for (bool quality : {false, true}) {
    RandomBatch rb;
    rb.view.page_size = c.page_size;
    int num_q = 0;
    for (const Request& r : requests) {
      int start = 0;
      for (int len : r.seg_lens) {
        const int pages = (len + c.page_size - 1) / c.page_size;
        std::vector<int32_t> ps(pages);
        std::iota(ps.begin(), ps.end(), rb.num_pages);
        rb.num_pages += pages;
        rb.view.AddSegment(start, len, ps);
        start += len;
      }
      std::vector<int32_t> pos(r.rows);
      std::iota(pos.begin(), pos.end(), r.first_pos);
      rb.view.EndRequest(pos);
      num_q += r.rows;
    }
    if (quality) RandomQualityFields(&rb.view, rng);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    rb.q.resize(size_t(num_q) * c.num_heads * c.head_dim);
    rb.k.resize(size_t(rb.num_pages) * c.page_size * c.num_kv_heads * c.head_dim);
    rb.v.resize(rb.k.size());
    for (auto* vec : {&rb.q, &rb.k, &rb.v}) for (float& x : *vec) x = nd(rng);
    ExpectBlasMatchesReference(c, rb, quality ? "with skips and scales" : "plain");
  }
}

// The test main (common/testing/test_main.cc) re-executes with OpenBLAS's native kernels: on a
// CPU with AVX2 and FMA, OpenBLAS must not be left on a pre-Haswell kernel set.
TEST(NativeBlasTest, OpenBlasRunsTheCpusNativeKernels) {
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (forced != nullptr && std::string(forced) != "SkylakeX" && std::string(forced) != "Haswell") {
    GTEST_SKIP() << "OPENBLAS_CORETYPE=" << forced << " chosen by the caller";
  }
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    GTEST_SKIP() << "CPU without AVX2 and FMA";
  }
  const std::string core = BlasCoreName();
  ASSERT_FALSE(core.empty()) << "this binary links OpenBLAS";
  for (const char* generic : {"Prescott", "Katmai", "Core2", "Penryn", "Dunnington", "Nehalem",
                              "Atom", "Sandybridge", "unknown"}) {
    EXPECT_NE(core, generic);
  }
}

// The reference against the definition computed directly: every visible key (skip <= j <
// len, start + j <= p) un-paged into one list with its logical position, the query and key
// rotated at their logical positions, score * shape.scale * seg_scale + seg_bias, softmax in
// double.
TEST(AttentionCpuTest, SkipsAndScalesMatchADirectComputation) {
  std::mt19937 rng(19);
  for (Case c : {Case{1, 4, 2, 16}, Case{16, 6, 3, 32}}) {
    RandomBatch rb = MakeBatch(c, 3, rng);
    RandomQualityFields(&rb.view, rng);
    auto inv = RopeInvFreq(RopeConfig(c.head_dim));
    const int H = c.num_heads, Hkv = c.num_kv_heads, D = c.head_dim, ps = c.page_size;
    AttentionShape shape{H, Hkv, D, 1.0f / std::sqrt(float(D))};
    std::vector<float> ref(rb.q.size(), NAN);
    PagedAttentionCpu(shape, rb.view.View(), inv.data(), rb.q.data(), rb.k.data(), rb.v.data(),
                      ref.data());
    const SegmentViewHost& v = rb.view;
    for (int b = 0; b < v.num_requests(); ++b) {
      for (int row = v.q_indptr[b]; row < v.q_indptr[b + 1]; ++row) {
        const int p = v.q_pos[row];
        for (int h = 0; h < H; ++h) {
          const int kvh = h / (H / Hkv);
          std::vector<float> qa(rb.q.begin() + (int64_t(row) * H + h) * D,
                                rb.q.begin() + (int64_t(row) * H + h + 1) * D);
          RopeRotate(qa.data(), D, inv.data(), p);
          std::vector<double> scores;
          std::vector<const float*> values;
          for (int s = v.seg_indptr[b]; s < v.seg_indptr[b + 1]; ++s) {
            for (int j = v.seg_skip[s]; j < v.seg_len[s]; ++j) {
              if (v.seg_start[s] + j > p) continue;
              const int64_t slot = int64_t(v.page_indices[v.page_indptr[s] + j / ps]) * ps + j % ps;
              // Stored rotated at local j: turn it to its logical position.
              std::vector<float> ka(rb.k.begin() + (slot * Hkv + kvh) * D,
                                    rb.k.begin() + (slot * Hkv + kvh + 1) * D);
              RopeRotate(ka.data(), D, inv.data(), v.seg_start[s]);
              double dot = 0;
              for (int d = 0; d < D; ++d) dot += double(qa[d]) * ka[d];
              scores.push_back(dot * shape.scale * v.seg_scale[s] + v.seg_bias[s]);
              values.push_back(&rb.v[(slot * Hkv + kvh) * D]);
            }
          }
          const float* got = &ref[(int64_t(row) * H + h) * D];
          if (scores.empty()) {
            for (int d = 0; d < D; ++d) ASSERT_EQ(got[d], 0.0f);
            continue;
          }
          const double mx = *std::max_element(scores.begin(), scores.end());
          double denom = 0;
          std::vector<double> out(D, 0.0);
          for (size_t i = 0; i < scores.size(); ++i) {
            const double w = std::exp(scores[i] - mx);
            denom += w;
            for (int d = 0; d < D; ++d) out[d] += w * values[i][d];
          }
          for (int d = 0; d < D; ++d) {
            ASSERT_NEAR(got[d], out[d] / denom, 2e-4 * (1 + std::fabs(out[d] / denom)))
                << "page " << ps << " row " << row << " head " << h;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace lazyrag
