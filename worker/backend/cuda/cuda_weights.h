// The CUDA backend's model weights: bf16 in one device allocation, Q|K|V and gate|up fused into
// one matrix each, norm weights in fp32.
//
// * Host fp32 weights are uploaded through a device staging buffer and rounded to bf16 on the
//   device.
// * Synthetic models are generated in device memory from (seed, tag, index), bit-identical to
//   the loader's fp32 values before bf16 rounding; norm weights (tiny) are filled on the host by
//   the loader's own function and uploaded in fp32.
// * Tensor parallelism (shard.size > 1): the weights are rank shard.rank's slice (heads, KV
//   heads, intermediate columns). Synthetic slices are generated with their global indices, so
//   TP=N weights are bit-identical slices of TP=1's; host weights are sliced on the host before
//   upload.
//
// Thread safety: none; the backend serializes calls. Runs on the caller's current device.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/cuda/device_buffers.h"
#include "worker/backend/tp_shard.h"
#include "worker/model/config.h"
#include "worker/model/model_source.h"

namespace lazyrag::cuda_backend {

// One layer's weights on the device (pointers into CudaWeights' allocation).
struct LayerWeightsDevice {
  uint16_t* wqkv = nullptr;       // [q_dim + 2 kv_dim, hidden]: rows of wq, then wk, then wv
  uint16_t* wo = nullptr;         // [hidden, q_dim]
  uint16_t* w_gate_up = nullptr;  // [2 ff, hidden]: rows of w_gate, then w_up
  uint16_t* w_down = nullptr;     // [hidden, ff]
  float* attn_norm = nullptr;     // [hidden] fp32
  float* ffn_norm = nullptr;      // [hidden] fp32
};

class CudaWeights {
 public:
  // `config` is the rank's config (ShardConfig(global, shard)).
  CudaWeights(const ModelConfig& config, const TpShard& shard) : config_(config), shard_(shard) {}
  CudaWeights(const CudaWeights&) = delete;
  CudaWeights& operator=(const CudaWeights&) = delete;

  // Allocates the weights and fills them on `stream`; returns once they are on the device.
  // Synthetic models are generated on the device when `synthetic_on_device` or when `model`
  // has no host weights; otherwise model.weights are uploaded (the global tensors).
  // INVALID_ARGUMENT for missing host weights or host tensors of the wrong size;
  // RESOURCE_EXHAUSTED when they do not fit. REQUIRES: called once.
  absl::Status Load(const LoadedModel& model, bool synthetic_on_device, cudaStream_t stream);

  // Elements [offset, offset + count) of the tensor named by its synthetic tag (bf16 widened to
  // fp32; norm weights are fp32), read on `stream`. INVALID_ARGUMENT for an unknown tag or a
  // range outside the tensor.
  absl::StatusOr<std::vector<float>> Read(uint32_t tag, int64_t offset, int64_t count,
                                          cudaStream_t stream) const;

  const LayerWeightsDevice& layer(int l) const { return layers_[l]; }
  const uint16_t* embedding() const { return embedding_; }  // [vocab, hidden]
  const uint16_t* lm_head() const { return lm_head_; }      // [vocab, hidden]
  const float* final_norm() const { return final_norm_; }   // [hidden] fp32

 private:
  struct TensorRef;
  // Every tensor of the model with its place on the device (and its host source when `host`).
  std::vector<TensorRef> Tensors(const ModelWeights* host) const;

  const ModelConfig config_;
  const TpShard shard_;
  DeviceBuffer weights_;
  std::vector<LayerWeightsDevice> layers_;
  uint16_t* embedding_ = nullptr;  // [vocab, hidden]
  uint16_t* lm_head_ = nullptr;    // [vocab, hidden]; == embedding_ when tied
  float* final_norm_ = nullptr;    // [hidden]
};

}  // namespace lazyrag::cuda_backend
