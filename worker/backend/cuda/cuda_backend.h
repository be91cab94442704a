// CUDA backend: the Llama forward in bf16 on one GPU, behind the Backend interface
// (worker/backend/backend.h), checked against the fp32 CPU backend.
//
// * Weights (cuda_weights.h): bf16 in one device allocation; Q|K|V and gate|up fused into one
//   GEMM each. Host fp32 weights are rounded to bf16 on the device after upload; synthetic
//   models are generated in device memory, bit-identical to the loader's fp32 values before
//   bf16 rounding.
// * Activations (device_buffers.h): the residual stream is fp32; GEMM inputs are bf16; cuBLAS
//   accumulates in fp32; the O and down projections write bf16 that the next RMSNorm kernel
//   adds to the residual (the fused residual-add + norm).
// * KV pool (cuda_kv_pool.h): one bf16 allocation,
//   [num_layers][K | V][num_pages, page_size, kv_heads, head_dim].
// * Attention: worker/kernels LazyAttentionDecode when every request has one query row, else
//   LazyAttentionPrefill (head dims 64 and 128); a CUDA-core fallback for other head dims.
// * Small steps may run from CUDA graphs (step_graphs.h).
//
// * Tensor parallelism (options.shard, worker/backend/tp_shard.h; cuda_tensor_parallel.h): the
//   backend holds rank r's slice (heads, KV heads, intermediate columns); synthetic slices are
//   generated with their global indices, so TP=N weights are bit-identical slices of TP=1's;
//   host weights are sliced on the host before upload. The bf16 outputs of the O and down
//   projections (each rank's partial sums) are all-reduced with NCCL on the backend's stream
//   before the next RMSNorm adds them to every rank's residual.
//
// Thread safety: every method takes an internal lock; calls are serialized on one stream.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/backend/tp_shard.h"
#include "worker/model/model_source.h"

namespace lazyrag {

struct CudaBackendOptions {
  int device = 0;  // CUDA device index
  // Synthetic models: generate the weights in device memory (default) even when the
  // LoadedModel also carries host weights. false: upload the host weights (REQUIRES them).
  bool synthetic_on_device = true;
  // Scratch for split-KV attention; 0: enough for 64 query rows at the kernels' maximum split.
  int64_t attention_workspace_bytes = 0;
  // CUDA graphs for steps of at most graph_max_tokens tokens (decode batches, short query
  // blocks): a step shape seen a second time is captured once and replayed from then on
  // (~12 kernels per layer launched as one graph). Keyed by tokens, logit rows, requests,
  // segments, longest query and longest KV rounded up to 256 (rounded with graphs off too, so
  // a replay gives the eager step's logits bit for bit); at most max_graphs kept (least
  // recently used dropped). One rank only (not with tensor parallelism). On by default:
  // measured faster (ttft_bench --cuda_graphs 0|1; see bench/README.md).
  bool cuda_graphs = true;
  int graph_max_tokens = 256;
  int max_graphs = 64;
  // Record the phases of each Forward or ForwardArgmax that returns outputs
  // (TakeCudaStepTimings): two CUDA events and a few clock reads per step. For benchmarks
  // (ttft_bench --step_times).
  bool time_steps = false;
  // The decode attention kernel may start gathering the K/V of documents and earlier steps
  // before the step's QKV scatter has finished (kernels::LazyAttentionParams::stable_history: the
  // scatter writes only the step's own rows). On by default: measured faster (ttft_bench
  // --early_kv 0|1; see bench/README.md).
  bool early_kv_reads = true;
  // In steps of 2-64 token rows (query blocks, batched decode) the attention kernels ask L2
  // for the layer's O-projection weights once each block has issued its last K/V copy, and
  // copy K/V under an evict-first policy (kernels::LazyAttentionParams::l2_prefetch,
  // kv_evict_first), so that O's weights stream while the attention's tail and split merge
  // leave the memory idle and O reads them from L2. Not in one-row steps, whose latency-bound
  // decode attention the prefetch slows by more than O gains, nor above 64 rows. 1 (default):
  // measured faster than 0, off (ttft_bench --o_prefetch 0|1|2; see bench/README.md); 2: the
  // blocks ask at their start instead (under the QKV projection's tail), not yet measured.
  int prefetch_o_weights = 1;
  // The prefill attention computes a segment's tail tile of at most 64 keys (a query block's
  // own keys) at a narrower wgmma width (kernels::LazyAttentionParams::narrow_tail_tiles): the
  // same logits bit for bit. Off by default until measured (ttft_bench --narrow_tail 0|1).
  bool narrow_tail_tiles = false;
  // In steps of 2-64 token rows on one rank, the RMSNorm before the FFN folded into the
  // projections around it (kernels::WgmmaNormIn, as the one-token GEMVs fold every norm):
  // gate|up applies each row's 1/rms from per-row sums of squares. 1: O on the wgmma kernel adds
  // to the residual and writes the norm's operand and the sums itself (WgmmaResidualOut); 2: O
  // stays on cuBLAS and cuda_model::LaunchResidualScale does that (no wait for a whole row, as
  // the norm kernel has). 0: the norm kernel. One bf16 rounding moves (logits near, not equal).
  // Off by default until measured (ttft_bench --fold_ffn_norm 0|1|2); other values
  // INVALID_ARGUMENT.
  int fold_ffn_norm = 0;
  // The same for the RMSNorm before QKV in layers after the first: down's output goes through
  // LaunchResidualScale and the wgmma QKV projection applies 1/rms. Off by default until
  // measured (ttft_bench --fold_attn_norm 0|1).
  bool fold_attn_norm = false;
  // Projections of 1-64 token rows through kernels::LaunchWgmmaGemm (TMA + wgmma, the SwiGLU
  // fused into gate|up) instead of cuBLAS: 1 (default) where every SM gets a block (the lm_head
  // and gate|up of Llama-3-8B) and for QKV (it streams its weights under the RMSNorm before it),
  // measured faster (ttft_bench --wgmma_gemm 0|1); 2 on every shape it takes (tests), 0 never.
  // Needs a compute capability 9.0 device (cuBLAS otherwise).
  int wgmma_gemm = 1;
  // Tensor parallelism: this backend is rank shard.rank of shard.size (CreateCudaBackend takes
  // the global model and keeps the rank's slice). `nccl_comm` is that rank's ncclComm_t
  // (opaque here so that this header needs no NCCL), REQUIRED when shard.size > 1; the backend
  // takes ownership (ncclCommDestroy), also when creation fails.
  // CreateCudaTensorParallelBackend sets these.
  TpShard shard;
  void* nccl_comm = nullptr;
};

// INVALID_ARGUMENT for a config the backend cannot run or host weights of the wrong size;
// FAILED_PRECONDITION when there is no such device; RESOURCE_EXHAUSTED when the weights do not
// fit; INTERNAL for other CUDA/cuBLAS failures. Does not take `model`'s weights.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const LoadedModel& model,
                                                           const CudaBackendOptions& options = {});

// N ranks of the CUDA backend on devices options.device .. options.device + N - 1 behind one
// TensorParallelBackend (worker/backend/tensor_parallel.h), with one NCCL communicator per rank
// (ncclCommInitAll; NCCL_NVLS_ENABLE defaults to 0 here: NVLink multicast off unless the
// environment says otherwise). Ranks are built in parallel, one thread per device. N = 1 gives
// the wrapper over one plain backend (no NCCL). INVALID_ARGUMENT when the model does not split
// into N ranks; FAILED_PRECONDITION with fewer than N devices; UNIMPLEMENTED for N > 1 in a
// build without NCCL.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaTensorParallelBackend(
    const LoadedModel& model, int tensor_parallel, const CudaBackendOptions& options = {});

// True when this build has NCCL (tensor parallelism over several GPUs).
bool CudaBackendHasNccl();

// Where the wall time of one Forward went (CudaBackendOptions::time_steps).
struct CudaStepTiming {
  int tokens = 0;
  bool graph = false;   // replayed from a CUDA graph
  double plan_ms = 0;   // host: checks, planning, upload queued (entry to the step's launch)
  double queue_ms = 0;  // host: launching the step's kernels or replaying its graph
  double wait_ms = 0;   // host: waiting for the GPU (outputs copied to pinned memory)
  double copy_ms = 0;   // host: the logits or argmax ids into the caller's vector
  double gpu_ms = 0;    // device: from the upload to the outputs' copy's end (CUDA events)
};
// The timings recorded since the last call (at most 1,024 kept), oldest first; cleared.
absl::StatusOr<std::vector<CudaStepTiming>> TakeCudaStepTimings(Backend& backend);

// For tests: elements [offset, offset + count) of one weight tensor as stored on the device
// (bf16 widened to fp32; norm weights are fp32; a tensor-parallel rank's own slice), named by
// its synthetic tag
// (worker/model/synthetic_init.h: SyntheticTag(kind, layer)). INVALID_ARGUMENT when `backend`
// is not a CUDA backend or the range is outside the tensor.
absl::StatusOr<std::vector<float>> ReadCudaWeight(Backend& backend, uint32_t tag, int64_t offset,
                                                  int64_t count);

}  // namespace lazyrag
