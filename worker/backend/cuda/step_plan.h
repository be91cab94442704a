// The host side of one forward step of the CUDA backend: the batch's checks, the attention
// kernels' grid bounds, the layout of its one upload, and the device view of the uploaded step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "worker/attention/segment_view.h"
#include "worker/backend/backend.h"
#include "worker/backend/cuda/device_buffers.h"
#include "worker/model/config.h"

namespace lazyrag::cuda_backend {

// FAILED_PRECONDITION when num_pages == 0 (no pool); INVALID_ARGUMENT unless the batch's arrays
// agree in length, its segment view is well formed for a pool of num_pages pages of page_size
// tokens, and every token id, slot, page and logit row is in range.
absl::Status CheckForwardBatch(const ForwardBatch& b, const ModelConfig& config, int num_pages,
                               int page_size);

// One forward step's device inputs (pointers into the upload) and bounds.
struct DeviceStep {
  const int32_t* tokens = nullptr;
  const int32_t* kv_pos = nullptr;
  const int64_t* kv_slot = nullptr;
  const int32_t* logit_rows = nullptr;
  const int32_t* row_request = nullptr;  // fallback attention only
  SegmentView view;
  int tokens_n = 0, rows_n = 0, max_q_len = 1, max_kv_len = 0;
  bool decode = false;
  bool quality = false;  // view carries seg_skip / seg_scale / seg_bias
};

// Plans a checked batch: the longest query and KV of its requests, whether every request has
// one query row (decode), and the upload of its arrays. Holds pointers into `batch`, which must
// outlive the plan.
class StepPlan {
 public:
  // `row_request`: also upload each query row's request index (the fallback attention's).
  // REQUIRES: CheckForwardBatch(batch, ...) is OK.
  StepPlan(const ForwardBatch& batch, bool row_request);
  StepPlan(const StepPlan&) = delete;
  StepPlan& operator=(const StepPlan&) = delete;

  // Page indices go last: the offsets of everything else depend only on (tokens, requests,
  // segments, logit rows, quality).
  const UploadPlan& upload() const { return upload_; }
  // The step once upload() has been copied to `device_base`.
  DeviceStep At(const char* device_base, int page_size) const;

 private:
  const ForwardBatch& batch_;
  int max_q_len_ = 1, max_kv_len_ = 0;
  bool decode_ = false;
  bool quality_ = false;
  std::vector<int32_t> row_request_;
  std::vector<int32_t> seg_skip_;  // uploaded copies of the view's quality arrays
  std::vector<float> seg_scale_, seg_bias_;
  UploadPlan upload_;
  size_t o_tokens_ = 0, o_kv_pos_ = 0, o_kv_slot_ = 0, o_q_indptr_ = 0, o_q_pos_ = 0,
         o_seg_indptr_ = 0, o_seg_start_ = 0, o_seg_len_ = 0, o_page_indptr_ = 0, o_rows_ = 0,
         o_row_request_ = 0, o_page_indices_ = 0, o_seg_skip_ = 0, o_seg_scale_ = 0,
         o_seg_bias_ = 0;
};

}  // namespace lazyrag::cuda_backend
