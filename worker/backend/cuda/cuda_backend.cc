#include "worker/backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#ifdef LAZYRAG_HAVE_NCCL
#include <nccl.h>
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/status.h"
#include "worker/kernels/cuda_check.h"
#include "worker/kernels/model_kernels.h"
#include "worker/backend/cuda/peer_copy.h"
#include "worker/attention/rope.h"
#include "worker/backend/tensor_parallel.h"
#include "worker/kernels/lazy_attention.h"
#include "worker/kernels/materialize.h"
#include "worker/model/synthetic_init.h"

namespace lazyrag {
namespace {

constexpr size_t kAlign = 256;
constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;  // NVIDIA's advice for Hopper
constexpr int64_t kUploadChunkFloats = int64_t(16) << 20;   // fp32 staging for host weights

size_t AlignUp(size_t n, size_t a = kAlign) { return (n + a - 1) / a * a; }

#ifdef LAZYRAG_HAVE_NCCL
#define LAZYRAG_RETURN_IF_NCCL_ERROR(expr)                                     \
  do {                                                                         \
    const ncclResult_t lazyrag_nccl_result = (expr);                           \
    if (lazyrag_nccl_result != ncclSuccess) {                                  \
      return absl::InternalError(                                              \
          absl::StrCat(#expr, ": ", ncclGetErrorString(lazyrag_nccl_result))); \
    }                                                                          \
  } while (0)
#endif

// Owning device allocation (cudaMalloc). Freeing synchronizes the device, so a buffer may be
// replaced while earlier work on it is still queued.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  absl::Status Allocate(size_t bytes) {
    Release();
    if (bytes == 0) return absl::OkStatus();
    if (const cudaError_t err = cudaMalloc(&ptr_, bytes); err != cudaSuccess) {
      ptr_ = nullptr;
      (void)cudaGetLastError();  // out of memory is not sticky: clear it for later launch checks
      return CudaErrorStatus(err, "cudaMalloc(&ptr_, bytes)");
    }
    bytes_ = bytes;
    return absl::OkStatus();
  }
  // Grows (never shrinks) to at least `bytes`; contents are not kept.
  absl::Status Reserve(size_t bytes) {
    if (bytes <= bytes_) return absl::OkStatus();
    return Allocate(std::max(bytes, bytes_ + bytes_ / 2));
  }
  void Release() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  char* data() const { return static_cast<char*>(ptr_); }
  size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Owning page-locked host allocation (cudaMallocHost).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { Release(); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  absl::Status Reserve(size_t bytes) {
    if (bytes <= bytes_) return absl::OkStatus();
    Release();
    const size_t n = std::max<size_t>(bytes, 64 << 10);
    LAZYRAG_RETURN_IF_CUDA_ERROR(cudaMallocHost(&ptr_, n));
    bytes_ = n;
    return absl::OkStatus();
  }
  void Release() {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  char* data() const { return static_cast<char*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Host arrays gathered into one pinned buffer and uploaded with one copy.
class UploadPlan {
 public:
  template <typename T>
  size_t Add(const T* data, size_t count) {
    const size_t offset = bytes_;
    parts_.push_back({offset, count * sizeof(T), data});
    bytes_ = AlignUp(offset + count * sizeof(T), 16);
    return offset;
  }
  template <typename T>
  size_t Add(const std::vector<T>& v) {
    return Add(v.data(), v.size());
  }
  size_t bytes() const { return std::max<size_t>(bytes_, 16); }
  void CopyTo(char* dst) const {
    for (const Part& p : parts_) {
      if (p.bytes > 0) std::memcpy(dst + p.offset, p.src, p.bytes);
    }
  }

 private:
  struct Part {
    size_t offset;
    size_t bytes;
    const void* src;
  };
  std::vector<Part> parts_;
  size_t bytes_ = 0;
};

struct LayerWeightsDevice {
  uint16_t* wqkv = nullptr;       // [q_dim + 2 kv_dim, hidden]: rows of wq, then wk, then wv
  uint16_t* wo = nullptr;         // [hidden, q_dim]
  uint16_t* w_gate_up = nullptr;  // [2 ff, hidden]: rows of w_gate, then w_up
  uint16_t* w_down = nullptr;     // [hidden, ff]
  float* attn_norm = nullptr;     // [hidden] fp32
  float* ffn_norm = nullptr;      // [hidden] fp32
};

// One weight tensor as the loader names it (for filling, uploading and reading back).
// With tensor parallelism a tensor is the rank's slice: element i is element g(i) of the
// global tensor (model_kernels.h SyntheticFillParams: first, cols, global_cols).
struct TensorRef {
  uint32_t tag = 0;
  void* ptr = nullptr;
  int64_t count = 0;
  int64_t fan_in = 0;  // linear weights (of the global tensor); 0 for the embedding and norms
  bool is_norm = false;
  const std::vector<float>* host = nullptr;  // when uploading host weights (the rank's slice)
  int64_t first = 0;                         // global index of element 0
  int64_t cols = 0;         // 0: contiguous; else the slice's row length (a block of columns)
  int64_t global_cols = 0;  // the global row length when cols > 0
};

class CudaBackend final : public Backend {
 public:
  // `config` is the rank's (ShardConfig) config.
  CudaBackend(const ModelConfig& config, const CudaBackendOptions& options)
      : config_(config), options_(options) {}
  ~CudaBackend() override;

  absl::Status Init(const LoadedModel& model);

  std::string name() const override { return "cuda"; }
  const ModelConfig& config() const override { return config_; }
  int num_pages() const override { return num_pages_; }
  int page_size() const override { return page_size_; }
  KvDtype kv_dtype() const override { return KvDtype::kBFloat16; }

  absl::Status InitPool(int num_pages, int page_size) override;
  absl::Status Forward(const ForwardBatch& batch, std::vector<float>* logits) override {
    return ForwardImpl(batch, logits, nullptr);
  }
  absl::Status ForwardArgmax(const ForwardBatch& batch, std::vector<int32_t>* ids) override {
    return ForwardImpl(batch, nullptr, ids);
  }
  absl::Status Materialize(const std::vector<MaterializeCopy>& copies) override;
  absl::Status ExportKv(const std::vector<int32_t>& pages, int num_tokens,
                        std::string* out) override;
  absl::Status ImportKv(const std::vector<int32_t>& pages, int num_tokens,
                        std::string_view data) override;
  // The peer tier's fast path (issue 9): the pool lent by CUDA IPC, pages pulled from a peer's.
  absl::StatusOr<PeerPoolHandle> ExportPoolHandle() override;
  absl::Status CopyPagesFromPeer(const PeerPoolHandle& peer, const std::vector<int32_t>& peer_pages,
                                 const std::vector<int32_t>& own_pages) override;

  absl::StatusOr<std::vector<float>> ReadWeight(uint32_t tag, int64_t offset, int64_t count);
  std::vector<CudaStepTiming> TakeStepTimings();

 private:
  // Forward (logits) or ForwardArgmax (ids: the argmax kernel, one id per row copied back).
  absl::Status ForwardImpl(const ForwardBatch& batch, std::vector<float>* logits,
                           std::vector<int32_t>* ids);
  bool tensor_parallel() const { return options_.shard.size > 1; }
  // Sums `count` bf16 elements at `data` over the ranks in place on the stream (no-op without
  // tensor parallelism).
  absl::Status AllReduce(uint16_t* data, int64_t count) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The transport kernel's parameters for `num_tokens` tokens of the page run at `pages` (device).
  cuda_model::KvTransportParams TransportParams(const int32_t* pages, int num_tokens,
                                                uint16_t* buffer, bool to_buffer) const;
  // Also clears this thread's last CUDA error: a failed cudaMalloc (say, a pool too large,
  // already reported) leaves it set, and the next launch check would report it as that launch's
  // failure. With tensor parallelism that made one rank fail before its first all-reduce while
  // the others waited in NCCL (seen on the H200 x2: tp_bench hung after a 70B TP=1 pool OOM).
  absl::Status SetDevice() const {
    LAZYRAG_RETURN_IF_CUDA_ERROR(cudaSetDevice(options_.device));
    // A non-sticky error left by an earlier call on this thread (every launch here is checked
    // where it is made) must not fail this one, but it is reported rather than dropped silently;
    // sticky errors (a faulted kernel) fail the next CUDA call anyway.
    if (const cudaError_t stale = cudaGetLastError(); stale != cudaSuccess) {
      LOG_WARNING << "cuda backend: device " << options_.device
                  << ": clearing an earlier error before this call: " << cudaGetErrorName(stale)
                  << " (" << cudaGetErrorString(stale) << ")";
    }
    return absl::OkStatus();
  }
  std::vector<TensorRef> Tensors(const ModelWeights* host);
  absl::Status LoadWeights(const LoadedModel& model);
  absl::Status CheckBatch(const ForwardBatch& b) const;
  absl::Status CheckRun(const std::vector<int32_t>& pages, int64_t num_tokens) const;
  // Copies `plan` into the pinned buffer (after the previous upload has left it) and into
  // device memory on the stream; returns the device base address.
  absl::StatusOr<char*> Upload(const UploadPlan& plan) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReserveActivations(int tokens, int rows) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // One forward step's device inputs and bounds (Forward plans it, EnqueueStep queues it).
  struct Step {
    const int32_t* tokens = nullptr;
    const int32_t* kv_pos = nullptr;
    const int64_t* kv_slot = nullptr;
    const int32_t* logit_rows = nullptr;
    const int32_t* row_request = nullptr;  // fallback attention only
    SegmentView view;
    int tokens_n = 0, rows_n = 0, max_q_len = 1, max_kv_len = 0;
    bool decode = false;
  };
  // Queues every kernel of the step, from the RoPE table to the logits in logits_ (none when
  // rows_n == 0), on stream_: run eagerly or captured into a CUDA graph.
  absl::Status EnqueueStep(const Step& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `s` from a cached CUDA graph when one exists for its shape, captures one when the
  // shape comes round a second time, else queues it eagerly. See CudaBackendOptions::cuda_graphs.
  absl::Status RunStep(const Step& s, int num_segments) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ClearGraphs() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // y[rows, n] = x[rows, k] * w[n, k]^T, bf16 inputs, fp32 accumulation, y of y_type.
  absl::Status Gemm(const uint16_t* x, const uint16_t* w, void* y, cudaDataType y_type, int rows,
                    int n, int k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint16_t* LayerK(int layer) const { return pool_k_ + int64_t(layer) * layer_stride_; }
  uint16_t* LayerV(int layer) const { return LayerK(layer) + kv_elems_; }

  const ModelConfig config_;
  const CudaBackendOptions options_;
  bool tensor_core_attention_ = false;  // head_dim 64/128 and group <= 16
  AttentionShape shape_;

  absl::Mutex mu_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cudaEvent_t upload_done_ = nullptr;  // the pinned upload buffer may be rewritten after it
  // options_.time_steps: events around each step's device work, and the recorded steps.
  cudaEvent_t step_begin_ = nullptr, step_end_ = nullptr;
  std::vector<CudaStepTiming> step_timings_ ABSL_GUARDED_BY(mu_);

  DeviceBuffer weights_;
  std::vector<LayerWeightsDevice> layers_;
  uint16_t* embedding_ = nullptr;  // [vocab, hidden]
  uint16_t* lm_head_ = nullptr;    // [vocab, hidden]; == embedding_ when tied
  float* final_norm_ = nullptr;    // [hidden]
  DeviceBuffer inv_freq_;          // [head_dim / 2] fp32
  DeviceBuffer cublas_workspace_;
  DeviceBuffer attention_workspace_;

  // KV pool: [num_layers][K | V][num_pages * page_size, kv_dim] bf16.
  DeviceBuffer pool_;
  uint16_t* pool_k_ = nullptr;
  int64_t kv_elems_ = 0;      // elements of one layer's K (or V)
  int64_t layer_stride_ = 0;  // 2 * kv_elems_
  int num_pages_ = 0;
  int page_size_ = 16;
  peer_copy::PoolLayout PoolLayoutOf() const {
    peer_copy::PoolLayout l;
    l.num_layers = config_.num_layers;
    l.num_pages = num_pages_;
    l.page_size = page_size_;
    l.kv_dim = config_.kv_dim();
    l.elem_bytes = sizeof(uint16_t);
    return l;
  }
  // Peer pools mapped by CUDA IPC, by handle bytes (a restarted peer has a new handle); mapped
  // once, unmapped in the destructor.
  std::map<std::string, void*> peer_pools_ ABSL_GUARDED_BY(mu_);

  PinnedBuffer upload_host_ ABSL_GUARDED_BY(mu_);
  DeviceBuffer upload_device_ ABSL_GUARDED_BY(mu_);
  PinnedBuffer logits_host_ ABSL_GUARDED_BY(mu_);
  DeviceBuffer argmax_device_ ABSL_GUARDED_BY(mu_);  // ForwardArgmax's ids, [rows] int32
  PinnedBuffer argmax_host_ ABSL_GUARDED_BY(mu_);

  // Activation scratch sized for act_tokens_ rows and act_rows_ logit rows.
  DeviceBuffer activations_ ABSL_GUARDED_BY(mu_);
  int act_tokens_ = 0;
  int act_rows_ = 0;
  float* x_ = nullptr;           // [T, hidden] fp32 residual stream
  uint16_t* h_ = nullptr;        // [T, hidden] bf16 normed
  float* qkv_ = nullptr;         // [T, q_dim + 2 kv_dim] fp32
  uint16_t* q_ = nullptr;        // [T, q_dim] bf16
  uint16_t* attn_ = nullptr;     // [T, q_dim] bf16
  uint16_t* delta_ = nullptr;    // [T, hidden] bf16 projection output, added by the next RMSNorm
  uint16_t* gate_up_ = nullptr;  // [T, 2 ff] bf16
  uint16_t* act_ = nullptr;      // [T, ff] bf16
  float* rope_ = nullptr;        // [T, head_dim / 2, 2]
  uint16_t* h_rows_ = nullptr;   // [R, hidden] bf16 final-normed logit rows
  float* logits_ = nullptr;      // [R, vocab] fp32

  // CUDA graphs of small steps, by shape: (tokens, logit rows, requests, segments, max query
  // length, max KV length rounded up to kGraphKvBucket, decode). Upload offsets depend only on
  // the first four (page indices go last), and every buffer a graph reads stays where it is
  // until ClearGraphs (buffer growth, a new pool, destruction).
  using GraphKey = std::array<int, 7>;
  struct CachedGraph {
    cudaGraphExec_t exec = nullptr;
    uint64_t last_use = 0;
  };
  std::map<GraphKey, CachedGraph> graphs_ ABSL_GUARDED_BY(mu_);
  std::map<GraphKey, int> graph_sightings_ ABSL_GUARDED_BY(mu_);
  uint64_t graph_clock_ ABSL_GUARDED_BY(mu_) = 0;
  size_t graph_replays_ ABSL_GUARDED_BY(mu_) = 0;
};

CudaBackend::~CudaBackend() {
#ifdef LAZYRAG_HAVE_NCCL
  if (options_.nccl_comm != nullptr) {
    if (stream_ != nullptr && cudaSetDevice(options_.device) == cudaSuccess) {
      cudaStreamSynchronize(stream_);
    }
    ncclCommDestroy(static_cast<ncclComm_t>(options_.nccl_comm));
  }
#endif
  if (stream_ == nullptr) return;  // Init failed before touching the device
  if (cudaSetDevice(options_.device) != cudaSuccess) return;
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g.exec);
  for (auto& [handle, mapped] : peer_pools_) (void)peer_copy::ClosePoolIpcHandle(mapped);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (upload_done_ != nullptr) cudaEventDestroy(upload_done_);
  if (step_begin_ != nullptr) cudaEventDestroy(step_begin_);
  if (step_end_ != nullptr) cudaEventDestroy(step_end_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  // DeviceBuffer / PinnedBuffer members free themselves after this body, on this device.
}

std::vector<TensorRef> CudaBackend::Tensors(const ModelWeights* host) {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(), ff = c.intermediate_size;
  // Rank r of N holds rows [r * n, (r + 1) * n) of wq / wk / wv / w_gate / w_up (n its rows) and
  // the same block of columns of wo and w_down; fan-ins are the global ones.
  const int64_t N = options_.shard.size, r = options_.shard.rank;
  // The host tensor of layer l, or null when not uploading.
  auto hl = [&](int l, std::vector<float> LayerWeights::*m) -> const std::vector<float>* {
    return host != nullptr ? &(host->layers[l].*m) : nullptr;
  };
  std::vector<TensorRef> t;
  t.push_back({SyntheticTag(kSynEmbedding, 0), embedding_, c.vocab_size * d, 0, false,
               host ? &host->token_embedding : nullptr});
  t.push_back({SyntheticTag(kSynFinalNorm, 0), final_norm_, d, 0, true,
               host ? &host->final_norm : nullptr});
  if (!c.tie_word_embeddings) {
    t.push_back({SyntheticTag(kSynLmHead, 0), lm_head_, c.vocab_size * d, d, false,
                 host ? &host->lm_head : nullptr});
  }
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeightsDevice& L = layers_[l];
    t.push_back(
        {SyntheticTag(kSynAttnNorm, l), L.attn_norm, d, 0, true, hl(l, &LayerWeights::attn_norm)});
    t.push_back(
        {SyntheticTag(kSynWq, l), L.wqkv, qd * d, d, false, hl(l, &LayerWeights::wq), r * qd * d});
    t.push_back({SyntheticTag(kSynWk, l), L.wqkv + qd * d, kvd * d, d, false,
                 hl(l, &LayerWeights::wk), r * kvd * d});
    t.push_back({SyntheticTag(kSynWv, l), L.wqkv + (qd + kvd) * d, kvd * d, d, false,
                 hl(l, &LayerWeights::wv), r * kvd * d});
    t.push_back({SyntheticTag(kSynWo, l), L.wo, d * qd, N * qd, false, hl(l, &LayerWeights::wo),
                 r * qd, N > 1 ? qd : 0, N * qd});
    t.push_back(
        {SyntheticTag(kSynFfnNorm, l), L.ffn_norm, d, 0, true, hl(l, &LayerWeights::ffn_norm)});
    t.push_back({SyntheticTag(kSynWGate, l), L.w_gate_up, ff * d, d, false,
                 hl(l, &LayerWeights::w_gate), r * ff * d});
    t.push_back({SyntheticTag(kSynWUp, l), L.w_gate_up + ff * d, ff * d, d, false,
                 hl(l, &LayerWeights::w_up), r * ff * d});
    t.push_back({SyntheticTag(kSynWDown, l), L.w_down, d * ff, N * ff, false,
                 hl(l, &LayerWeights::w_down), r * ff, N > 1 ? ff : 0, N * ff});
  }
  return t;
}

absl::Status CudaBackend::Init(const LoadedModel& model) {
  const ModelConfig& c = config_;
  RETURN_IF_ERROR(c.Validate());
  if (c.head_dim > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda backend: head_dim ", c.head_dim, " above 256 is not supported"));
  }
  const int group = c.num_heads / c.num_kv_heads;
  tensor_core_attention_ = (c.head_dim == 64 || c.head_dim == 128) && group <= 16;
  shape_ = AttentionShape{c.num_heads, c.num_kv_heads, c.head_dim,
                          float(1.0 / std::sqrt(double(c.head_dim)))};

  int count = 0;
  const cudaError_t count_err = cudaGetDeviceCount(&count);
  if (count_err != cudaSuccess || count == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda backend: no CUDA device (",
                     count_err != cudaSuccess ? cudaGetErrorString(count_err) : "count is 0", ")"));
  }
  if (options_.device < 0 || options_.device >= count) {
    return absl::FailedPreconditionError(absl::StrCat("cuda backend: device ", options_.device,
                                                      " out of range (", count, " devices)"));
  }
  RETURN_IF_ERROR(SetDevice());
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaEventCreateWithFlags(&upload_done_, cudaEventDisableTiming));
  if (options_.time_steps) {
    LAZYRAG_RETURN_IF_CUDA_ERROR(cudaEventCreate(&step_begin_));
    LAZYRAG_RETURN_IF_CUDA_ERROR(cudaEventCreate(&step_end_));
  }
  LAZYRAG_RETURN_IF_CUBLAS_ERROR(cublasCreate(&cublas_));
  LAZYRAG_RETURN_IF_CUBLAS_ERROR(cublasSetStream(cublas_, stream_));
  RETURN_IF_ERROR(cublas_workspace_.Allocate(kCublasWorkspaceBytes));
  LAZYRAG_RETURN_IF_CUBLAS_ERROR(
      cublasSetWorkspace(cublas_, cublas_workspace_.data(), cublas_workspace_.size()));

  const std::vector<float> inv = RopeInvFreq(c);
  RETURN_IF_ERROR(inv_freq_.Allocate(inv.size() * sizeof(float)));
  LAZYRAG_RETURN_IF_CUDA_ERROR(
      cudaMemcpy(inv_freq_.data(), inv.data(), inv.size() * sizeof(float), cudaMemcpyHostToDevice));

  int64_t ws = options_.attention_workspace_bytes;
  if (ws <= 0) ws = kernels::LazyAttentionWorkspaceBytes(64, c.num_heads, c.head_dim);
  if (tensor_core_attention_) RETURN_IF_ERROR(attention_workspace_.Allocate(size_t(ws)));

  return LoadWeights(model);
}

absl::Status CudaBackend::LoadWeights(const LoadedModel& model) {
  const ModelConfig& c = config_;
  const bool on_device = model.synthetic && (options_.synthetic_on_device || !model.weights);
  const ModelWeights* host = on_device ? nullptr : model.weights.get();
  if (!on_device && host == nullptr) {
    return absl::InvalidArgumentError("cuda backend: model has no host weights");
  }
  // Tensor parallelism: the rank's slice of the host weights, cut on the host before upload.
  std::unique_ptr<ModelWeights> slice;
  if (host != nullptr && tensor_parallel()) {
    ASSIGN_OR_RETURN(slice, ShardWeights(*host, options_.shard));
    host = slice.get();
  }

  // Layout of the one weight allocation.
  const size_t d = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(), ff = c.intermediate_size;
  const size_t bf = sizeof(uint16_t), f32 = sizeof(float);
  size_t bytes = 0;
  auto region = [&](size_t n) {
    const size_t off = bytes;
    bytes = AlignUp(bytes + n);
    return off;
  };
  struct LayerOffsets {
    size_t wqkv, wo, wgu, wdown, attn_norm, ffn_norm;
  };
  std::vector<LayerOffsets> lo(c.num_layers);
  for (LayerOffsets& o : lo) {
    o.wqkv = region((qd + 2 * kvd) * d * bf);
    o.wo = region(d * qd * bf);
    o.wgu = region(2 * ff * d * bf);
    o.wdown = region(d * ff * bf);
    o.attn_norm = region(d * f32);
    o.ffn_norm = region(d * f32);
  }
  const size_t emb = region(size_t(c.vocab_size) * d * bf);
  const size_t head = c.tie_word_embeddings ? emb : region(size_t(c.vocab_size) * d * bf);
  const size_t fnorm = region(d * f32);
  if (auto st = weights_.Allocate(bytes); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("cuda backend: ", bytes / double(1 << 30),
                                                " GiB of bf16 weights: ", st.message()));
  }
  char* base = weights_.data();
  layers_.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeightsDevice& L = layers_[l];
    L.wqkv = reinterpret_cast<uint16_t*>(base + lo[l].wqkv);
    L.wo = reinterpret_cast<uint16_t*>(base + lo[l].wo);
    L.w_gate_up = reinterpret_cast<uint16_t*>(base + lo[l].wgu);
    L.w_down = reinterpret_cast<uint16_t*>(base + lo[l].wdown);
    L.attn_norm = reinterpret_cast<float*>(base + lo[l].attn_norm);
    L.ffn_norm = reinterpret_cast<float*>(base + lo[l].ffn_norm);
  }
  embedding_ = reinterpret_cast<uint16_t*>(base + emb);
  lm_head_ = reinterpret_cast<uint16_t*>(base + head);
  final_norm_ = reinterpret_cast<float*>(base + fnorm);

  if (host != nullptr && int(host->layers.size()) != c.num_layers) {
    return absl::InvalidArgumentError("cuda backend: host weights have the wrong layer count");
  }
  const std::vector<TensorRef> tensors = Tensors(host);
  DeviceBuffer staging;
  if (host != nullptr) {
    RETURN_IF_ERROR(staging.Allocate(size_t(kUploadChunkFloats) * sizeof(float)));
  }
  for (const TensorRef& t : tensors) {
    if (host != nullptr) {
      if (int64_t(t.host->size()) != t.count) {
        return absl::InvalidArgumentError(absl::StrCat("cuda backend: weight tag ", t.tag, " has ",
                                                       t.host->size(), " elements, expected ",
                                                       t.count));
      }
      if (t.is_norm) {
        LAZYRAG_RETURN_IF_CUDA_ERROR(
            cudaMemcpyAsync(t.ptr, t.host->data(), t.count * f32, cudaMemcpyHostToDevice, stream_));
        continue;
      }
      for (int64_t off = 0; off < t.count; off += kUploadChunkFloats) {
        const int64_t n = std::min(kUploadChunkFloats, t.count - off);
        // Pageable source: returns once the source is staged; the conversion below is
        // ordered after the copy on the stream, the next copy after the conversion.
        LAZYRAG_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(staging.data(), t.host->data() + off, n * f32,
                                                     cudaMemcpyHostToDevice, stream_));
        RETURN_IF_ERROR(cuda_model::LaunchFloatToBf16(reinterpret_cast<float*>(staging.data()),
                                                      static_cast<uint16_t*>(t.ptr) + off, n,
                                                      stream_));
      }
      continue;
    }
    if (t.is_norm) {
      // Norm weights (a few KB) come from the loader's own host function, so they are the
      // loader's values bit for bit whatever the compilers contract.
      std::vector<float> v(t.count);
      for (int64_t i = 0; i < t.count; ++i) v[i] = SyntheticNormWeight(model.seed, t.tag, i);
      LAZYRAG_RETURN_IF_CUDA_ERROR(
          cudaMemcpy(t.ptr, v.data(), t.count * f32, cudaMemcpyHostToDevice));
      continue;
    }
    cuda_model::SyntheticFillParams p;
    p.dst = static_cast<uint16_t*>(t.ptr);
    p.n = t.count;
    p.seed = model.seed;
    p.tag = t.tag;
    p.bound = t.fan_in > 0 ? SyntheticLinearBound(uint32_t(t.fan_in)) : 0.0f;
    p.first = t.first;
    p.cols = t.cols;
    p.global_cols = t.global_cols;
    RETURN_IF_ERROR(cuda_model::LaunchSyntheticFill(p, stream_));
  }
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> CudaBackend::ReadWeight(uint32_t tag, int64_t offset,
                                                           int64_t count) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(SetDevice());
  for (const TensorRef& t : Tensors(nullptr)) {
    if (t.tag != tag) continue;
    if (offset < 0 || count < 0 || offset + count > t.count) {
      return absl::InvalidArgumentError("read weight: range outside the tensor");
    }
    std::vector<float> out(count);
    if (count == 0) return out;
    if (t.is_norm) {
      LAZYRAG_RETURN_IF_CUDA_ERROR(cudaMemcpy(out.data(), static_cast<float*>(t.ptr) + offset,
                                              count * sizeof(float), cudaMemcpyDeviceToHost));
      return out;
    }
    DeviceBuffer tmp;
    RETURN_IF_ERROR(tmp.Allocate(count * sizeof(float)));
    RETURN_IF_ERROR(cuda_model::LaunchBf16ToFloat(static_cast<uint16_t*>(t.ptr) + offset,
                                                  reinterpret_cast<float*>(tmp.data()), count,
                                                  stream_));
    LAZYRAG_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(out.data(), tmp.data(), count * sizeof(float),
                                                 cudaMemcpyDeviceToHost, stream_));
    LAZYRAG_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_));
    return out;
  }
  return absl::InvalidArgumentError(absl::StrCat("read weight: no tensor with tag ", tag));
}

absl::Status CudaBackend::InitPool(int num_pages, int page_size) {
  absl::MutexLock lock(&mu_);
  if (num_pages <= 0 || page_size <= 0 || page_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv pool: bad shape ", num_pages, " pages x ", page_size, " tokens"));
  }
  RETURN_IF_ERROR(SetDevice());
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_));
  ClearGraphs();  // they address the old pool
  num_pages_ = 0;
  pool_.Release();
  const int64_t kv_elems = int64_t(num_pages) * page_size * config_.kv_dim();
  const size_t bytes = size_t(2) * config_.num_layers * kv_elems * sizeof(uint16_t);
  if (auto st = pool_.Allocate(bytes); !st.ok()) {
    return absl::Status(st.code(),
                        absl::StrCat("kv pool: ", bytes / double(1 << 30), " GiB: ", st.message()));
  }
  // Zeroed so that masked page tails never hold NaN patterns.
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(pool_.data(), 0, bytes, stream_));
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_));
  pool_k_ = reinterpret_cast<uint16_t*>(pool_.data());
  kv_elems_ = kv_elems;
  layer_stride_ = 2 * kv_elems;
  num_pages_ = num_pages;
  page_size_ = page_size;
  return absl::OkStatus();
}

absl::Status CudaBackend::CheckRun(const std::vector<int32_t>& pages, int64_t num_tokens) const {
  if (num_pages_ == 0) return absl::FailedPreconditionError("kv run: KV pool not initialised");
  if (num_tokens < 0 || int64_t(pages.size()) * page_size_ < num_tokens) {
    return absl::InvalidArgumentError("kv run: more tokens than pages hold");
  }
  for (int32_t p : pages) {
    if (p < 0 || p >= num_pages_) {
      return absl::InvalidArgumentError(absl::StrCat("kv run: page ", p, " out of range"));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::CheckBatch(const ForwardBatch& b) const {
  if (num_pages_ == 0) return absl::FailedPreconditionError("forward: KV pool not initialised");
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
  if (v.page_size != page_size_) return absl::InvalidArgumentError("forward: page size mismatch");
  for (int32_t t : b.tokens) {
    if (t < 0 || t >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("forward: token id ", t, " out of range"));
    }
  }
  for (int64_t s : b.kv_slot) {
    if (s < 0 || s >= int64_t(num_pages_) * page_size_) {
      return absl::InvalidArgumentError("forward: kv slot out of range");
    }
  }
  for (int32_t p : v.page_indices) {
    if (p < 0 || p >= num_pages_) return absl::InvalidArgumentError("forward: page out of range");
  }
  for (int64_t s = 0; s < S; ++s) {
    const int64_t pages = v.page_indptr[s + 1] - v.page_indptr[s];
    if (v.seg_len[s] < 0 || v.seg_len[s] > pages * page_size_) {
      return absl::InvalidArgumentError("forward: segment longer than its pages");
    }
  }
  for (int32_t r : b.logit_rows) {
    if (r < 0 || r >= T) return absl::InvalidArgumentError("forward: logit row out of range");
  }
  return absl::OkStatus();
}

absl::StatusOr<char*> CudaBackend::Upload(const UploadPlan& plan) {
  const size_t bytes = plan.bytes();
  // The previous upload must have left the pinned buffer before it is rewritten.
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaEventSynchronize(upload_done_));
  RETURN_IF_ERROR(upload_host_.Reserve(bytes));
  if (bytes > upload_device_.size()) ClearGraphs();  // they read the buffer that moves now
  RETURN_IF_ERROR(upload_device_.Reserve(bytes));
  plan.CopyTo(upload_host_.data());
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(upload_device_.data(), upload_host_.data(), bytes,
                                               cudaMemcpyHostToDevice, stream_));
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaEventRecord(upload_done_, stream_));
  return upload_device_.data();
}

absl::Status CudaBackend::ReserveActivations(int tokens, int rows) {
  if (tokens <= act_tokens_ && rows <= act_rows_) return absl::OkStatus();
  ClearGraphs();  // they address the old activations
  const int T = std::max(act_tokens_, (tokens + 63) / 64 * 64);
  const int R = std::max(act_rows_, (rows + 7) / 8 * 8);
  const ModelConfig& c = config_;
  const size_t d = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(), ff = c.intermediate_size;
  size_t bytes = 0;
  auto region = [&](size_t n) {
    const size_t off = bytes;
    bytes = AlignUp(bytes + n);
    return off;
  };
  const size_t ox = region(T * d * 4), oh = region(T * d * 2),
               oqkv = region(T * (qd + 2 * kvd) * 4), oq = region(T * qd * 2),
               oattn = region(T * qd * 2), odelta = region(T * d * 2), ogu = region(T * 2 * ff * 2),
               oact = region(T * ff * 2), orope = region(T * size_t(c.head_dim) * 4),
               ohr = region(R * d * 2), olog = region(R * size_t(c.vocab_size) * 4);
  act_tokens_ = act_rows_ = 0;
  RETURN_IF_ERROR(activations_.Allocate(bytes));
  char* base = activations_.data();
  x_ = reinterpret_cast<float*>(base + ox);
  h_ = reinterpret_cast<uint16_t*>(base + oh);
  qkv_ = reinterpret_cast<float*>(base + oqkv);
  q_ = reinterpret_cast<uint16_t*>(base + oq);
  attn_ = reinterpret_cast<uint16_t*>(base + oattn);
  delta_ = reinterpret_cast<uint16_t*>(base + odelta);
  gate_up_ = reinterpret_cast<uint16_t*>(base + ogu);
  act_ = reinterpret_cast<uint16_t*>(base + oact);
  rope_ = reinterpret_cast<float*>(base + orope);
  h_rows_ = reinterpret_cast<uint16_t*>(base + ohr);
  logits_ = reinterpret_cast<float*>(base + olog);
  act_tokens_ = T;
  act_rows_ = R;
  return absl::OkStatus();
}

absl::Status CudaBackend::Gemm(const uint16_t* x, const uint16_t* w, void* y, cudaDataType y_type,
                               int rows, int n, int k) {
  if (rows == 0) return absl::OkStatus();
  const float alpha = 1.0f, beta = 0.0f;
  // Column-major view: y^T[n, rows] = w[n, k] (stored as k x n, transposed) * x^T[k, rows].
  LAZYRAG_RETURN_IF_CUBLAS_ERROR(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, &alpha,
                                              w, CUDA_R_16BF, k, x, CUDA_R_16BF, k, &beta, y,
                                              y_type, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

absl::Status CudaBackend::ForwardImpl(const ForwardBatch& batch, std::vector<float>* logits,
                                      std::vector<int32_t>* ids) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(SetDevice());
  RETURN_IF_ERROR(CheckBatch(batch));
  const ModelConfig& c = config_;
  const int T = int(batch.tokens.size());
  const int R = int(batch.logit_rows.size());
  if (logits != nullptr) logits->clear();
  if (ids != nullptr) ids->clear();
  if (T == 0) return absl::OkStatus();
  using Clock = std::chrono::steady_clock;
  const auto t_entry = Clock::now();
  if (step_begin_ != nullptr) LAZYRAG_RETURN_IF_CUDA_ERROR(cudaEventRecord(step_begin_, stream_));
  const SegmentViewHost& v = batch.view;
  const int B = v.num_requests();

  // Host planning: grid bounds for the attention kernels, decode or prefill.
  int max_q_len = 1, max_kv_len = 0;
  bool decode = B > 0;
  std::vector<int32_t> row_request;
  if (!tensor_core_attention_) row_request.resize(T);
  for (int b = 0; b < B; ++b) {
    const int rows = v.q_indptr[b + 1] - v.q_indptr[b];
    max_q_len = std::max(max_q_len, rows);
    decode = decode && rows == 1;
    int64_t kv = 0;
    for (int s = v.seg_indptr[b]; s < v.seg_indptr[b + 1]; ++s) kv += v.seg_len[s];
    max_kv_len = int(std::max<int64_t>(max_kv_len, kv));
    if (!tensor_core_attention_) {
      std::fill(row_request.begin() + v.q_indptr[b], row_request.begin() + v.q_indptr[b + 1], b);
    }
  }

  // Page indices go last: the offsets of everything else depend only on (T, B, S, R), which
  // the graph key holds.
  UploadPlan plan;
  const size_t o_tokens = plan.Add(batch.tokens), o_kv_pos = plan.Add(batch.kv_pos),
               o_kv_slot = plan.Add(batch.kv_slot), o_q_indptr = plan.Add(v.q_indptr),
               o_q_pos = plan.Add(v.q_pos), o_seg_indptr = plan.Add(v.seg_indptr),
               o_seg_start = plan.Add(v.seg_start), o_seg_len = plan.Add(v.seg_len),
               o_page_indptr = plan.Add(v.page_indptr), o_rows = plan.Add(batch.logit_rows),
               o_row_request = plan.Add(row_request), o_page_indices = plan.Add(v.page_indices);
  RETURN_IF_ERROR(ReserveActivations(T, R));
  ASSIGN_OR_RETURN(char* dev, Upload(plan));
  auto i32 = [&](size_t off) { return reinterpret_cast<const int32_t*>(dev + off); };

  Step step;
  step.tokens = i32(o_tokens);
  step.kv_pos = i32(o_kv_pos);
  step.kv_slot = reinterpret_cast<const int64_t*>(dev + o_kv_slot);
  step.logit_rows = i32(o_rows);
  step.row_request = i32(o_row_request);
  SegmentView& view = step.view;
  view.num_requests = B;
  view.num_q = T;
  view.page_size = page_size_;
  view.q_indptr = i32(o_q_indptr);
  view.q_pos = i32(o_q_pos);
  view.seg_indptr = i32(o_seg_indptr);
  view.seg_start = i32(o_seg_start);
  view.seg_len = i32(o_seg_len);
  view.page_indptr = i32(o_page_indptr);
  view.page_indices = i32(o_page_indices);
  step.tokens_n = T;
  step.rows_n = R;
  step.max_q_len = max_q_len;
  step.max_kv_len = max_kv_len;
  step.decode = decode;
  const auto t_queue = Clock::now();
  const size_t graphs_before = graph_replays_;
  RETURN_IF_ERROR(RunStep(step, int(v.seg_start.size())));
  // No logits: no sync (the next call queues behind this one). A pending delta_ needs no
  // applying: the residual stream does not outlive the call, the KV pool is written.
  if (R == 0) return absl::OkStatus();
  if (ids != nullptr) {
    RETURN_IF_ERROR(argmax_device_.Reserve(size_t(R) * sizeof(int32_t)));
    RETURN_IF_ERROR(argmax_host_.Reserve(size_t(R) * sizeof(int32_t)));
    cuda_model::ArgmaxRowsParams am;
    am.logits = logits_;
    am.ids = reinterpret_cast<int32_t*>(argmax_device_.data());
    am.num_rows = R;
    am.vocab = c.vocab_size;
    RETURN_IF_ERROR(cuda_model::LaunchArgmaxRows(am, stream_));
    LAZYRAG_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(argmax_host_.data(), am.ids,
                                                 size_t(R) * sizeof(int32_t),
                                                 cudaMemcpyDeviceToHost, stream_));
  } else {
    const size_t logit_bytes = size_t(R) * c.vocab_size * sizeof(float);
    RETURN_IF_ERROR(logits_host_.Reserve(logit_bytes));
    LAZYRAG_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(logits_host_.data(), logits_, logit_bytes,
                                                 cudaMemcpyDeviceToHost, stream_));
  }
  if (step_end_ != nullptr) LAZYRAG_RETURN_IF_CUDA_ERROR(cudaEventRecord(step_end_, stream_));
  const auto t_wait = Clock::now();
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_));
  const auto t_copy = Clock::now();
  if (ids != nullptr) {
    const int32_t* host = reinterpret_cast<const int32_t*>(argmax_host_.data());
    ids->assign(host, host + R);
  } else {
    const float* host = reinterpret_cast<const float*>(logits_host_.data());
    logits->assign(host, host + size_t(R) * c.vocab_size);
  }
  if (step_end_ != nullptr) {
    const auto ms = [](Clock::time_point a, Clock::time_point b) {
      return std::chrono::duration<double, std::milli>(b - a).count();
    };
    CudaStepTiming t;
    t.tokens = T;
    t.graph = graph_replays_ != graphs_before;
    t.plan_ms = ms(t_entry, t_queue);
    t.queue_ms = ms(t_queue, t_wait);
    t.wait_ms = ms(t_wait, t_copy);
    t.copy_ms = ms(t_copy, Clock::now());
    float gpu = 0;
    LAZYRAG_RETURN_IF_CUDA_ERROR(cudaEventElapsedTime(&gpu, step_begin_, step_end_));
    t.gpu_ms = gpu;
    if (step_timings_.size() < 1024) step_timings_.push_back(t);
  }
  return absl::OkStatus();
}

std::vector<CudaStepTiming> CudaBackend::TakeStepTimings() {
  absl::MutexLock lock(&mu_);
  std::vector<CudaStepTiming> out;
  out.swap(step_timings_);
  return out;
}

absl::Status CudaBackend::EnqueueStep(const Step& s) {
  const ModelConfig& c = config_;
  const int T = s.tokens_n, R = s.rows_n;
  const SegmentView& view = s.view;
  const int max_q_len = s.max_q_len, max_kv_len = s.max_kv_len;
  const bool decode = s.decode;
  const float* inv_freq = reinterpret_cast<const float*>(inv_freq_.data());
  const int d = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(), ff = c.intermediate_size;
  RETURN_IF_ERROR(
      cuda_model::LaunchRopeTable({s.kv_pos, inv_freq, rope_, T, c.head_dim / 2}, stream_));
  // Residual add: the O and down projections write bf16 into delta_ and the next RMSNorm adds
  // it to the fp32 residual x_ (measured faster than cuBLAS's fp32 beta = 1 outputs; see
  // bench/README.md). Tensor parallelism: every rank holds the same residual; the bf16 partials
  // in delta_ are summed over the ranks and every rank's next RMSNorm adds them to its own x_.
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeightsDevice& L = layers_[l];
    cuda_model::RmsNormParams norm;
    norm.weight = L.attn_norm;
    norm.out = h_;
    norm.num_rows = T;
    norm.dim = d;
    norm.eps = c.rms_norm_eps;
    norm.x_out = x_;
    if (l == 0) {  // embedding gather fused into the first norm
      norm.embedding = embedding_;
      norm.tokens = s.tokens;
    } else {
      norm.x = x_;
      norm.residual = delta_;
    }
    RETURN_IF_ERROR(cuda_model::LaunchRmsNorm(norm, stream_));
    RETURN_IF_ERROR(Gemm(h_, L.wqkv, qkv_, CUDA_R_32F, T, qd + 2 * kvd, d));
    cuda_model::QkvScatterParams scatter;
    scatter.qkv = qkv_;
    scatter.rope = rope_;
    scatter.kv_slot = s.kv_slot;
    scatter.q = q_;
    scatter.k_cache = LayerK(l);
    scatter.v_cache = LayerV(l);
    scatter.num_tokens = T;
    scatter.num_heads = c.num_heads;
    scatter.num_kv_heads = c.num_kv_heads;
    scatter.head_dim = c.head_dim;
    RETURN_IF_ERROR(cuda_model::LaunchQkvScatter(scatter, stream_));
    if (tensor_core_attention_) {
      kernels::LazyAttentionParams ap;
      ap.shape = shape_;
      ap.q = q_;
      ap.k_cache = LayerK(l);
      ap.v_cache = LayerV(l);
      ap.out = attn_;
      ap.inv_freq = inv_freq;
      ap.view = view;
      ap.max_q_len = max_q_len;
      ap.max_kv_len = max_kv_len;
      ap.workspace = attention_workspace_.data();
      ap.workspace_bytes = attention_workspace_.size();
      ap.num_pages = num_pages_;  // lets the prefill gather pages with the TMA
      // Keys below a request's query positions were written by earlier steps, Materialize or
      // page uploads, all finished before this step's first kernel; only the QKV scatter just
      // before writes (the step's own rows).
      ap.stable_history = options_.early_kv_reads;
      RETURN_IF_ERROR(decode ? kernels::LazyAttentionDecode(ap, stream_)
                             : kernels::LazyAttentionPrefill(ap, stream_));
    } else {
      cuda_model::FallbackAttentionParams ap;
      ap.num_heads = c.num_heads;
      ap.num_kv_heads = c.num_kv_heads;
      ap.head_dim = c.head_dim;
      ap.scale = shape_.scale;
      ap.q = q_;
      ap.k_cache = LayerK(l);
      ap.v_cache = LayerV(l);
      ap.out = attn_;
      ap.inv_freq = inv_freq;
      ap.row_request = s.row_request;
      ap.view = view;
      RETURN_IF_ERROR(cuda_model::LaunchFallbackAttention(ap, stream_));
    }
    RETURN_IF_ERROR(Gemm(attn_, L.wo, delta_, CUDA_R_16BF, T, d, qd));
    RETURN_IF_ERROR(AllReduce(delta_, int64_t(T) * d));
    cuda_model::RmsNormParams ffn_norm;
    ffn_norm.x = x_;
    ffn_norm.x_out = x_;
    ffn_norm.residual = delta_;
    ffn_norm.weight = L.ffn_norm;
    ffn_norm.out = h_;
    ffn_norm.num_rows = T;
    ffn_norm.dim = d;
    ffn_norm.eps = c.rms_norm_eps;
    RETURN_IF_ERROR(cuda_model::LaunchRmsNorm(ffn_norm, stream_));
    RETURN_IF_ERROR(Gemm(h_, L.w_gate_up, gate_up_, CUDA_R_16BF, T, 2 * ff, d));
    RETURN_IF_ERROR(cuda_model::LaunchSwiGlu({gate_up_, act_, T, ff}, stream_));
    RETURN_IF_ERROR(Gemm(act_, L.w_down, delta_, CUDA_R_16BF, T, d, ff));
    RETURN_IF_ERROR(AllReduce(delta_, int64_t(T) * d));
  }
  if (R == 0) return absl::OkStatus();
  cuda_model::RmsNormParams final_norm;
  final_norm.x = x_;
  final_norm.rows = s.logit_rows;
  final_norm.residual = delta_;
  final_norm.weight = final_norm_;
  final_norm.out = h_rows_;
  final_norm.num_rows = R;
  final_norm.dim = d;
  final_norm.eps = c.rms_norm_eps;
  RETURN_IF_ERROR(cuda_model::LaunchRmsNorm(final_norm, stream_));
  RETURN_IF_ERROR(Gemm(h_rows_, lm_head_, logits_, CUDA_R_32F, R, c.vocab_size, d));
  return absl::OkStatus();
}

absl::Status CudaBackend::RunStep(const Step& s, int num_segments) {
  // Small steps (decode and short query blocks, where ~12 launches per layer can cost more
  // than the kernels) on one rank (a TP rank's graph would hold NCCL calls that every rank must
  // replay in step) with tensor-core attention: graph candidates. Their KV bound is rounded up
  // so that a decode batch keeps one shape for kGraphKvBucket steps; a larger bound only adds
  // splits that find no keys (the kernels mask by each request's own length). The rounding is
  // applied with graphs off too, so that a replay computes exactly what the eager step does.
  const bool small = !tensor_parallel() && tensor_core_attention_ &&
                     s.tokens_n <= options_.graph_max_tokens;
  if (!small) return EnqueueStep(s);
  constexpr int kGraphKvBucket = 256;
  Step g = s;
  g.max_kv_len = (s.max_kv_len + kGraphKvBucket - 1) / kGraphKvBucket * kGraphKvBucket;
  if (!options_.cuda_graphs) return EnqueueStep(g);
  const GraphKey key = {g.tokens_n, g.rows_n, g.view.num_requests, num_segments, g.max_q_len,
                        g.max_kv_len, g.decode ? 1 : 0};
  ++graph_clock_;
  if (auto it = graphs_.find(key); it != graphs_.end()) {
    it->second.last_use = graph_clock_;
    ++graph_replays_;
    LAZYRAG_RETURN_IF_CUDA_ERROR(cudaGraphLaunch(it->second.exec, stream_));
    return absl::OkStatus();
  }
  // Capture on the second sighting: a shape seen once (say, one request's prompt) is not worth
  // the ~1 ms an instantiation costs.
  if (graph_sightings_.size() > 4096) graph_sightings_.clear();
  if (++graph_sightings_[key] < 2) return EnqueueStep(g);
  graph_sightings_.erase(key);
  if (graphs_.size() >= size_t(std::max(1, options_.max_graphs))) {
    auto lru = graphs_.begin();
    for (auto it = graphs_.begin(); it != graphs_.end(); ++it) {
      if (it->second.last_use < lru->second.last_use) lru = it;
    }
    LAZYRAG_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_));
    cudaGraphExecDestroy(lru->second.exec);
    graphs_.erase(lru);
  }
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  absl::Status queued = EnqueueStep(g);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
  cudaGraphExec_t exec = nullptr;
  cudaError_t inst = cudaErrorUnknown;
  if (queued.ok() && end == cudaSuccess && graph != nullptr) {
    inst = cudaGraphInstantiate(&exec, graph, 0);
  }
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (!queued.ok() || end != cudaSuccess || inst != cudaSuccess) {
    // Nothing ran while capturing: run the step eagerly, and never capture this shape again
    // (a sighting count that cannot reach 2).
    (void)cudaGetLastError();
    graph_sightings_[key] = std::numeric_limits<int>::min();
    LOG_WARNING << "cuda backend: no CUDA graph for a step of " << s.tokens_n << " tokens ("
                << (queued.ok() ? cudaGetErrorString(end != cudaSuccess ? end : inst)
                                : queued.ToString())
                << "); running it without";
    return EnqueueStep(g);
  }
  graphs_[key] = {exec, graph_clock_};
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaGraphLaunch(exec, stream_));
  return absl::OkStatus();
}

void CudaBackend::ClearGraphs() {
  if (graphs_.empty()) return;
  cudaStreamSynchronize(stream_);  // no launch of them may still be queued
  for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
  graph_sightings_.clear();
}

absl::Status CudaBackend::Materialize(const std::vector<MaterializeCopy>& copies) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(SetDevice());
  for (const MaterializeCopy& m : copies) {
    if (m.len < 0 || m.dst_offset < 0) {
      return absl::InvalidArgumentError("materialize: negative length or offset");
    }
    RETURN_IF_ERROR(CheckRun(m.src_pages, m.len));
    RETURN_IF_ERROR(CheckRun(m.dst_pages, int64_t(m.dst_offset) + m.len));
  }
  if (copies.empty()) return absl::OkStatus();
  const int n = int(copies.size());
  std::vector<int32_t> src_indptr{0}, src_pages, dst_indptr{0}, dst_pages, len, dst_offset, delta;
  int max_len = 0;
  for (const MaterializeCopy& m : copies) {
    src_pages.insert(src_pages.end(), m.src_pages.begin(), m.src_pages.end());
    src_indptr.push_back(int32_t(src_pages.size()));
    dst_pages.insert(dst_pages.end(), m.dst_pages.begin(), m.dst_pages.end());
    dst_indptr.push_back(int32_t(dst_pages.size()));
    len.push_back(m.len);
    dst_offset.push_back(m.dst_offset);
    delta.push_back(m.delta);
    max_len = std::max(max_len, m.len);
  }
  UploadPlan plan;
  const size_t o_si = plan.Add(src_indptr), o_sp = plan.Add(src_pages), o_di = plan.Add(dst_indptr),
               o_dp = plan.Add(dst_pages), o_len = plan.Add(len), o_off = plan.Add(dst_offset),
               o_delta = plan.Add(delta);
  ASSIGN_OR_RETURN(char* dev, Upload(plan));
  auto i32 = [&](size_t off) { return reinterpret_cast<const int32_t*>(dev + off); };
  const float* inv_freq = reinterpret_cast<const float*>(inv_freq_.data());
  kernels::MaterializeParams p;
  p.k_cache = pool_k_;
  p.v_cache = pool_k_ + kv_elems_;
  p.layer_stride = layer_stride_;
  p.num_layers = config_.num_layers;
  p.page_size = page_size_;
  p.num_kv_heads = config_.num_kv_heads;
  p.head_dim = config_.head_dim;
  p.inv_freq = inv_freq;
  p.num_copies = n;
  p.src_page_indptr = i32(o_si);
  p.src_pages = i32(o_sp);
  p.dst_page_indptr = i32(o_di);
  p.dst_pages = i32(o_dp);
  p.len = i32(o_len);
  p.dst_offset = i32(o_off);
  p.delta = i32(o_delta);
  p.max_len = max_len;
  if (tensor_core_attention_) return kernels::Materialize(p, stream_);
  return cuda_model::LaunchFallbackMaterialize(p, stream_);
}

cuda_model::KvTransportParams CudaBackend::TransportParams(const int32_t* pages, int num_tokens,
                                                           uint16_t* buffer, bool to_buffer) const {
  cuda_model::KvTransportParams p;
  p.pool = pool_k_;
  p.layer_stride = layer_stride_;
  p.v_offset = kv_elems_;
  p.num_layers = config_.num_layers;
  p.page_size = page_size_;
  p.kv_dim = config_.kv_dim();
  p.pages = pages;
  p.num_tokens = num_tokens;
  p.buffer = buffer;
  p.to_buffer = to_buffer;
  return p;
}

absl::Status CudaBackend::ExportKv(const std::vector<int32_t>& pages, int num_tokens,
                                   std::string* out) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(SetDevice());
  RETURN_IF_ERROR(CheckRun(pages, num_tokens));
  const size_t bytes =
      size_t(2) * config_.num_layers * num_tokens * config_.kv_dim() * sizeof(uint16_t);
  out->resize(bytes);
  if (bytes == 0) return absl::OkStatus();
  UploadPlan plan;
  const size_t o_pages = plan.Add(pages);
  ASSIGN_OR_RETURN(char* dev, Upload(plan));
  DeviceBuffer staging;
  RETURN_IF_ERROR(staging.Allocate(bytes));
  RETURN_IF_ERROR(cuda_model::LaunchKvTransport(
      TransportParams(reinterpret_cast<const int32_t*>(dev + o_pages), num_tokens,
                      reinterpret_cast<uint16_t*>(staging.data()), /*to_buffer=*/true),
      stream_));
  LAZYRAG_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(out->data(), staging.data(), bytes, cudaMemcpyDeviceToHost, stream_));
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::ImportKv(const std::vector<int32_t>& pages, int num_tokens,
                                   std::string_view data) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(SetDevice());
  RETURN_IF_ERROR(CheckRun(pages, num_tokens));
  const size_t bytes =
      size_t(2) * config_.num_layers * num_tokens * config_.kv_dim() * sizeof(uint16_t);
  if (data.size() != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv import: payload is ", data.size(), " bytes, expected ", bytes));
  }
  if (bytes == 0) return absl::OkStatus();
  UploadPlan plan;
  const size_t o_pages = plan.Add(pages);
  ASSIGN_OR_RETURN(char* dev, Upload(plan));
  DeviceBuffer staging;
  RETURN_IF_ERROR(staging.Allocate(bytes));
  LAZYRAG_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(staging.data(), data.data(), bytes, cudaMemcpyHostToDevice, stream_));
  RETURN_IF_ERROR(cuda_model::LaunchKvTransport(
      TransportParams(reinterpret_cast<const int32_t*>(dev + o_pages), num_tokens,
                      reinterpret_cast<uint16_t*>(staging.data()), /*to_buffer=*/false),
      stream_));
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::StatusOr<PeerPoolHandle> CudaBackend::ExportPoolHandle() {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(SetDevice());
  if (num_pages_ == 0) return absl::FailedPreconditionError("kv pool not initialised");
  if (tensor_parallel()) {
    // A rank holds a slice of every page: a peer could not copy whole pages from one pool.
    return absl::FailedPreconditionError("cuda backend: no pool lending with tensor parallelism");
  }
  PeerPoolHandle h;
  ASSIGN_OR_RETURN(h.ipc_handle, peer_copy::PoolIpcHandle(pool_.data()));
  cudaDeviceProp prop;
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaGetDeviceProperties(&prop, options_.device));
  h.device_uuid.assign(prop.uuid.bytes, sizeof(prop.uuid.bytes));
  const peer_copy::PoolLayout l = PoolLayoutOf();
  h.num_layers = l.num_layers;
  h.num_pages = l.num_pages;
  h.page_size = l.page_size;
  h.kv_dim = l.kv_dim;
  h.elem_bytes = l.elem_bytes;
  return h;
}

absl::Status CudaBackend::CopyPagesFromPeer(const PeerPoolHandle& peer,
                                            const std::vector<int32_t>& peer_pages,
                                            const std::vector<int32_t>& own_pages) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(SetDevice());
  if (num_pages_ == 0) return absl::FailedPreconditionError("kv pool not initialised");
  peer_copy::PoolLayout src;
  src.num_layers = peer.num_layers;
  src.num_pages = peer.num_pages;
  src.page_size = peer.page_size;
  src.kv_dim = peer.kv_dim;
  src.elem_bytes = peer.elem_bytes;
  const peer_copy::PoolLayout dst = PoolLayoutOf();
  RETURN_IF_ERROR(peer_copy::CheckPageCopy(src, dst, peer_pages, own_pages));
  if (peer_pages.empty()) return absl::OkStatus();
  auto it = peer_pools_.find(peer.ipc_handle);
  if (it == peer_pools_.end()) {
    // Maps the peer's whole pool once; peer access between the two GPUs is enabled by the
    // driver (cudaIpcMemLazyEnablePeerAccess). Same GPU: a plain device mapping.
    auto mapped = peer_copy::OpenPoolIpcHandle(peer.ipc_handle);
    if (!mapped.ok()) {
      // Not sticky, but recorded as the last error: clear it, or the next launch check of a
      // forward step would report it (the engine falls back to bytes and carries on).
      (void)cudaGetLastError();
      return mapped.status();
    }
    it = peer_pools_.emplace(peer.ipc_handle, *mapped).first;
  }
  UploadPlan plan;
  const size_t o_src = plan.Add(peer_pages);
  const size_t o_dst = plan.Add(own_pages);
  ASSIGN_OR_RETURN(char* dev, Upload(plan));
  peer_copy::PageGatherParams p;
  p.src_pool = it->second;
  p.dst_pool = pool_.data();
  p.src = src;
  p.dst = dst;
  p.src_pages = reinterpret_cast<const int32_t*>(dev + o_src);
  p.dst_pages = reinterpret_cast<const int32_t*>(dev + o_dst);
  p.num_pages = int(peer_pages.size());
  // Pull: this GPU's SMs read the peer's pages over NVLink (bench/peer_transfer_bench measures
  // pull, push and the copy engines).
  RETURN_IF_ERROR(peer_copy::LaunchPageGather(p, stream_));
  // Complete before returning: the caller then lets the peer unpin (release its lease).
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::AllReduce(uint16_t* data, int64_t count) {
  if (!tensor_parallel() || count == 0) return absl::OkStatus();
#ifdef LAZYRAG_HAVE_NCCL
  LAZYRAG_RETURN_IF_NCCL_ERROR(ncclAllReduce(data, data, size_t(count), ncclBfloat16, ncclSum,
                                             static_cast<ncclComm_t>(options_.nccl_comm), stream_));
  return absl::OkStatus();
#else
  (void)data;
  return absl::UnimplementedError("cuda backend: built without NCCL (no tensor parallelism)");
#endif
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const LoadedModel& model,
                                                           const CudaBackendOptions& options) {
  absl::StatusOr<ModelConfig> config = ShardConfig(model.config, options.shard);
  absl::Status st = config.status();
  if (st.ok() && options.shard.size > 1 && options.nccl_comm == nullptr) {
    st = absl::InvalidArgumentError("cuda backend: tensor parallel rank without an NCCL comm");
  }
#ifndef LAZYRAG_HAVE_NCCL
  if (st.ok() && options.shard.size > 1) {
    st = absl::UnimplementedError("cuda backend: built without NCCL (no tensor parallelism)");
  }
#endif
  if (!st.ok()) {
#ifdef LAZYRAG_HAVE_NCCL
    if (options.nccl_comm != nullptr) ncclCommDestroy(static_cast<ncclComm_t>(options.nccl_comm));
#endif
    return st;
  }
  // From here the backend owns the comm.
  auto backend = std::make_unique<CudaBackend>(*config, options);
  RETURN_IF_ERROR(backend->Init(model));
  return std::unique_ptr<Backend>(std::move(backend));
}

bool CudaBackendHasNccl() {
#ifdef LAZYRAG_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaTensorParallelBackend(
    const LoadedModel& model, int tensor_parallel, const CudaBackendOptions& options) {
  RETURN_IF_ERROR(model.config.Validate());
  RETURN_IF_ERROR(CheckShardable(model.config, {tensor_parallel, 0}));
  const int n = tensor_parallel;
  std::vector<std::unique_ptr<Backend>> ranks(n);
  if (n == 1) {
    CudaBackendOptions o = options;
    o.shard = {};
    o.nccl_comm = nullptr;
    ASSIGN_OR_RETURN(ranks[0], CreateCudaBackend(model, o));
    return CreateTensorParallelBackend(model.config, std::move(ranks));
  }
#ifndef LAZYRAG_HAVE_NCCL
  return absl::UnimplementedError(absl::StrCat("cuda backend: tensor parallelism over ", n,
                                               " GPUs needs NCCL, not found at build time"));
#else
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  if (options.device < 0 || options.device + n > count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda backend: tensor parallelism over ", n, " GPUs from device ", options.device,
        " needs devices up to ", options.device + n - 1, "; ", count, " present"));
  }
  // NVLink multicast (NVLS) off unless the user set it: setenv does not overwrite.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  std::vector<int> devices(n);
  for (int r = 0; r < n; ++r) devices[r] = options.device + r;
  std::vector<ncclComm_t> comms(n, nullptr);
  LAZYRAG_RETURN_IF_NCCL_ERROR(ncclCommInitAll(comms.data(), n, devices.data()));
  // One thread per rank: weight generation / upload on every device at once.
  std::vector<absl::Status> status(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      CudaBackendOptions o = options;
      o.device = devices[r];
      o.shard = {n, r};
      o.nccl_comm = comms[r];  // owned by the rank from here, also on failure
      auto b = CreateCudaBackend(model, o);
      if (b.ok()) {
        ranks[r] = std::move(*b);
      } else {
        status[r] = b.status();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    if (!status[r].ok()) {
      return absl::Status(status[r].code(),
                          absl::StrCat("tensor parallel rank ", r, ": ", status[r].message()));
    }
  }
  return CreateTensorParallelBackend(model.config, std::move(ranks));
#endif
}

absl::StatusOr<std::vector<CudaStepTiming>> TakeCudaStepTimings(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (cuda == nullptr) return absl::InvalidArgumentError("step timings: not a CUDA backend");
  return cuda->TakeStepTimings();
}

absl::StatusOr<std::vector<float>> ReadCudaWeight(Backend& backend, uint32_t tag, int64_t offset,
                                                  int64_t count) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (cuda == nullptr) return absl::InvalidArgumentError("read weight: not a CUDA backend");
  return cuda->ReadWeight(tag, offset, count);
}

}  // namespace lazyrag
