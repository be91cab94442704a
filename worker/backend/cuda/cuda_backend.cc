#include "worker/backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/status.h"
#include "worker/attention/rope.h"
#include "worker/backend/cuda/cuda_kv_pool.h"
#include "worker/backend/cuda/cuda_tensor_parallel.h"
#include "worker/backend/cuda/cuda_weights.h"
#include "worker/backend/cuda/device_buffers.h"
#include "worker/backend/cuda/host_transfers.h"
#include "worker/backend/cuda/projections.h"
#include "worker/backend/cuda/step_graphs.h"
#include "worker/backend/cuda/step_plan.h"
#include "worker/kernels/cuda_check.h"
#include "worker/kernels/lazy_attention.h"
#include "worker/kernels/model_kernels.h"
#include "worker/kernels/wgmma_gemm.h"

namespace lazyrag {
namespace {

using cuda_backend::CudaKvPool;
using cuda_backend::CudaWeights;
using cuda_backend::DeviceBuffer;
using cuda_backend::DeviceStep;
using cuda_backend::LayerWeightsDevice;
using cuda_backend::NcclAllReduce;
using cuda_backend::PinnedBuffer;
using cuda_backend::StagedUpload;
using cuda_backend::StepActivations;
using cuda_backend::StepGraphKey;
using cuda_backend::StepGraphs;
using cuda_backend::StepPlan;
using cuda_backend::UploadPlan;

// Steps that may run from a CUDA graph round their KV bound up to a multiple of this.
constexpr int kGraphKvBucket = 256;
// The most token rows of a step whose attention prefetches O's weights (prefetch_o_weights).
constexpr int kPrefetchOMaxRows = 64;

// The Backend: the forward pass on one stream, over the weights, the KV pool, the activation
// scratch and the step graphs it owns.
class CudaBackend final : public Backend {
 public:
  // `config` is the rank's (ShardConfig) config. Takes ownership of options.nccl_comm.
  CudaBackend(const ModelConfig& config, const CudaBackendOptions& options)
      : config_(config),
        options_(options),
        all_reduce_(options.shard.size, options.nccl_comm),
        weights_(config, options.shard),
        pool_(config),
        activations_(config),
        graphs_(options.max_graphs) {}
  ~CudaBackend() override;

  absl::Status Init(const LoadedModel& model);

  std::string name() const override { return "cuda"; }
  const ModelConfig& config() const override { return config_; }
  int num_pages() const override { return pool_.num_pages(); }
  int page_size() const override { return pool_.page_size(); }
  KvDtype kv_dtype() const override { return KvDtype::kBFloat16; }
  bool SupportsQualityViews() const override { return true; }

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
  // The host tier's path: kernels over pinned host memory on a stream of their own.
  absl::StatusOr<std::unique_ptr<HostMemory>> AllocateHostMemory(int64_t bytes) override;
  absl::StatusOr<KvTransferId> StartKvToHost(const std::vector<int32_t>& pages, int num_tokens,
                                             char* dst) override;
  absl::StatusOr<KvTransferId> StartKvFromHost(const std::vector<int32_t>& pages, int num_tokens,
                                               const char* src) override;
  absl::StatusOr<std::optional<uint64_t>> PollKvTransfer(KvTransferId id) override;
  absl::StatusOr<uint64_t> WaitKvTransfer(KvTransferId id) override;
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
  // Also clears this thread's last CUDA error: a failed cudaMalloc (say, a pool too large,
  // already reported) leaves it set, and the next launch check would report it as that launch's
  // failure; with tensor parallelism one rank would then fail before an all-reduce that the
  // others wait in.
  absl::Status SetDevice() const;
  // Copies `plan` to the device on the stream (StagedUpload); drops the step graphs first when
  // the upload buffer moves. Returns the device base address.
  absl::StatusOr<char*> Upload(const UploadPlan& plan) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Upload as the pool's UploadFn. REQUIRES: mu_ held while it is called.
  auto Uploader() {
    return [this](const UploadPlan& plan) ABSL_NO_THREAD_SAFETY_ANALYSIS { return Upload(plan); };
  }
  // Grows the activation scratch (dropping the step graphs, which address it) when needed.
  absl::Status ReserveActivations(int tokens, int rows) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues every kernel of the step, from the RoPE table to the logits in activations_.logits
  // (none when rows_n == 0), on stream_: run eagerly or captured into a CUDA graph.
  absl::Status EnqueueStep(const DeviceStep& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `s` through the step graphs when it is small enough, else eagerly. See
  // CudaBackendOptions::cuda_graphs.
  absl::Status RunStep(const DeviceStep& s, int num_segments) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const ModelConfig config_;
  const CudaBackendOptions options_;
  bool tensor_core_attention_ = false;  // head_dim 64/128 and group <= 16
  // One-token steps fold their RMSNorms and the QKV split into the GEMVs (set by Init: one rank,
  // every projection shape taken by the GEMV).
  bool one_row_norms_fold_ = false;
  AttentionShape shape_;

  absl::Mutex mu_;
  cudaStream_t stream_ = nullptr;
  NcclAllReduce all_reduce_;
  // options_.time_steps: events around each step's device work, and the recorded steps.
  cudaEvent_t step_begin_ = nullptr, step_end_ = nullptr;
  std::vector<CudaStepTiming> step_timings_ ABSL_GUARDED_BY(mu_);

  CudaWeights weights_;
  DeviceBuffer inv_freq_;  // [head_dim / 2] fp32
  cuda_backend::Projections projections_ ABSL_GUARDED_BY(mu_);
  DeviceBuffer attention_workspace_;
  CudaKvPool pool_;
  cuda_backend::HostTransfers host_ ABSL_GUARDED_BY(mu_);

  StagedUpload upload_ ABSL_GUARDED_BY(mu_);
  PinnedBuffer logits_host_ ABSL_GUARDED_BY(mu_);
  DeviceBuffer argmax_device_ ABSL_GUARDED_BY(mu_);  // ForwardArgmax's ids and partials
  PinnedBuffer argmax_host_ ABSL_GUARDED_BY(mu_);
  StepActivations activations_ ABSL_GUARDED_BY(mu_);
  // Every buffer a graph reads stays where it is until graphs_.Clear (buffer growth, a new
  // pool, destruction).
  StepGraphs graphs_ ABSL_GUARDED_BY(mu_);
};

CudaBackend::~CudaBackend() {
  all_reduce_.Destroy(options_.device, stream_);
  if (stream_ == nullptr) return;  // Init failed before touching the device
  if (cudaSetDevice(options_.device) != cudaSuccess) return;
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  graphs_.DestroyAll();
  pool_.ClosePeerPools();
  if (step_begin_ != nullptr) cudaEventDestroy(step_begin_);
  if (step_end_ != nullptr) cudaEventDestroy(step_end_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  // The members free their device and pinned memory after this body, on this device.
}

absl::Status CudaBackend::SetDevice() const {
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

absl::Status CudaBackend::Init(const LoadedModel& model) {
  const ModelConfig& c = config_;
  RETURN_IF_ERROR(c.Validate());
  if (c.head_dim > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda backend: head_dim ", c.head_dim, " above 256 is not supported"));
  }
  const int group = c.num_heads / c.num_kv_heads;
  tensor_core_attention_ = (c.head_dim == 64 || c.head_dim == 128) && group <= 16;
  one_row_norms_fold_ = !tensor_parallel() &&
                        cuda_backend::Projections::OneRowNormsFold(
                            c.hidden_size, c.q_dim(), c.kv_dim(), c.head_dim, c.intermediate_size);
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
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(upload_.Init());
    RETURN_IF_ERROR(host_.Init());
  }
  if (options_.time_steps) {
    LAZYRAG_RETURN_IF_CUDA_ERROR(cudaEventCreate(&step_begin_));
    LAZYRAG_RETURN_IF_CUDA_ERROR(cudaEventCreate(&step_end_));
  }
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(projections_.Init(stream_, options_.wgmma_gemm));
  }

  const std::vector<float> inv = RopeInvFreq(c);
  RETURN_IF_ERROR(inv_freq_.Allocate(inv.size() * sizeof(float)));
  LAZYRAG_RETURN_IF_CUDA_ERROR(
      cudaMemcpy(inv_freq_.data(), inv.data(), inv.size() * sizeof(float), cudaMemcpyHostToDevice));

  int64_t ws = options_.attention_workspace_bytes;
  if (ws <= 0) ws = kernels::LazyAttentionWorkspaceBytes(64, c.num_heads, c.head_dim);
  if (tensor_core_attention_) RETURN_IF_ERROR(attention_workspace_.Allocate(size_t(ws)));

  return weights_.Load(model, options_.synthetic_on_device, stream_);
}

absl::StatusOr<std::vector<float>> CudaBackend::ReadWeight(uint32_t tag, int64_t offset,
                                                           int64_t count) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(SetDevice());
  return weights_.Read(tag, offset, count, stream_);
}

absl::Status CudaBackend::InitPool(int num_pages, int page_size) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CudaKvPool::CheckShape(num_pages, page_size));
  RETURN_IF_ERROR(SetDevice());
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_));
  RETURN_IF_ERROR(host_.Drain());  // transfers address the old pool
  graphs_.Clear(stream_);          // they address the old pool
  return pool_.Init(num_pages, page_size, stream_);
}

absl::StatusOr<char*> CudaBackend::Upload(const UploadPlan& plan) {
  // The step graphs read the buffer that moves.
  return upload_.Upload(plan, stream_,
                        [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { graphs_.Clear(stream_); });
}

absl::Status CudaBackend::ReserveActivations(int tokens, int rows) {
  if (activations_.Fits(tokens, rows)) return absl::OkStatus();
  graphs_.Clear(stream_);  // they address the old activations
  return activations_.Reserve(tokens, rows);
}

absl::Status CudaBackend::ForwardImpl(const ForwardBatch& batch, std::vector<float>* logits,
                                      std::vector<int32_t>* ids) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(SetDevice());
  RETURN_IF_ERROR(
      cuda_backend::CheckForwardBatch(batch, config_, pool_.num_pages(), pool_.page_size()));
  const ModelConfig& c = config_;
  const int T = int(batch.tokens.size());
  const int R = int(batch.logit_rows.size());
  if (logits != nullptr) logits->clear();
  if (ids != nullptr) ids->clear();
  if (T == 0) return absl::OkStatus();
  using Clock = std::chrono::steady_clock;
  const auto t_entry = Clock::now();
  if (step_begin_ != nullptr) LAZYRAG_RETURN_IF_CUDA_ERROR(cudaEventRecord(step_begin_, stream_));

  // Host planning: grid bounds for the attention kernels, decode or prefill, and the upload.
  const StepPlan plan(batch, /*row_request=*/!tensor_core_attention_);
  RETURN_IF_ERROR(ReserveActivations(T, R));
  ASSIGN_OR_RETURN(char* dev, Upload(plan.upload()));
  const DeviceStep step = plan.At(dev, pool_.page_size());
  // New K/V rows may land in pages a to-host transfer still reads.
  RETURN_IF_ERROR(host_.OrderSlotWritesAfter(batch.kv_slot, pool_.page_size(), stream_));
  const auto t_queue = Clock::now();
  const size_t graphs_before = graphs_.replays();
  RETURN_IF_ERROR(RunStep(step, int(batch.view.seg_start.size())));
  // No logits: no sync (the next call queues behind this one). A pending delta needs no
  // applying: the residual stream does not outlive the call, the KV pool is written.
  if (R == 0) return absl::OkStatus();
  if (ids != nullptr) {
    // [ids R][partial values R x parts][partial indices R x parts], 4-byte entries.
    const size_t cells = size_t(R) * cuda_model::ArgmaxRowsParts(c.vocab_size);
    RETURN_IF_ERROR(argmax_device_.Reserve((size_t(R) + 2 * cells) * sizeof(int32_t)));
    RETURN_IF_ERROR(argmax_host_.Reserve(size_t(R) * sizeof(int32_t)));
    cuda_model::ArgmaxRowsParams am;
    am.logits = activations_.logits;
    am.ids = reinterpret_cast<int32_t*>(argmax_device_.data());
    am.partial_value = reinterpret_cast<float*>(am.ids + R);
    am.partial_index = am.ids + R + cells;
    am.num_rows = R;
    am.vocab = c.vocab_size;
    RETURN_IF_ERROR(cuda_model::LaunchArgmaxRows(am, stream_));
    LAZYRAG_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(
        argmax_host_.data(), am.ids, size_t(R) * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
  } else {
    const size_t logit_bytes = size_t(R) * c.vocab_size * sizeof(float);
    RETURN_IF_ERROR(logits_host_.Reserve(logit_bytes));
    LAZYRAG_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(logits_host_.data(), activations_.logits,
                                                 logit_bytes, cudaMemcpyDeviceToHost, stream_));
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
    t.graph = graphs_.replays() != graphs_before;
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

absl::Status CudaBackend::EnqueueStep(const DeviceStep& s) {
  const ModelConfig& c = config_;
  const int T = s.tokens_n, R = s.rows_n;
  StepActivations& a = activations_;
  const float* inv_freq = reinterpret_cast<const float*>(inv_freq_.data());
  const int d = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(), ff = c.intermediate_size;
  RETURN_IF_ERROR(
      cuda_model::LaunchRopeTable({s.kv_pos, inv_freq, a.rope, T, c.head_dim / 2}, stream_));
  // Residual add: the O and down projections write bf16 into a.delta and the next RMSNorm adds
  // it to the fp32 residual a.x (measured faster than cuBLAS's fp32 beta = 1 outputs; see
  // bench/README.md). Tensor parallelism: every rank holds the same residual; the bf16 partials
  // in a.delta are summed over the ranks and every rank's next RMSNorm adds them to its own.
  // One token on one rank: the O and down GEMVs add to a.x themselves and write the next
  // projection's input, which applies the norm's 1/rms (gemv.h, GemvResidualOut): the RMSNorm
  // kernels go but the first (embedding) and the last (logit rows); and the QKV GEMV splits its
  // outputs to q and the pool itself (GemvQkvOut): no scatter kernel.
  const bool fold = T == 1 && one_row_norms_fold_;
  // 2-64 rows with fold_ffn_norm: O (1) or LaunchResidualScale after it (2) adds to a.x and
  // writes gate|up's input, which applies the norm's 1/rms (wgmma_gemm.h, WgmmaNormIn): no FFN
  // RMSNorm kernel; with fold_attn_norm the same between down and the next layer's QKV.
  const int fold_ffn =
      options_.fold_ffn_norm != 0 && !tensor_parallel() && projections_.FoldsFfnNorm(T, d, qd, ff)
          ? options_.fold_ffn_norm
          : 0;
  const bool fold_attn = options_.fold_attn_norm && !tensor_parallel() &&
                         projections_.FoldsQkvNorm(T, qd + 2 * kvd, d);
  kernels::WgmmaNormIn rows_norm;  // the folded norm's parts, as LaunchResidualScale writes them
  rows_norm.sum_squares = a.norm_parts;
  rows_norm.parts = cuda_model::ResidualScaleParts(d);
  rows_norm.eps = c.rms_norm_eps;
  // LaunchResidualScale of the bf16 projection output in a.delta into a.x, for the norm with
  // weight `weight`: gate|up's or QKV's input in a.h, the parts rows_norm reads.
  const auto residual_scale = [&](const float* weight) {
    cuda_model::ResidualScaleParams rs;
    rs.x = a.x;
    rs.delta = a.delta;
    rs.weight = weight;
    rs.scaled = a.h;
    rs.sum_squares = a.norm_parts;
    rs.rows = T;
    rs.dim = d;
    return cuda_model::LaunchResidualScale(rs, stream_);
  };
  cuda_model::GemvNormIn norm_in;
  norm_in.sum_squares = a.norm_parts;
  norm_in.parts = cuda_model::GemvNormParts(d);
  norm_in.eps = c.rms_norm_eps;
  const auto to_residual = [&](const float* next_norm_weight) {
    cuda_model::GemvResidualOut out;
    out.residual = a.x;
    out.norm_weight = next_norm_weight;
    out.scaled = a.h;
    out.sum_squares = a.norm_parts;
    return out;
  };
  // Layer l's QKV split, as the GEMV (GemvQkvOut) or the scatter kernel does it.
  const auto qkv_split = [&](int l) {
    cuda_model::GemvQkvOut split;
    split.rope = a.rope;
    split.kv_slot = s.kv_slot;
    split.q = a.q;
    split.k_cache = pool_.LayerK(l);
    split.v_cache = pool_.LayerV(l);
    split.q_dim = qd;
    split.kv_dim = kvd;
    split.head_dim = c.head_dim;
    return split;
  };
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeightsDevice& L = weights_.layer(l);
    if (fold && l > 0) {  // the previous layer's down GEMV did this layer's attention norm
      RETURN_IF_ERROR(projections_.GemvQkv(a.h, norm_in, L.wqkv, d, qkv_split(l)));
    } else if (fold_attn && l > 0) {
      RETURN_IF_ERROR(residual_scale(L.attn_norm));
      RETURN_IF_ERROR(projections_.QkvNormed(a.h, rows_norm, L.wqkv, a.qkv, T, qd + 2 * kvd, d));
    } else {
      cuda_model::RmsNormParams norm;
      norm.weight = L.attn_norm;
      norm.out = a.h;
      norm.num_rows = T;
      norm.dim = d;
      norm.eps = c.rms_norm_eps;
      norm.x_out = a.x;
      if (l == 0) {  // embedding gather fused into the first norm
        norm.embedding = weights_.embedding();
        norm.tokens = s.tokens;
      } else {
        norm.x = a.x;
        norm.residual = a.delta;
      }
      RETURN_IF_ERROR(cuda_model::LaunchRmsNorm(norm, stream_));
      if (fold) {
        RETURN_IF_ERROR(projections_.GemvQkv(a.h, {}, L.wqkv, d, qkv_split(l)));
      } else {
        RETURN_IF_ERROR(projections_.Qkv(a.h, L.wqkv, a.qkv, T, qd + 2 * kvd, d));
      }
    }
    if (!fold) {
      const cuda_model::GemvQkvOut split = qkv_split(l);
      cuda_model::QkvScatterParams scatter;
      scatter.qkv = a.qkv;
      scatter.rope = split.rope;
      scatter.kv_slot = split.kv_slot;
      scatter.q = split.q;
      scatter.k_cache = split.k_cache;
      scatter.v_cache = split.v_cache;
      scatter.num_tokens = T;
      scatter.num_heads = c.num_heads;
      scatter.num_kv_heads = c.num_kv_heads;
      scatter.head_dim = c.head_dim;
      RETURN_IF_ERROR(cuda_model::LaunchQkvScatter(scatter, stream_));
    }
    if (tensor_core_attention_) {
      kernels::LazyAttentionParams ap;
      ap.shape = shape_;
      ap.q = a.q;
      ap.k_cache = pool_.LayerK(l);
      ap.v_cache = pool_.LayerV(l);
      ap.out = a.attn;
      ap.inv_freq = inv_freq;
      ap.view = s.view;
      ap.max_q_len = s.max_q_len;
      ap.max_kv_len = s.max_kv_len;
      ap.workspace = attention_workspace_.data();
      ap.workspace_bytes = attention_workspace_.size();
      ap.num_pages = pool_.num_pages();  // lets the prefill gather pages with the TMA
      // Keys below a request's query positions were written by earlier steps, Materialize or
      // page uploads, all finished before this step's first kernel; only the QKV scatter (or
      // the QKV GEMV's split) just before writes (the step's own rows).
      ap.stable_history = options_.early_kv_reads;
      if (options_.prefetch_o_weights != 0 && T >= 2 && T <= kPrefetchOMaxRows) {
        ap.l2_prefetch = L.wo;
        ap.l2_prefetch_bytes = int64_t(d) * qd * 2;
        ap.l2_prefetch_at_start = options_.prefetch_o_weights == 2;
        ap.kv_evict_first = true;
      }
      ap.narrow_tail_tiles = options_.narrow_tail_tiles;
      RETURN_IF_ERROR(s.decode ? kernels::LazyAttentionDecode(ap, stream_)
                               : kernels::LazyAttentionPrefill(ap, stream_));
    } else {
      cuda_model::FallbackAttentionParams ap;
      ap.num_heads = c.num_heads;
      ap.num_kv_heads = c.num_kv_heads;
      ap.head_dim = c.head_dim;
      ap.scale = shape_.scale;
      ap.q = a.q;
      ap.k_cache = pool_.LayerK(l);
      ap.v_cache = pool_.LayerV(l);
      ap.out = a.attn;
      ap.inv_freq = inv_freq;
      ap.row_request = s.row_request;
      ap.view = s.view;
      RETURN_IF_ERROR(cuda_model::LaunchFallbackAttention(ap, stream_));
    }
    if (fold) {
      RETURN_IF_ERROR(projections_.GemvToResidual(a.attn, L.wo, d, qd, to_residual(L.ffn_norm)));
      RETURN_IF_ERROR(projections_.GemvFromResidual(a.h, norm_in, L.w_gate_up, a.act, CUDA_R_16BF,
                                                    /*swiglu=*/true, ff, d));
    } else if (fold_ffn == 2) {
      RETURN_IF_ERROR(projections_.Gemm(a.attn, L.wo, a.delta, CUDA_R_16BF, T, d, qd));
      RETURN_IF_ERROR(residual_scale(L.ffn_norm));
      RETURN_IF_ERROR(
          projections_.GateUpSwiGluNormed(a.h, rows_norm, L.w_gate_up, a.act, T, ff, d));
    } else if (fold_ffn == 1) {
      kernels::WgmmaResidualOut out;
      out.residual = a.x;
      out.norm_weight = L.ffn_norm;
      out.scaled = a.h;
      out.sum_squares = a.norm_parts;
      kernels::WgmmaNormIn in;
      in.sum_squares = a.norm_parts;
      in.eps = c.rms_norm_eps;
      RETURN_IF_ERROR(projections_.WgmmaToResidual(a.attn, L.wo, T, d, qd, out, &in.parts));
      RETURN_IF_ERROR(projections_.GateUpSwiGluNormed(a.h, in, L.w_gate_up, a.act, T, ff, d));
    } else {
      RETURN_IF_ERROR(projections_.Gemm(a.attn, L.wo, a.delta, CUDA_R_16BF, T, d, qd));
      RETURN_IF_ERROR(all_reduce_.SumBf16(a.delta, int64_t(T) * d, stream_));
      cuda_model::RmsNormParams ffn_norm;
      ffn_norm.x = a.x;
      ffn_norm.x_out = a.x;
      ffn_norm.residual = a.delta;
      ffn_norm.weight = L.ffn_norm;
      ffn_norm.out = a.h;
      ffn_norm.num_rows = T;
      ffn_norm.dim = d;
      ffn_norm.eps = c.rms_norm_eps;
      RETURN_IF_ERROR(cuda_model::LaunchRmsNorm(ffn_norm, stream_));
      RETURN_IF_ERROR(projections_.GateUpSwiGlu(a.h, L.w_gate_up, a.gate_up, a.act, T, ff, d));
    }
    if (fold && l + 1 < c.num_layers) {
      RETURN_IF_ERROR(projections_.GemvToResidual(a.act, L.w_down, d, ff,
                                                  to_residual(weights_.layer(l + 1).attn_norm)));
    } else {
      RETURN_IF_ERROR(projections_.Gemm(a.act, L.w_down, a.delta, CUDA_R_16BF, T, d, ff));
      RETURN_IF_ERROR(all_reduce_.SumBf16(a.delta, int64_t(T) * d, stream_));
    }
  }
  if (R == 0) return absl::OkStatus();
  cuda_model::RmsNormParams final_norm;
  final_norm.x = a.x;
  final_norm.rows = s.logit_rows;
  final_norm.residual = a.delta;
  final_norm.weight = weights_.final_norm();
  final_norm.out = a.h_rows;
  final_norm.num_rows = R;
  final_norm.dim = d;
  final_norm.eps = c.rms_norm_eps;
  RETURN_IF_ERROR(cuda_model::LaunchRmsNorm(final_norm, stream_));
  RETURN_IF_ERROR(
      projections_.Gemm(a.h_rows, weights_.lm_head(), a.logits, CUDA_R_32F, R, c.vocab_size, d));
  return absl::OkStatus();
}

absl::Status CudaBackend::RunStep(const DeviceStep& s, int num_segments) {
  // Small steps (decode and short query blocks, where ~12 launches per layer can cost more
  // than the kernels) on one rank (a TP rank's graph would hold NCCL calls that every rank must
  // replay in step) with tensor-core attention: graph candidates. Their KV bound is rounded up
  // so that a decode batch keeps one shape for kGraphKvBucket steps; a larger bound only adds
  // splits that find no keys (the kernels mask by each request's own length). The rounding is
  // applied with graphs off too, so that a replay computes exactly what the eager step does.
  const bool small =
      !tensor_parallel() && tensor_core_attention_ && s.tokens_n <= options_.graph_max_tokens;
  if (!small) return EnqueueStep(s);
  DeviceStep g = s;
  g.max_kv_len = (s.max_kv_len + kGraphKvBucket - 1) / kGraphKvBucket * kGraphKvBucket;
  if (!options_.cuda_graphs) return EnqueueStep(g);
  // Upload offsets depend only on (tokens, logit rows, requests, segments, quality): page
  // indices go last (StepPlan).
  const StepGraphKey key = {g.tokens_n,  g.rows_n,     g.view.num_requests, num_segments,
                            g.max_q_len, g.max_kv_len, g.decode ? 1 : 0,    g.quality ? 1 : 0};
  return graphs_.Run(key, s.tokens_n, stream_,
                     [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return EnqueueStep(g); });
}

absl::Status CudaBackend::Materialize(const std::vector<MaterializeCopy>& copies) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(SetDevice());
  std::vector<int32_t> written;
  for (const MaterializeCopy& c : copies)
    written.insert(written.end(), c.dst_pages.begin(), c.dst_pages.end());
  RETURN_IF_ERROR(host_.OrderWritesAfter(written, stream_));
  return pool_.Materialize(copies, reinterpret_cast<const float*>(inv_freq_.data()),
                           tensor_core_attention_, Uploader(), stream_);
}

absl::Status CudaBackend::ExportKv(const std::vector<int32_t>& pages, int num_tokens,
                                   std::string* out) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(SetDevice());
  return pool_.Export(pages, num_tokens, out, Uploader(), stream_);
}

absl::Status CudaBackend::ImportKv(const std::vector<int32_t>& pages, int num_tokens,
                                   std::string_view data) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(SetDevice());
  RETURN_IF_ERROR(host_.OrderWritesAfter(pages, stream_));
  return pool_.Import(pages, num_tokens, data, Uploader(), stream_);
}

absl::StatusOr<std::unique_ptr<HostMemory>> CudaBackend::AllocateHostMemory(int64_t bytes) {
  RETURN_IF_ERROR(SetDevice());
  return cuda_backend::AllocatePinnedHostMemory(bytes);
}

absl::StatusOr<KvTransferId> CudaBackend::StartKvToHost(const std::vector<int32_t>& pages,
                                                        int num_tokens, char* dst) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(SetDevice());
  RETURN_IF_ERROR(pool_.CheckRun(pages, num_tokens));
  return host_.Start(pool_.Transport(num_tokens, dst, /*to_buffer=*/true), pages, stream_);
}

absl::StatusOr<KvTransferId> CudaBackend::StartKvFromHost(const std::vector<int32_t>& pages,
                                                          int num_tokens, const char* src) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(SetDevice());
  RETURN_IF_ERROR(pool_.CheckRun(pages, num_tokens));
  return host_.Start(pool_.Transport(num_tokens, const_cast<char*>(src), /*to_buffer=*/false),
                     pages, stream_);
}

absl::StatusOr<std::optional<uint64_t>> CudaBackend::PollKvTransfer(KvTransferId id) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(SetDevice());
  return host_.Poll(id);
}

absl::StatusOr<uint64_t> CudaBackend::WaitKvTransfer(KvTransferId id) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(SetDevice());
  return host_.Wait(id);
}

absl::StatusOr<PeerPoolHandle> CudaBackend::ExportPoolHandle() {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(SetDevice());
  if (!pool_.initialized()) return absl::FailedPreconditionError("kv pool not initialised");
  if (tensor_parallel()) {
    // A rank holds a slice of every page: a peer could not copy whole pages from one pool.
    return absl::FailedPreconditionError("cuda backend: no pool lending with tensor parallelism");
  }
  return pool_.PeerHandle(options_.device);
}

absl::Status CudaBackend::CopyPagesFromPeer(const PeerPoolHandle& peer,
                                            const std::vector<int32_t>& peer_pages,
                                            const std::vector<int32_t>& own_pages) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(SetDevice());
  RETURN_IF_ERROR(host_.OrderWritesAfter(own_pages, stream_));
  return pool_.CopyFromPeer(peer, peer_pages, own_pages, Uploader(), stream_);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const LoadedModel& model,
                                                           const CudaBackendOptions& options) {
  absl::StatusOr<ModelConfig> config = ShardConfig(model.config, options.shard);
  absl::Status st = config.status();
  if (st.ok() && options.shard.size > 1 && options.nccl_comm == nullptr) {
    st = absl::InvalidArgumentError("cuda backend: tensor parallel rank without an NCCL comm");
  }
  if (st.ok() && (options.prefetch_o_weights < 0 || options.prefetch_o_weights > 2)) {
    st = absl::InvalidArgumentError(absl::StrCat(
        "cuda backend: prefetch_o_weights must be 0, 1 or 2, got ", options.prefetch_o_weights));
  }
  if (st.ok() && (options.fold_ffn_norm < 0 || options.fold_ffn_norm > 2)) {
    st = absl::InvalidArgumentError(
        absl::StrCat("cuda backend: fold_ffn_norm must be 0, 1 or 2, got ", options.fold_ffn_norm));
  }
  if (st.ok() && options.shard.size > 1 && !CudaBackendHasNccl()) {
    st = absl::UnimplementedError("cuda backend: built without NCCL (no tensor parallelism)");
  }
  if (!st.ok()) {
    cuda_backend::DestroyNcclComm(options.nccl_comm);
    return st;
  }
  // From here the backend owns the comm.
  auto backend = std::make_unique<CudaBackend>(*config, options);
  RETURN_IF_ERROR(backend->Init(model));
  return std::unique_ptr<Backend>(std::move(backend));
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
