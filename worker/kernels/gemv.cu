#include <cstdint>

#include "absl/strings/str_cat.h"
#include "worker/kernels/gemv.h"
#include "worker/kernels/gemv_internal.cuh"

namespace lazyrag::cuda_model {

bool GemvSupports(const GemvParams& p) {
  const auto aligned = [](const void* q, uintptr_t a) {
    return q != nullptr && reinterpret_cast<uintptr_t>(q) % a == 0;
  };
  return p.n > 0 && p.k > 0 && p.k % 8 == 0 && aligned(p.w, 16) && aligned(p.x, 16) &&
         aligned(p.y, p.y_fp32 ? 4 : 2) && !(p.swiglu && p.y_fp32);
}

bool GemvPreferred(const GemvParams& p) { return GemvSupports(p) && p.k >= 2048 && p.n <= 32768; }

absl::Status LaunchGemv(const GemvParams& p, cudaStream_t stream) {
  if (!GemvSupports(p)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gemv: n ", p.n, ", k ", p.k, (p.swiglu ? " with swiglu" : ""),
        (p.y_fp32 ? ", fp32 out" : ", bf16 out"),
        ": needs n > 0, k a positive multiple of 8, 16-byte aligned w and x, aligned y, no fp32 "
        "output with swiglu"));
  }
  return gemv_internal::LaunchGemvKernel<2, 1, 1>(p, stream);
}

}  // namespace lazyrag::cuda_model
