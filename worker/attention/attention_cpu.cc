#include "worker/attention/attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/parallel.h"
#include "worker/attention/rope.h"

namespace lazyrag {
namespace {

inline const float* KeyAt(const float* cache, const SegmentView& v, int s, int j, int kv_head,
                          int num_kv_heads, int head_dim) {
  int page = v.page_indices[v.page_indptr[s] + j / v.page_size];
  int slot = j % v.page_size;
  return cache + ((int64_t(page) * v.page_size + slot) * num_kv_heads + kv_head) * head_dim;
}

}  // namespace

void PagedAttentionCpu(const AttentionShape& shape, const SegmentView& view,
                       const float* inv_freq, const float* q, const float* k_cache,
                       const float* v_cache, float* out, KeyLayout layout) {
  const int H = shape.num_heads, Hkv = shape.num_kv_heads, D = shape.head_dim;
  const int group = H / Hkv;
  // Map each query row to its request.
  std::vector<int32_t> row_request(view.num_q);
  for (int b = 0; b < view.num_requests; ++b) {
    for (int r = view.q_indptr[b]; r < view.q_indptr[b + 1]; ++r) row_request[r] = b;
  }
  ParallelFor(int64_t(view.num_q) * H, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> qr(D), kr(D), scores;
    std::vector<double> acc(D);
    for (int64_t idx = begin; idx < end; ++idx) {
      const int row = int(idx / H), h = int(idx % H), kvh = h / group;
      const int b = row_request[row];
      const int p = view.q_pos[row];
      const float* qh = q + (int64_t(row) * H + h) * D;
      // Pass 1: scores and max.
      scores.clear();
      float max_score = -std::numeric_limits<float>::infinity();
      for (int s = view.seg_indptr[b]; s < view.seg_indptr[b + 1]; ++s) {
        const int start = view.seg_start[s];
        const int n = std::min(view.seg_len[s], p - start + 1);  // causal: start + j <= p
        const int skip = view.seg_skip ? view.seg_skip[s] : 0;
        if (n <= skip) continue;
        std::memcpy(qr.data(), qh, sizeof(float) * D);
        if (layout == KeyLayout::kRotatedLocal) RopeRotate(qr.data(), D, inv_freq, p - start);
        else RopeRotate(qr.data(), D, inv_freq, p);
        const float seg_scale = shape.scale * (view.seg_scale ? view.seg_scale[s] : 1.0f);
        const float seg_bias = view.seg_bias ? view.seg_bias[s] : 0.0f;
        for (int j = skip; j < n; ++j) {
          const float* k = KeyAt(k_cache, view, s, j, kvh, Hkv, D);
          if (layout == KeyLayout::kUnrotated) {
            std::memcpy(kr.data(), k, sizeof(float) * D);
            RopeRotate(kr.data(), D, inv_freq, start + j);
            k = kr.data();
          }
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += double(qr[d]) * k[d];
          float sc = float(dot) * seg_scale + seg_bias;
          scores.push_back(sc);
          max_score = std::max(max_score, sc);
        }
      }
      float* o = out + (int64_t(row) * H + h) * D;
      if (scores.empty()) {
        std::fill(o, o + D, 0.0f);
        continue;
      }
      // Pass 2: softmax-weighted sum of values, same key order.
      std::fill(acc.begin(), acc.end(), 0.0);
      double denom = 0;
      size_t k_idx = 0;
      for (int s = view.seg_indptr[b]; s < view.seg_indptr[b + 1]; ++s) {
        const int start = view.seg_start[s];
        const int n = std::min(view.seg_len[s], p - start + 1);
        const int skip = view.seg_skip ? view.seg_skip[s] : 0;
        for (int j = skip; j < n; ++j) {
          double w = std::exp(double(scores[k_idx++]) - max_score);
          denom += w;
          const float* v = KeyAt(v_cache, view, s, j, kvh, Hkv, D);
          for (int d = 0; d < D; ++d) acc[d] += w * v[d];
        }
      }
      for (int d = 0; d < D; ++d) o[d] = float(acc[d] / denom);
    }
  });
}

void MaterializeCpu(const std::vector<MaterializeCopy>& copies, int page_size, int num_kv_heads,
                    int head_dim, const float* inv_freq, float* k_cache, float* v_cache) {
  const int64_t token_stride = int64_t(num_kv_heads) * head_dim;
  const int half = head_dim / 2;
  std::vector<float> cos_d(half), sin_d(half);
  for (const MaterializeCopy& c : copies) {
    // Every key of a copy turns by the same angle: R(delta), computed once.
    for (int i = 0; i < half; ++i) {
      double a = double(c.delta) * double(inv_freq[i]);
      cos_d[i] = float(std::cos(a));
      sin_d[i] = float(std::sin(a));
    }
    for (int j = 0; j < c.len; ++j) {
      const int from = c.src_offset + j;
      int64_t src = int64_t(c.src_pages[from / page_size]) * page_size + from % page_size;
      int t = c.dst_offset + j;
      int64_t dst = int64_t(c.dst_pages[t / page_size]) * page_size + t % page_size;
      float* kd = k_cache + dst * token_stride;
      std::memmove(kd, k_cache + src * token_stride, sizeof(float) * token_stride);
      std::memmove(v_cache + dst * token_stride, v_cache + src * token_stride,
                   sizeof(float) * token_stride);
      if (c.delta == 0) continue;
      for (int h = 0; h < num_kv_heads; ++h) {
        float* x = kd + h * head_dim;
        for (int i = 0; i < half; ++i) {
          float x0 = x[i], x1 = x[i + half];
          x[i] = x0 * cos_d[i] - x1 * sin_d[i];
          x[i + half] = x1 * cos_d[i] + x0 * sin_d[i];
        }
      }
    }
  }
}

}  // namespace lazyrag
