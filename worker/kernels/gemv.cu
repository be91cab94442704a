#include <cstdint>

#include "absl/strings/str_cat.h"
#include "worker/kernels/gemv.h"
#include "worker/kernels/gemv_internal.cuh"

namespace lazyrag::cuda_model {
namespace {
// Block shapes (bench/gemv_bench): r2_u1_p1, and r4_u1_p1 (as fast on the 8B projections) for
// the folded norm, whose consumers read one part per producer block, and the QKV split (two
// rotated pairs a block).
constexpr int kLaunchRows = 2;
constexpr int kFoldRows = 4;
}  // namespace

bool GemvSupports(const GemvParams& p) {
  const auto aligned = [](const void* q, uintptr_t a) {
    return q != nullptr && reinterpret_cast<uintptr_t>(q) % a == 0;
  };
  const GemvResidualOut& r = p.residual_out;
  const bool residual = r.residual != nullptr, norm_in = p.norm_in.sum_squares != nullptr;
  if (residual && (p.swiglu || p.y_fp32 || norm_in || !aligned(r.residual, 4) ||
                   !aligned(r.norm_weight, 4) || !aligned(r.scaled, 2) ||
                   !aligned(r.sum_squares, 4))) {
    return false;
  }
  if (norm_in && (p.norm_in.parts <= 0 || !(p.norm_in.eps >= 0.f))) return false;
  const GemvQkvOut& q = p.qkv_out;
  const bool qkv = q.q != nullptr;
  if (qkv &&
      (p.swiglu || p.y_fp32 || residual || !aligned(q.rope, 8) || q.kv_slot == nullptr ||
       !aligned(q.q, 2) || !aligned(q.k_cache, 2) || !aligned(q.v_cache, 2) || q.head_dim <= 0 ||
       q.head_dim % 4 != 0 || q.q_dim <= 0 || q.kv_dim <= 0 || q.q_dim % q.head_dim != 0 ||
       q.kv_dim % q.head_dim != 0 || int64_t(p.n) != int64_t(q.q_dim) + 2 * int64_t(q.kv_dim))) {
    return false;
  }
  return p.n > 0 && p.k > 0 && p.k % 8 == 0 && aligned(p.w, 16) && aligned(p.x, 16) &&
         (residual || qkv || aligned(p.y, p.y_fp32 ? 4 : 2)) && !(p.swiglu && p.y_fp32);
}

int GemvNormParts(int n) { return (n + kFoldRows - 1) / kFoldRows; }

bool GemvPreferred(const GemvParams& p) { return GemvSupports(p) && p.k >= 2048 && p.n <= 32768; }

absl::Status LaunchGemv(const GemvParams& p, cudaStream_t stream) {
  if (!GemvSupports(p)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gemv: n ", p.n, ", k ", p.k, (p.swiglu ? " with swiglu" : ""),
        (p.y_fp32 ? ", fp32 out" : ", bf16 out"),
        (p.residual_out.residual != nullptr ? ", residual out" : ""),
        (p.norm_in.sum_squares != nullptr ? ", norm in" : ""),
        (p.qkv_out.q != nullptr ? ", qkv out" : ""),
        ": needs n > 0, k a positive multiple of 8, 16-byte aligned w and x, aligned y, no fp32 "
        "output with swiglu, a residual output only with bf16 y and every pointer aligned, a "
        "norm input with parts > 0 and eps >= 0, a qkv output with every pointer set and "
        "n = q_dim + 2 kv_dim in heads of a multiple of 4 without swiglu, fp32 y or a residual "
        "output"));
  }
  if (p.residual_out.residual != nullptr || p.norm_in.sum_squares != nullptr ||
      p.qkv_out.q != nullptr) {
    return gemv_internal::LaunchGemvKernel<kFoldRows, 1, 1>(p, stream);
  }
  return gemv_internal::LaunchGemvKernel<kLaunchRows, 1, 1>(p, stream);
}

}  // namespace lazyrag::cuda_model
