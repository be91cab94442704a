#include "worker/backend/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/parallel.h"
#include "common/status.h"
#include "worker/attention/rope.h"

namespace lazyrag {
namespace {

constexpr int kAttentionRowBlock = 32;  // query rows per attention task

// y[m, n] = x[m, k] * w[n, k]^T (+ y when accumulate)
// Column blocks across common/parallel.h's threads; OpenBLAS itself runs one thread (see
// CreateCpuBackend), so GEMMs and attention share one pool and no thread spins for the other.
void MatMulT(const float* x, const float* w, float* y, int m, int n, int k, bool accumulate) {
  ParallelFor(n, 64, [&](int64_t b, int64_t e) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, int(e - b), k, 1.0f, x, k,
                w + b * k, k, accumulate ? 1.0f : 0.0f, y + b, n);
  });
}

void RmsNorm(const float* x, const float* w, float* y, int rows, int dim, float eps) {
  ParallelFor(rows, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = x + r * dim;
      double ss = 0;
      for (int i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
      float inv = float(1.0 / std::sqrt(ss / dim + eps));
      float* yr = y + r * dim;
      for (int i = 0; i < dim; ++i) yr[i] = xr[i] * inv * w[i];
    }
  });
}

absl::Status CheckSize(const std::vector<float>& v, int64_t n, const char* name) {
  if (int64_t(v.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights: ", name, " has ", v.size(), " elements, expected ", n));
  }
  return absl::OkStatus();
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(std::unique_ptr<ModelWeights> w, CpuBackendOptions options)
      : w_(std::move(w)), options_(options), inv_freq_(RopeInvFreq(w_->config)) {}

  absl::Status Validate() const {
    const ModelConfig& c = w_->config;
    if (auto st = c.Validate(); !st.ok()) return st;
    const int64_t d = c.hidden_size;
    if (auto st = CheckSize(w_->token_embedding, int64_t(c.vocab_size) * d, "token_embedding"); !st.ok()) return st;
    if (auto st = CheckSize(w_->final_norm, d, "final_norm"); !st.ok()) return st;
    if (!c.tie_word_embeddings) {
      if (auto st = CheckSize(w_->lm_head, int64_t(c.vocab_size) * d, "lm_head"); !st.ok()) return st;
    }
    if (int(w_->layers.size()) != c.num_layers) return absl::InvalidArgumentError("weights: layer count");
    for (const LayerWeights& l : w_->layers) {
      for (auto [v, n, name] : {std::tuple{&l.attn_norm, d, "attn_norm"},
                                {&l.ffn_norm, d, "ffn_norm"},
                                {&l.wq, c.q_dim() * d, "wq"},
                                {&l.wk, c.kv_dim() * d, "wk"},
                                {&l.wv, c.kv_dim() * d, "wv"},
                                {&l.wo, c.q_dim() * d, "wo"},
                                {&l.w_gate, c.intermediate_size * d, "w_gate"},
                                {&l.w_up, c.intermediate_size * d, "w_up"},
                                {&l.w_down, c.intermediate_size * d, "w_down"}}) {
        if (auto st = CheckSize(*v, n, name); !st.ok()) return st;
      }
    }
    return absl::OkStatus();
  }

  std::string name() const override { return "cpu"; }
  const ModelConfig& config() const override { return w_->config; }
  int num_pages() const override { return num_pages_; }
  int page_size() const override { return page_size_; }
  KvDtype kv_dtype() const override { return KvDtype::kFloat32; }

  absl::Status InitPool(int num_pages, int page_size) override {
    if (num_pages <= 0 || page_size <= 0 || page_size > 1024) {
      return absl::InvalidArgumentError(
          absl::StrCat("kv pool: bad shape ", num_pages, " pages x ", page_size, " tokens"));
    }
    const ModelConfig& c = w_->config;
    int64_t per_layer = int64_t(num_pages) * page_size * c.kv_dim();
    try {
      k_.assign(c.num_layers, std::vector<float>(per_layer, 0.0f));
      v_.assign(c.num_layers, std::vector<float>(per_layer, 0.0f));
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError("kv pool: out of host memory");
    }
    num_pages_ = num_pages;
    page_size_ = page_size;
    return absl::OkStatus();
  }

  bool SupportsQualityViews() const override { return true; }
  absl::Status Forward(const ForwardBatch& batch, std::vector<float>* logits) override;
  absl::Status Materialize(const std::vector<MaterializeCopy>& copies) override;
  absl::Status ExportKv(const std::vector<int32_t>& pages, int num_tokens,
                        std::string* out) override;
  absl::Status ImportKv(const std::vector<int32_t>& pages, int num_tokens,
                        std::string_view data) override;

 private:
  absl::Status CheckBatch(const ForwardBatch& batch) const;
  absl::Status CheckRun(const std::vector<int32_t>& pages, int num_tokens) const;

  std::unique_ptr<ModelWeights> w_;
  CpuBackendOptions options_;
  std::vector<float> inv_freq_;
  int num_pages_ = 0;
  int page_size_ = 16;
  std::vector<std::vector<float>> k_, v_;  // [layer][num_pages, page_size, kv_heads, head_dim]
};

absl::Status CpuBackend::CheckRun(const std::vector<int32_t>& pages, int num_tokens) const {
  if (num_tokens < 0 || int64_t(pages.size()) * page_size_ < num_tokens) {
    return absl::InvalidArgumentError("kv run: more tokens than pages hold");
  }
  for (int32_t p : pages) {
    if (p < 0 || p >= num_pages_) return absl::InvalidArgumentError(absl::StrCat("kv run: page ", p, " out of range"));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::CheckBatch(const ForwardBatch& b) const {
  const int64_t T = b.tokens.size();
  if (num_pages_ == 0) return absl::FailedPreconditionError("forward: KV pool not initialised");
  if (int64_t(b.kv_pos.size()) != T || int64_t(b.kv_slot.size()) != T ||
      int64_t(b.view.q_pos.size()) != T || b.view.q_indptr.back() != T) {
    return absl::InvalidArgumentError("forward: batch arrays disagree in length");
  }
  if (b.view.page_size != page_size_) return absl::InvalidArgumentError("forward: page size mismatch");
  for (int32_t t : b.tokens) {
    if (t < 0 || t >= w_->config.vocab_size) return absl::InvalidArgumentError(absl::StrCat("forward: token id ", t, " out of range"));
  }
  for (int64_t s : b.kv_slot) {
    if (s < 0 || s >= int64_t(num_pages_) * page_size_) return absl::InvalidArgumentError("forward: kv slot out of range");
  }
  for (int32_t p : b.view.page_indices) {
    if (p < 0 || p >= num_pages_) return absl::InvalidArgumentError("forward: page out of range");
  }
  const size_t S = b.view.seg_start.size();
  for (size_t n : {b.view.seg_skip.size(), b.view.seg_scale.size(), b.view.seg_bias.size()}) {
    if (n != 0 && n != S) return absl::InvalidArgumentError("forward: malformed segment view");
  }
  for (int s = 0; s < b.view.num_segments(); ++s) {
    int pages = b.view.page_indptr[s + 1] - b.view.page_indptr[s];
    if (b.view.seg_len[s] < 0 || b.view.seg_len[s] > int64_t(pages) * page_size_) {
      return absl::InvalidArgumentError("forward: segment longer than its pages");
    }
    if (b.view.seg_skip.size() == b.view.seg_start.size() &&
        (b.view.seg_skip[s] < 0 || b.view.seg_skip[s] > b.view.seg_len[s])) {
      return absl::InvalidArgumentError("forward: segment skips more keys than it has");
    }
  }
  for (int32_t r : b.logit_rows) {
    if (r < 0 || r >= T) return absl::InvalidArgumentError("forward: logit row out of range");
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Forward(const ForwardBatch& batch, std::vector<float>* logits) {
  if (auto st = CheckBatch(batch); !st.ok()) return st;
  const ModelConfig& c = w_->config;
  const int T = int(batch.tokens.size());
  const int d = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(), ff = c.intermediate_size;
  const int D = c.head_dim;
  std::vector<float> x(int64_t(T) * d), h(int64_t(T) * d), q(int64_t(T) * qd),
      k(int64_t(T) * kvd), v(int64_t(T) * kvd), attn(int64_t(T) * qd), g(int64_t(T) * ff),
      u(int64_t(T) * ff);
  for (int t = 0; t < T; ++t) {
    std::memcpy(&x[int64_t(t) * d], &w_->token_embedding[int64_t(batch.tokens[t]) * d],
                sizeof(float) * d);
  }
  AttentionShape shape{c.num_heads, c.num_kv_heads, D, float(1.0 / std::sqrt(double(D)))};
  SegmentView view = batch.view.View();
  const bool tp = options_.shard.size > 1;
  const int rank = options_.shard.rank;
  const bool residual_rank = rank == 0;
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = w_->layers[l];
    RmsNorm(x.data(), lw.attn_norm.data(), h.data(), T, d, c.rms_norm_eps);
    MatMulT(h.data(), lw.wq.data(), q.data(), T, qd, d, false);
    MatMulT(h.data(), lw.wk.data(), k.data(), T, kvd, d, false);
    MatMulT(h.data(), lw.wv.data(), v.data(), T, kvd, d, false);
    float* kc = k_[l].data();
    float* vc = v_[l].data();
    for (int t = 0; t < T; ++t) {
      float* kt = &k[int64_t(t) * kvd];
      for (int hh = 0; hh < c.num_kv_heads; ++hh) RopeRotate(kt + hh * D, D, inv_freq_.data(), batch.kv_pos[t]);
      std::memcpy(kc + batch.kv_slot[t] * kvd, kt, sizeof(float) * kvd);
      std::memcpy(vc + batch.kv_slot[t] * kvd, &v[int64_t(t) * kvd], sizeof(float) * kvd);
    }
    if (options_.reference_attention) {
      PagedAttentionCpu(shape, view, inv_freq_.data(), q.data(), kc, vc, attn.data());
    } else {
      PagedAttentionBlas(shape, view, inv_freq_.data(), q.data(), kc, vc, attn.data());
    }
    // Residual add in the GEMM; with tensor parallelism only rank 0 adds the residual, the
    // others write their partial sum, and the all-reduce leaves residual + all partials on
    // every rank.
    MatMulT(attn.data(), lw.wo.data(), x.data(), T, d, qd, residual_rank);
    if (tp) RETURN_IF_ERROR(options_.all_reduce->AllReduceSum(rank, x.data(), int64_t(T) * d));
    RmsNorm(x.data(), lw.ffn_norm.data(), h.data(), T, d, c.rms_norm_eps);
    MatMulT(h.data(), lw.w_gate.data(), g.data(), T, ff, d, false);
    MatMulT(h.data(), lw.w_up.data(), u.data(), T, ff, d, false);
    ParallelFor(int64_t(T) * ff, 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    });
    MatMulT(g.data(), lw.w_down.data(), x.data(), T, d, ff, residual_rank);
    if (tp) RETURN_IF_ERROR(options_.all_reduce->AllReduceSum(rank, x.data(), int64_t(T) * d));
  }
  const int R = int(batch.logit_rows.size());
  std::vector<float> xr(int64_t(R) * d), hr(int64_t(R) * d);
  for (int r = 0; r < R; ++r) {
    std::memcpy(&xr[int64_t(r) * d], &x[int64_t(batch.logit_rows[r]) * d], sizeof(float) * d);
  }
  RmsNorm(xr.data(), w_->final_norm.data(), hr.data(), R, d, c.rms_norm_eps);
  logits->assign(int64_t(R) * c.vocab_size, 0.0f);
  if (R > 0) MatMulT(hr.data(), w_->output_weight().data(), logits->data(), R, c.vocab_size, d, false);
  return absl::OkStatus();
}

absl::Status CpuBackend::Materialize(const std::vector<MaterializeCopy>& copies) {
  for (const MaterializeCopy& m : copies) {
    if (m.src_offset < 0) return absl::InvalidArgumentError("materialize: negative src_offset");
    if (auto st = CheckRun(m.src_pages, m.src_offset + m.len); !st.ok()) return st;
    if (auto st = CheckRun(m.dst_pages, m.dst_offset + m.len); !st.ok()) return st;
  }
  const ModelConfig& c = w_->config;
  ParallelFor(c.num_layers, 1, [&](int64_t b, int64_t e) {
    for (int64_t l = b; l < e; ++l) {
      MaterializeCpu(copies, page_size_, c.num_kv_heads, c.head_dim, inv_freq_.data(),
                     k_[l].data(), v_[l].data());
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::ExportKv(const std::vector<int32_t>& pages, int num_tokens,
                                  std::string* out) {
  if (auto st = CheckRun(pages, num_tokens); !st.ok()) return st;
  const ModelConfig& c = w_->config;
  const int64_t tok_bytes = int64_t(c.kv_dim()) * sizeof(float);
  out->resize(size_t(2) * c.num_layers * num_tokens * tok_bytes);
  char* p = out->data();
  for (int l = 0; l < c.num_layers; ++l) {
    for (const auto* cache : {&k_[l], &v_[l]}) {
      for (int j = 0; j < num_tokens; ++j) {
        int64_t slot = int64_t(pages[j / page_size_]) * page_size_ + j % page_size_;
        std::memcpy(p, cache->data() + slot * c.kv_dim(), tok_bytes);
        p += tok_bytes;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::ImportKv(const std::vector<int32_t>& pages, int num_tokens,
                                  std::string_view data) {
  if (auto st = CheckRun(pages, num_tokens); !st.ok()) return st;
  const ModelConfig& c = w_->config;
  const int64_t tok_bytes = int64_t(c.kv_dim()) * sizeof(float);
  if (int64_t(data.size()) != 2 * c.num_layers * num_tokens * tok_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("kv import: payload is ", data.size(),
                                                   " bytes, expected ",
                                                   2 * c.num_layers * num_tokens * tok_bytes));
  }
  const char* p = data.data();
  for (int l = 0; l < c.num_layers; ++l) {
    for (auto* cache : {&k_[l], &v_[l]}) {
      for (int j = 0; j < num_tokens; ++j) {
        int64_t slot = int64_t(pages[j / page_size_]) * page_size_ + j % page_size_;
        std::memcpy(cache->data() + slot * c.kv_dim(), p, tok_bytes);
        p += tok_bytes;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

void PagedAttentionBlas(const AttentionShape& shape, const SegmentView& view,
                        const float* inv_freq, const float* q, const float* k_cache,
                        const float* v_cache, float* out) {
  const int H = shape.num_heads, Hkv = shape.num_kv_heads, D = shape.head_dim;
  const int group = H / Hkv;
  const int ps = view.page_size;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  // One task per (request, kv head, block of query rows): a block reads only the keys some of
  // its rows can see (causal prefill skips the upper triangle), and blocks balance the threads
  // when a step holds one long request. Costliest tasks first, taken dynamically.
  struct Task {
    int b, kvh, r_begin, r_end;
    int64_t cost;
  };
  // Keys of segment s that some query row in [r_begin, r_end) sees: a prefix of the segment.
  auto visible_keys = [&](int s, int r_begin, int r_end) {
    int vis = 0;
    for (int i = r_begin; i < r_end; ++i) vis = std::max(vis, view.q_pos[i] - view.seg_start[s] + 1);
    return std::clamp(vis, 0, int(view.seg_len[s]));
  };
  std::vector<Task> tasks;
  for (int b = 0; b < view.num_requests; ++b) {
    const int q0 = view.q_indptr[b], q1 = view.q_indptr[b + 1];
    for (int r = q0; r < q1; r += kAttentionRowBlock) {
      const int re = std::min(q1, r + kAttentionRowBlock);
      int64_t keys = 0;
      for (int s = view.seg_indptr[b]; s < view.seg_indptr[b + 1]; ++s) keys += visible_keys(s, r, re);
      for (int kvh = 0; kvh < Hkv; ++kvh) tasks.push_back({b, kvh, r, re, keys * (re - r)});
    }
  }
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const Task& a, const Task& c) { return a.cost > c.cost; });
  std::atomic<size_t> next{0};
  ParallelFor(NumWorkerThreads(), 1, [&](int64_t, int64_t) {
    std::vector<float> ks, vs, qs, scores, acc;
    std::vector<int> seg_cols;
    for (size_t t; (t = next.fetch_add(1)) < tasks.size();) {
      const Task& task = tasks[t];
      const int b = task.b, kvh = task.kvh, r0 = task.r_begin, nq = task.r_end - task.r_begin;
      const int s0 = view.seg_indptr[b], s1 = view.seg_indptr[b + 1];
      const int M = nq * group;  // rows: (query row, head in group)
      // Columns of segment s: its first seg_cols[s - s0] keys, the most any row here sees.
      seg_cols.assign(s1 - s0, 0);
      int total = 0;
      for (int s = s0; s < s1; ++s) {
        seg_cols[s - s0] = visible_keys(s, r0, r0 + nq);
        total += seg_cols[s - s0];
      }
      scores.assign(int64_t(M) * std::max(total, 1), kNegInf);
      qs.resize(int64_t(M) * D);
      ks.resize(int64_t(total) * D);
      vs.resize(int64_t(total) * D);
      // Pass 1: gather K/V, scores per segment into columns [col0, col0 + n).
      int col0 = 0;
      for (int s = s0; s < s1; ++s) {
        const int n = seg_cols[s - s0], start = view.seg_start[s];
        if (n == 0) continue;
        for (int j = 0; j < n; ++j) {
          int64_t slot = int64_t(view.page_indices[view.page_indptr[s] + j / ps]) * ps + j % ps;
          std::memcpy(&ks[int64_t(col0 + j) * D], k_cache + (slot * Hkv + kvh) * D, sizeof(float) * D);
          std::memcpy(&vs[int64_t(col0 + j) * D], v_cache + (slot * Hkv + kvh) * D, sizeof(float) * D);
        }
        for (int r = 0; r < nq; ++r) {
          for (int gh = 0; gh < group; ++gh) {
            float* dst = &qs[(int64_t(r) * group + gh) * D];
            std::memcpy(dst, q + (int64_t(r0 + r) * H + kvh * group + gh) * D, sizeof(float) * D);
            RopeRotate(dst, D, inv_freq, view.q_pos[r0 + r] - start);
          }
        }
        const float alpha = shape.scale * (view.seg_scale ? view.seg_scale[s] : 1.0f);
        const float bias = view.seg_bias ? view.seg_bias[s] : 0.0f;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, n, D, alpha, qs.data(), D,
                    &ks[int64_t(col0) * D], D, 0.0f, &scores[col0], total);
        if (bias != 0.0f) {
          for (int m = 0; m < M; ++m) {
            float* row = &scores[int64_t(m) * total + col0];
            for (int j = 0; j < n; ++j) row[j] += bias;
          }
        }
        // Causal mask: key j visible to row r iff skip <= j and start + j <= p.
        const int skip = view.seg_skip ? std::min<int>(view.seg_skip[s], n) : 0;
        for (int r = 0; r < nq; ++r) {
          int visible = std::clamp(view.q_pos[r0 + r] - start + 1, 0, n);
          for (int gh = 0; gh < group; ++gh) {
            float* row = &scores[(int64_t(r) * group + gh) * total + col0];
            std::fill(row, row + std::min(skip, visible), kNegInf);
            std::fill(row + visible, row + n, kNegInf);
          }
        }
        col0 += n;
      }
      // Softmax per row; a row that sees no key outputs zeros.
      acc.assign(int64_t(M) * D, 0.0f);
      std::vector<uint8_t> empty(M, 0);
      for (int m = 0; m < M; ++m) {
        float* row = &scores[int64_t(m) * total];
        float mx = kNegInf;
        for (int j = 0; j < total; ++j) mx = std::max(mx, row[j]);
        if (mx == kNegInf) {
          empty[m] = 1;
          std::fill(row, row + total, 0.0f);
          continue;
        }
        double sum = 0;
        for (int j = 0; j < total; ++j) {
          float e = std::exp(row[j] - mx);
          row[j] = e;
          sum += e;
        }
        float inv = float(1.0 / sum);
        for (int j = 0; j < total; ++j) row[j] *= inv;
      }
      // Pass 2: acc[M, D] = P V over all gathered columns at once.
      if (total > 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, D, total, 1.0f, scores.data(),
                    total, vs.data(), D, 0.0f, acc.data(), D);
      }
      for (int r = 0; r < nq; ++r) {
        for (int gh = 0; gh < group; ++gh) {
          const int m = r * group + gh;
          float* o = out + (int64_t(r0 + r) * H + kvh * group + gh) * D;
          if (empty[m]) std::fill(o, o + D, 0.0f);
          else std::memcpy(o, &acc[int64_t(m) * D], sizeof(float) * D);
        }
      }
    }
  });
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(std::unique_ptr<ModelWeights> weights,
                                                          const CpuBackendOptions& options) {
  if (weights == nullptr) return absl::InvalidArgumentError("cpu backend: no host weights");
  if (options.shard.size > 1 &&
      (options.all_reduce == nullptr || options.all_reduce->size() != options.shard.size)) {
    return absl::InvalidArgumentError("cpu backend: tensor parallel rank without its all-reduce");
  }
  if (options.shard.rank < 0 || options.shard.rank >= options.shard.size) {
    return absl::InvalidArgumentError("cpu backend: tensor parallel rank out of range");
  }
  auto backend = std::make_unique<CpuBackend>(std::move(weights), options);
  if (auto st = backend->Validate(); !st.ok()) return st;
  // Process-wide: the backend parallelises its GEMMs itself (MatMulT, PagedAttentionBlas).
  openblas_set_num_threads(1);
  return backend;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuTensorParallelBackend(
    std::unique_ptr<ModelWeights> weights, int tensor_parallel, const CpuBackendOptions& options) {
  if (weights == nullptr) return absl::InvalidArgumentError("cpu backend: no host weights");
  const ModelConfig global = weights->config;
  RETURN_IF_ERROR(global.Validate());
  RETURN_IF_ERROR(CheckShardable(global, {tensor_parallel, 0}));
  auto all_reduce = std::make_shared<HostAllReduce>(tensor_parallel);
  std::vector<std::unique_ptr<Backend>> ranks;
  for (int r = 0; r < tensor_parallel; ++r) {
    CpuBackendOptions ro = options;
    ro.shard = {tensor_parallel, r};
    ro.all_reduce = all_reduce;
    ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> slice, ShardWeights(*weights, ro.shard));
    if (r == tensor_parallel - 1) weights.reset();  // the last slice is cut: free the whole
    ASSIGN_OR_RETURN(std::unique_ptr<Backend> rank, CreateCpuBackend(std::move(slice), ro));
    ranks.push_back(std::move(rank));
  }
  return CreateTensorParallelBackend(global, std::move(ranks), all_reduce);
}

}  // namespace lazyrag
