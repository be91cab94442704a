#include <cstdint>

#include "absl/strings/str_cat.h"
#include "worker/kernels/gemv.h"
#include "worker/kernels/gemv_internal.cuh"

namespace lazyrag::cuda_model {

bool GemvSupports(const GemvParams& p) {
  const auto aligned = [](const void* q, uintptr_t a) {
    return q != nullptr && reinterpret_cast<uintptr_t>(q) % a == 0;
  };
  if (!(p.n > 0 && p.k > 0 && p.k % 8 == 0 && aligned(p.w, 16) && aligned(p.x, 16))) return false;
  if (int(p.swiglu) + int(p.qkv_scatter) + int(p.then_norm) > 1) return false;
  if (p.qkv_scatter) {
    const QkvScatterParams& s = p.scatter;
    return s.num_tokens == 1 && s.head_dim > 0 && s.head_dim % 2 == 0 && s.num_heads > 0 &&
           s.num_kv_heads > 0 && p.n == (s.num_heads + 2 * s.num_kv_heads) * s.head_dim &&
           s.rope != nullptr && s.kv_slot != nullptr && s.q != nullptr && s.k_cache != nullptr &&
           s.v_cache != nullptr;
  }
  if (!aligned(p.y, p.y_fp32 ? 4 : 2)) return false;
  if (p.then_norm) {
    const RmsNormParams& r = p.norm;
    return !p.y_fp32 && p.counter != nullptr && r.num_rows == 1 && r.rows == nullptr &&
           r.embedding == nullptr && r.residual == p.y && r.dim == p.n &&
           norm_internal::VecRowApplies(p.n) && aligned(r.x, 16) && aligned(r.weight, 16) &&
           aligned(r.out, 8) && (r.x_out == nullptr || aligned(r.x_out, 16)) && aligned(p.y, 8);
  }
  return !(p.swiglu && p.y_fp32);
}

bool GemvPreferred(const GemvParams& p) { return GemvSupports(p) && p.k >= 2048 && p.n <= 32768; }

absl::Status LaunchGemv(const GemvParams& p, cudaStream_t stream) {
  if (!GemvSupports(p)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gemv: n ", p.n, ", k ", p.k, (p.swiglu ? " with swiglu" : ""),
        (p.qkv_scatter ? " with qkv_scatter" : ""), (p.then_norm ? " with then_norm" : ""),
        (p.y_fp32 ? ", fp32 out" : ", bf16 out"),
        ": needs n > 0, k a positive multiple of 8, 16-byte aligned w and x, aligned y, no fp32 "
        "output with swiglu, one epilogue with its operands (gemv.h)"));
  }
  return gemv_internal::LaunchGemvKernel<2, 1, 1>(p, stream);
}

}  // namespace lazyrag::cuda_model
