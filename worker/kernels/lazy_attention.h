// LazyAttention CUDA kernels over the paged KV pool (DESIGN sections 2, 4, 5).
//
// Plain host API: device pointers in a params struct, a stream, an absl::Status back. No CUDA
// type leaks into includers except cudaStream_t (forward-declared below exactly as the CUDA
// headers declare it). bf16 tensors are passed as their raw 16-bit patterns (uint16_t).
//
// Semantics are those of PagedAttentionCpu (worker/attention/attention_cpu.h), the ground
// truth these kernels are tested against:
//   * kRotatedLocal (LAZY, the default): keys are stored rotated at their segment-local
//     position j; the query row at logical position p is re-rotated by p - seg_start[s] once
//     per segment s, in registers, and attends key (s, j) iff seg_start[s] + j <= p.
//   * kUnrotated (MEPIC/FlashInfer variant, kept to measure against): keys stored un-rotated;
//     each K tile is rotated at seg_start[s] + j in shared memory, the query once at p.
// MATERIALIZE and FULL use a single segment starting at 0 (then both layouts agree with plain
// causal attention).
//
// Numerics: bf16 inputs, fp32 accumulation (tensor-core mma, fp32 online softmax), bf16
// output. RoPE angles are float(pos) * inv_freq with the product's rounding error carried and
// an exact Cody-Waite reduction by 2*pi, then a [-pi, pi] sine/cosine: absolute angle error
// ~1e-6 rad for |pos| < 2^24 (the CPU computes in double). The rotated query is rounded to
// bf16 before the QK^T mma and softmax weights to bf16 before the PV mma, so results match the
// fp32 CPU reference on the same bf16 inputs to bf16 rounding: |gpu - ref| <= 4e-3 + 2e-2 |ref|
// for O(1) inputs (kernels_test).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "worker/attention/attention_types.h"
#include "worker/attention/segment_view.h"

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

namespace lazyrag::kernels {

// Which prefill kernel runs. Serving leaves kAuto.
enum class PrefillKernel {
  // wgmma where it applies (head dim 128, kRotatedLocal, an sm_90a build on a compute
  // capability 9.0 device): the warp-specialized TMA kernel where LazyAttentionPrefillUsesWs
  // (its consumer warpgroups ping-pong when the launch splits the KV), else the all-warps
  // cp.async kernel (64-key tiles when the launch splits the KV, 128-key tiles otherwise);
  // the mma.sync kernel elsewhere.
  kAuto,
  // Test and benchmark hook: the mma.sync kernel at every shape. kAuto runs it for head dim
  // 64, for the un-rotated layout and where the wgmma kernels are not built or not supported;
  // this forces it on the shapes the wgmma kernels take on an sm_90a device, so that tests can
  // compare the two there.
  kMmaSync,
};

struct LazyAttentionParams {
  AttentionShape shape;  // num_heads % num_kv_heads == 0; head_dim 64 or 128; group <= 16
  KeyLayout key_layout = KeyLayout::kRotatedLocal;

  const uint16_t* q = nullptr;        // [num_q, num_heads, head_dim] bf16, NOT rotated
  const uint16_t* k_cache = nullptr;  // [num_pages, page_size, num_kv_heads, head_dim] bf16
  const uint16_t* v_cache = nullptr;  // [num_pages, page_size, num_kv_heads, head_dim] bf16
  uint16_t* out = nullptr;            // [num_q, num_heads, head_dim] bf16; rows with no key = 0
  const float* inv_freq = nullptr;    // [head_dim / 2] (worker/attention/rope.h)
  SegmentView view;                   // all arrays in device memory; page_size >= 1

  // Host-side planning hints (the launcher never reads device memory).
  // REQUIRES: max_q_len >= the query rows of every request; max_kv_len >= sum of seg_len of
  // every request. They size the grid; loose bounds cost idle blocks, not correctness.
  int max_q_len = 1;
  int max_kv_len = 0;

  // Scratch for split-KV partial results (fp32). May be null: then no split. When it is too
  // small for the planned split count, fewer splits are used.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // 0: choose the number of KV splits from the grid size (the default); n > 0: use n
  // (clamped to kMaxKvSplits and to the workspace). Tests force splits with it.
  int num_splits = 0;
  // Test and benchmark hook (see PrefillKernel); serving leaves kAuto. Decode ignores it.
  PrefillKernel prefill_kernel = PrefillKernel::kAuto;
  // Pages in the K and V pools: the extent of the TMA tensor maps of the warp-specialized
  // prefill and of the decode's TMA warp pipes. 0: unknown; then neither runs (their cp.async
  // counterparts do).
  int num_pages = 0;
  // The caller's promise that every key row at a position below its request's first query
  // position (its query positions increase) was written before the kernel that precedes this
  // launch on the stream started: only the step's own rows (the query tokens' keys) may be
  // written by the kernels just before (the engine's case: documents and earlier steps' rows
  // are finished; the QKV scatter writes the step's rows). The decode kernel with warp
  // pipelines then starts gathering K/V tiles before waiting for the preceding kernel
  // (programmatic dependent launch), overlapping its tail; tiles holding the query's own row
  // are read after the wait. The warp-specialized prefill copies its first tile before the
  // wait where all its keys sit below the request's first query position; the other prefill
  // kernels ignore the flag. false: every K/V read waits.
  bool stable_history = false;
  // A range for L2 to hold when the attention is done with the memory: each block of the
  // warp-specialized prefill and of the decode asks L2 (bulk prefetch) for its equal share
  // once it has issued its last K/V copy, so that the bytes the next kernel reads (the O
  // projection's weights) stream while the attention's tail, stores and split merge leave the
  // memory idle; with l2_prefetch_at_start, as soon as the block starts (before waiting for
  // the previous kernel: under that kernel's tail and the attention's prologue). A hint:
  // outputs are the same with or without it; the other kernels ignore it.
  // REQUIRES: 16-byte aligned, bytes a multiple of 16 (0: none).
  const void* l2_prefetch = nullptr;
  int64_t l2_prefetch_bytes = 0;
  bool l2_prefetch_at_start = false;
  // The K/V copies by TMA (the warp-specialized prefill, the decode's TMA warp pipes) ask L2
  // to evict the lines they bring in first: the documents are read once a step, and what
  // l2_prefetch asked for stays. A hint: outputs are the same.
  bool kv_evict_first = false;
  // The warp-specialized prefill computes a tile of at most 32 or 64 valid keys (a segment's
  // tail: the query block's own keys after whole document tiles) at that wgmma width instead of
  // 128, so the split that holds it pays a quarter or half of a tile's products and softmax.
  // The same outputs bit for bit; the other kernels ignore it.
  bool narrow_tail_tiles = false;
};

inline constexpr int kMaxKvSplits = 128;

// Workspace bytes that let `max_splits` KV splits run for num_q rows.
size_t LazyAttentionWorkspaceBytes(int num_q, int num_heads, int head_dim,
                                   int max_splits = kMaxKvSplits);

// Prefill: any number of query rows per request (query blocks against cached segments,
// chunked causal prefill of the request's own tokens, FULL document encoding). Tensor-core
// tiles of 128 packed (query row x group head) rows against key tiles gathered from pages:
// for head_dim 128 with the LAZY layout on sm_90a, wgmma (two warpgroups), fed by a TMA
// producer warp when num_pages is given (LazyAttentionPrefillUsesWs), else by cp.async from
// all threads; mma.sync otherwise (and with params.prefill_kernel kMmaSync).
absl::Status LazyAttentionPrefill(const LazyAttentionParams& params, cudaStream_t stream);

// Whether LazyAttentionPrefill(params) runs the wgmma kernel (head_dim 128, kRotatedLocal,
// prefill_kernel != kMmaSync, a compute capability 9.0 device and an sm_90a build). Needs the
// current device; false when it cannot be queried.
bool LazyAttentionPrefillUsesWgmma(const LazyAttentionParams& params);

// Whether it runs the warp-specialized kernel: the wgmma kernel applies, num_pages > 0,
// page_size in {8, 16, 32, 64}, num_pages * page_size < 2^31 and 16-byte aligned pools.
bool LazyAttentionPrefillUsesWs(const LazyAttentionParams& params);

// Decode: exactly one query row per request (REQUIRES view.num_q == view.num_requests).
// Flash-decoding: the KV of each (request, KV head) is split so that the grid fills the GPU,
// then a merge kernel combines the partial results. Head dim 128 with the LAZY layout runs warp
// pipelines (each warp loads its own keys of every tile), copying by TMA where page_size is a
// power of two >= 16 and num_pages > 0, by cp.async otherwise (bit-identical results); other
// shapes and layouts run block tiles (the whole block loads each tile).
absl::Status LazyAttentionDecode(const LazyAttentionParams& params, cudaStream_t stream);

// Whether a block of the batch-1 split merge kernel fits on a multiprocessor of the current
// device beside two blocks of each warp-pipe decode kernel (head dim 128; TMA, which batch 1
// runs, and cp.async): registers (at the allocation granularity), shared memory, warps. It
// must: the merge blocks are then resident, waiting for the decode grid, before it ends
// (without room for them each chained batch-1 decode measured slower on the H200; see
// bench/README.md). `report` says what each side uses and what the multiprocessor has.
absl::Status DecodeSplitMergeResidency(bool* fits, std::string* report);

// Checks the parameters as the launchers do (no device access). INVALID_ARGUMENT on error.
absl::Status ValidateLazyAttentionParams(const LazyAttentionParams& params, bool decode);

}  // namespace lazyrag::kernels
