// CUDA backend: the Llama forward in bf16 on one GPU, behind the Backend interface
// (worker/backend/backend.h), checked against the fp32 CPU backend.
//
// * Weights: bf16 in one device allocation; Q|K|V and gate|up fused into one GEMM each.
//   Host fp32 weights are rounded to bf16 on the device after upload; synthetic models are
//   generated in device memory from (seed, tag, index), bit-identical to the loader's fp32
//   values before bf16 rounding (norm weights, tiny, are filled on the host by the loader's
//   own functions and uploaded in fp32).
// * Activations: the residual stream is fp32; GEMM inputs are bf16; cuBLAS accumulates in
//   fp32; the O and down projections add into the fp32 residual in the GEMM (beta = 1) or,
//   by option, write bf16 that the next RMSNorm kernel adds to the residual.
// * KV pool: one bf16 allocation, [num_layers][K | V][num_pages, page_size, kv_heads, head_dim].
// * Attention: worker/kernels LazyAttentionDecode when every request has one query row, else
//   LazyAttentionPrefill (head dims 64 and 128); a CUDA-core fallback for other head dims.
//
// Thread safety: every method takes an internal lock; calls are serialized on one stream.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/model/model_source.h"

namespace lazyrag {

struct CudaBackendOptions {
  int device = 0;  // CUDA device index
  // Synthetic models: generate the weights in device memory (default) even when the
  // LoadedModel also carries host weights. false: upload the host weights (REQUIRES them).
  bool synthetic_on_device = true;
  // Scratch for split-KV attention; 0: enough for 64 query rows at the kernels' maximum split.
  int64_t attention_workspace_bytes = 0;
  // true: the O and down projections add into the fp32 residual inside the GEMM (cuBLAS
  // beta = 1, fp32 output); false: they write bf16 and the next RMSNorm kernel adds them to
  // the residual (the fused residual-add + norm). ttft_bench --residual_in_gemm measures both:
  // on the H200 (2026-11-29, 8B shape) they were within 1% of each other, so the default keeps
  // the fp32 residual add (one rounding less).
  bool residual_add_in_gemm = true;
};

// INVALID_ARGUMENT for a config the backend cannot run or host weights of the wrong size;
// FAILED_PRECONDITION when there is no such device; RESOURCE_EXHAUSTED when the weights do not
// fit; INTERNAL for other CUDA/cuBLAS failures. Does not take `model`'s weights.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const LoadedModel& model,
                                                           const CudaBackendOptions& options = {});

// For tests: elements [offset, offset + count) of one weight tensor as stored on the device
// (bf16 widened to fp32; norm weights are fp32), named by its synthetic tag
// (worker/model/synthetic_init.h: SyntheticTag(kind, layer)). INVALID_ARGUMENT when `backend`
// is not a CUDA backend or the range is outside the tensor.
absl::StatusOr<std::vector<float>> ReadCudaWeight(Backend& backend, uint32_t tag, int64_t offset,
                                                  int64_t count);

}  // namespace lazyrag
