#include "worker/backend/cuda/step_plan.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace lazyrag::cuda_backend {

absl::Status CheckForwardBatch(const ForwardBatch& b, const ModelConfig& config, int num_pages,
                               int page_size) {
  if (num_pages == 0) return absl::FailedPreconditionError("forward: KV pool not initialised");
  const SegmentViewHost& v = b.view;
  const int64_t T = b.tokens.size();
  const int64_t S = v.seg_start.size();
  auto csr_ok = [](const std::vector<int32_t>& indptr, int64_t end) {
    if (indptr.empty() || indptr.front() != 0 || indptr.back() != end) return false;
    for (size_t i = 1; i < indptr.size(); ++i) {
      if (indptr[i] < indptr[i - 1]) return false;
    }
    return true;
  };
  if (int64_t(b.kv_pos.size()) != T || int64_t(b.kv_slot.size()) != T ||
      int64_t(v.q_pos.size()) != T || !csr_ok(v.q_indptr, T)) {
    return absl::InvalidArgumentError("forward: batch arrays disagree in length");
  }
  if (v.seg_indptr.size() != v.q_indptr.size() || !csr_ok(v.seg_indptr, S) ||
      int64_t(v.seg_len.size()) != S || int64_t(v.page_indptr.size()) != S + 1 ||
      !csr_ok(v.page_indptr, int64_t(v.page_indices.size()))) {
    return absl::InvalidArgumentError("forward: malformed segment view");
  }
  if (T > (int64_t(1) << 30)) return absl::InvalidArgumentError("forward: batch too large");
  for (size_t n : {v.seg_skip.size(), v.seg_scale.size(), v.seg_bias.size()}) {
    if (n != 0 && int64_t(n) != S)
      return absl::InvalidArgumentError("forward: malformed segment view");
  }
  if (v.page_size != page_size) return absl::InvalidArgumentError("forward: page size mismatch");
  for (int32_t t : b.tokens) {
    if (t < 0 || t >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("forward: token id ", t, " out of range"));
    }
  }
  for (int64_t s : b.kv_slot) {
    if (s < 0 || s >= int64_t(num_pages) * page_size) {
      return absl::InvalidArgumentError("forward: kv slot out of range");
    }
  }
  for (int32_t p : v.page_indices) {
    if (p < 0 || p >= num_pages) return absl::InvalidArgumentError("forward: page out of range");
  }
  for (int64_t s = 0; s < S; ++s) {
    const int64_t pages = v.page_indptr[s + 1] - v.page_indptr[s];
    if (v.seg_len[s] < 0 || v.seg_len[s] > pages * page_size) {
      return absl::InvalidArgumentError("forward: segment longer than its pages");
    }
    if (!v.seg_skip.empty() && (v.seg_skip[s] < 0 || v.seg_skip[s] > v.seg_len[s])) {
      return absl::InvalidArgumentError("forward: segment skips more keys than it has");
    }
    // The kernels fold the score scale into the exponent of the running maximum (> 0).
    if (!v.seg_scale.empty() && !(v.seg_scale[s] > 0.0f && std::isfinite(v.seg_scale[s]))) {
      return absl::InvalidArgumentError("forward: segment score scale must be positive and finite");
    }
    if (!v.seg_bias.empty() && !std::isfinite(v.seg_bias[s])) {
      return absl::InvalidArgumentError("forward: segment score bias must be finite");
    }
  }
  for (int32_t r : b.logit_rows) {
    if (r < 0 || r >= T) return absl::InvalidArgumentError("forward: logit row out of range");
  }
  return absl::OkStatus();
}

StepPlan::StepPlan(const ForwardBatch& batch, bool row_request) : batch_(batch) {
  const SegmentViewHost& v = batch.view;
  const int T = int(batch.tokens.size());
  const int B = v.num_requests();
  decode_ = B > 0;
  if (row_request) row_request_.resize(T);
  for (int b = 0; b < B; ++b) {
    const int rows = v.q_indptr[b + 1] - v.q_indptr[b];
    max_q_len_ = std::max(max_q_len_, rows);
    decode_ = decode_ && rows == 1;
    int64_t kv = 0;
    for (int s = v.seg_indptr[b]; s < v.seg_indptr[b + 1]; ++s) kv += v.seg_len[s];
    max_kv_len_ = int(std::max<int64_t>(max_kv_len_, kv));
    if (row_request) {
      std::fill(row_request_.begin() + v.q_indptr[b], row_request_.begin() + v.q_indptr[b + 1], b);
    }
  }
  o_tokens_ = upload_.Add(batch.tokens);
  o_kv_pos_ = upload_.Add(batch.kv_pos);
  o_kv_slot_ = upload_.Add(batch.kv_slot);
  o_q_indptr_ = upload_.Add(v.q_indptr);
  o_q_pos_ = upload_.Add(v.q_pos);
  o_seg_indptr_ = upload_.Add(v.seg_indptr);
  o_seg_start_ = upload_.Add(v.seg_start);
  o_seg_len_ = upload_.Add(v.seg_len);
  o_page_indptr_ = upload_.Add(v.page_indptr);
  quality_ = v.any_quality();
  if (quality_) {
    // All three arrays, complete (an empty one in the view means its default).
    const size_t S = v.seg_start.size();
    seg_skip_ = v.seg_skip.size() == S ? v.seg_skip : std::vector<int32_t>(S, 0);
    seg_scale_ = v.seg_scale.size() == S ? v.seg_scale : std::vector<float>(S, 1.0f);
    seg_bias_ = v.seg_bias.size() == S ? v.seg_bias : std::vector<float>(S, 0.0f);
    o_seg_skip_ = upload_.Add(seg_skip_);
    o_seg_scale_ = upload_.Add(seg_scale_);
    o_seg_bias_ = upload_.Add(seg_bias_);
  }
  o_rows_ = upload_.Add(batch.logit_rows);
  o_row_request_ = upload_.Add(row_request_);
  o_page_indices_ = upload_.Add(v.page_indices);
}

DeviceStep StepPlan::At(const char* device_base, int page_size) const {
  auto i32 = [&](size_t off) { return reinterpret_cast<const int32_t*>(device_base + off); };
  const SegmentViewHost& v = batch_.view;
  DeviceStep step;
  step.tokens = i32(o_tokens_);
  step.kv_pos = i32(o_kv_pos_);
  step.kv_slot = reinterpret_cast<const int64_t*>(device_base + o_kv_slot_);
  step.logit_rows = i32(o_rows_);
  step.row_request = i32(o_row_request_);
  SegmentView& view = step.view;
  view.num_requests = v.num_requests();
  view.num_q = int(batch_.tokens.size());
  view.page_size = page_size;
  view.q_indptr = i32(o_q_indptr_);
  view.q_pos = i32(o_q_pos_);
  view.seg_indptr = i32(o_seg_indptr_);
  view.seg_start = i32(o_seg_start_);
  view.seg_len = i32(o_seg_len_);
  view.page_indptr = i32(o_page_indptr_);
  view.page_indices = i32(o_page_indices_);
  if (quality_) {
    auto f32 = [&](size_t off) { return reinterpret_cast<const float*>(device_base + off); };
    view.seg_skip = i32(o_seg_skip_);
    view.seg_scale = f32(o_seg_scale_);
    view.seg_bias = f32(o_seg_bias_);
  }
  step.tokens_n = int(batch_.tokens.size());
  step.rows_n = int(batch_.logit_rows.size());
  step.max_q_len = max_q_len_;
  step.max_kv_len = max_kv_len_;
  step.decode = decode_;
  step.quality = quality_;
  return step;
}

}  // namespace lazyrag::cuda_backend
