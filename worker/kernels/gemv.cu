#include <cstdint>

#include "absl/strings/str_cat.h"
#include "worker/kernels/gemv.h"
#include "worker/kernels/gemv_internal.cuh"

namespace lazyrag::cuda_model {
namespace {
// Block shapes (bench/gemv_bench): r2_u1_p1, and r4_u1_p1 (as fast on the 8B projections) for
// the folded norm, whose consumers read one part per producer block.
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
  return p.n > 0 && p.k > 0 && p.k % 8 == 0 && aligned(p.w, 16) && aligned(p.x, 16) &&
         (residual || aligned(p.y, p.y_fp32 ? 4 : 2)) && !(p.swiglu && p.y_fp32);
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
        ": needs n > 0, k a positive multiple of 8, 16-byte aligned w and x, aligned y, no fp32 "
        "output with swiglu, a residual output only with bf16 y and every pointer aligned, a "
        "norm input with parts > 0 and eps >= 0"));
  }
  if (p.residual_out.residual != nullptr || p.norm_in.sum_squares != nullptr) {
    return gemv_internal::LaunchGemvKernel<kFoldRows, 1, 1>(p, stream);
  }
  return gemv_internal::LaunchGemvKernel<kLaunchRows, 1, 1>(p, stream);
}

}  // namespace lazyrag::cuda_model
