#include "worker/backend/cuda/cuda_weights.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/kernels/cuda_check.h"
#include "worker/kernels/model_kernels.h"
#include "worker/model/synthetic_init.h"

namespace lazyrag::cuda_backend {
namespace {

constexpr int64_t kUploadChunkFloats = int64_t(16) << 20;  // fp32 staging for host weights

}  // namespace

// One weight tensor as the loader names it (for filling, uploading and reading back).
// With tensor parallelism a tensor is the rank's slice: element i is element g(i) of the
// global tensor (model_kernels.h SyntheticFillParams: first, cols, global_cols).
struct CudaWeights::TensorRef {
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

std::vector<CudaWeights::TensorRef> CudaWeights::Tensors(const ModelWeights* host) const {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(), ff = c.intermediate_size;
  // Rank r of N holds rows [r * n, (r + 1) * n) of wq / wk / wv / w_gate / w_up (n its rows) and
  // the same block of columns of wo and w_down; fan-ins are the global ones.
  const int64_t N = shard_.size, r = shard_.rank;
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

absl::Status CudaWeights::Load(const LoadedModel& model, bool synthetic_on_device,
                               cudaStream_t stream) {
  const ModelConfig& c = config_;
  const bool on_device = model.synthetic && (synthetic_on_device || !model.weights);
  const ModelWeights* host = on_device ? nullptr : model.weights.get();
  if (!on_device && host == nullptr) {
    return absl::InvalidArgumentError("cuda backend: model has no host weights");
  }
  // Tensor parallelism: the rank's slice of the host weights, cut on the host before upload.
  std::unique_ptr<ModelWeights> slice;
  if (host != nullptr && shard_.size > 1) {
    ASSIGN_OR_RETURN(slice, ShardWeights(*host, shard_));
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
            cudaMemcpyAsync(t.ptr, t.host->data(), t.count * f32, cudaMemcpyHostToDevice, stream));
        continue;
      }
      for (int64_t off = 0; off < t.count; off += kUploadChunkFloats) {
        const int64_t n = std::min(kUploadChunkFloats, t.count - off);
        // Pageable source: returns once the source is staged; the conversion below is
        // ordered after the copy on the stream, the next copy after the conversion.
        LAZYRAG_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(staging.data(), t.host->data() + off, n * f32,
                                                     cudaMemcpyHostToDevice, stream));
        RETURN_IF_ERROR(cuda_model::LaunchFloatToBf16(reinterpret_cast<float*>(staging.data()),
                                                      static_cast<uint16_t*>(t.ptr) + off, n,
                                                      stream));
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
    RETURN_IF_ERROR(cuda_model::LaunchSyntheticFill(p, stream));
  }
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> CudaWeights::Read(uint32_t tag, int64_t offset, int64_t count,
                                                     cudaStream_t stream) const {
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
                                                  stream));
    LAZYRAG_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(out.data(), tmp.data(), count * sizeof(float),
                                                 cudaMemcpyDeviceToHost, stream));
    LAZYRAG_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
    return out;
  }
  return absl::InvalidArgumentError(absl::StrCat("read weight: no tensor with tag ", tag));
}

}  // namespace lazyrag::cuda_backend
