// MATERIALIZE copy-and-re-rotate kernel (Block-Attention's per-request cost).
//
// Grid: (token block of 32, copy, layer); 256 threads. Work item = (token, KV head, feature
// chunk pair): the 16-byte chunks c and c + D/16 of K hold the rotate-half partners, so one
// item loads K lo/hi and V lo/hi (4 x 16 B), rotates 8 K pairs by the copy's delta and stores
// 4 x 16 B. A thread's chunk pair is fixed (256 is a multiple of D/16), so its 8 sines and
// cosines are computed once per block. Two items per thread are loaded before either is
// stored to keep 128 bytes per thread in flight.
#include "common/status.h"
#include "worker/kernels/attention_internal.cuh"
#include "worker/kernels/materialize.h"

namespace lazyrag::kernels {
namespace detail {
namespace {

constexpr int kMatThreads = 256;
constexpr int kMatTokens = 32;  // tokens per block
constexpr int kMatUnroll = 2;

__device__ __forceinline__ uint4 RotateChunk(uint4 lo, uint4* hi, const float (&c)[8],
                                             const float (&s)[8]) {
  uint32_t* lw = reinterpret_cast<uint32_t*>(&lo);
  uint32_t* hw = reinterpret_cast<uint32_t*>(hi);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 x0 = UnpackBf16(lw[e]), x1 = UnpackBf16(hw[e]);
    lw[e] = PackBf16(x0.x * c[2 * e] - x1.x * s[2 * e], x0.y * c[2 * e + 1] - x1.y * s[2 * e + 1]);
    hw[e] = PackBf16(x1.x * c[2 * e] + x0.x * s[2 * e], x1.y * c[2 * e + 1] + x0.y * s[2 * e + 1]);
  }
  return lo;
}

template <int D>
__device__ __forceinline__ void MaterializeBody(const MaterializeParams& p) {
  constexpr int kPairs = D / 16;
  static_assert(kMatThreads % kPairs == 0, "fixed chunk pair per thread");
  const int copy = blockIdx.y, layer = blockIdx.z;
  const int len = p.len[copy];
  const int tok0 = blockIdx.x * kMatTokens;
  if (tok0 >= len) return;
  const int cp = threadIdx.x % kPairs;
  const int delta = p.delta[copy];
  float c[8], s[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) RopeSinCos(delta, p.inv_freq[cp * 8 + e], &s[e], &c[e]);

  const int hkv = p.num_kv_heads, ps = p.page_size;
  const int items_per_token = hkv * kPairs;
  const int items = min(kMatTokens, len - tok0) * items_per_token;
  const int64_t token_stride = int64_t(hkv) * D;
  uint4* kc = reinterpret_cast<uint4*>(p.k_cache + layer * p.layer_stride);
  uint4* vc = reinterpret_cast<uint4*>(p.v_cache + layer * p.layer_stride);
  const int32_t* src_pages = p.src_pages + p.src_page_indptr[copy];
  const int32_t* dst_pages = p.dst_pages + p.dst_page_indptr[copy];
  const int dst_offset = p.dst_offset[copy];
  const int src_offset = p.src_offset != nullptr ? p.src_offset[copy] : 0;

  for (int base = threadIdx.x; base < items; base += kMatThreads * kMatUnroll) {
    int64_t src_off[kMatUnroll], dst_off[kMatUnroll];  // in uint4 units, chunk cp
    bool ok[kMatUnroll];
    uint4 klo[kMatUnroll], khi[kMatUnroll], vlo[kMatUnroll], vhi[kMatUnroll];
#pragma unroll
    for (int u = 0; u < kMatUnroll; ++u) {
      const int it = base + u * kMatThreads;
      ok[u] = it < items;
      const int tok = tok0 + it / items_per_token;
      const int head = (it / kPairs) % hkv;
      const int st = src_offset + tok, dt = dst_offset + tok;
      const int64_t src_tok = ok[u] ? int64_t(src_pages[st / ps]) * ps + st % ps : 0;
      const int64_t dst_tok = ok[u] ? int64_t(dst_pages[dt / ps]) * ps + dt % ps : 0;
      src_off[u] = (src_tok * token_stride + head * D) / 8 + cp;
      dst_off[u] = (dst_tok * token_stride + head * D) / 8 + cp;
      if (ok[u]) {
        klo[u] = kc[src_off[u]];
        khi[u] = kc[src_off[u] + kPairs];
        vlo[u] = vc[src_off[u]];
        vhi[u] = vc[src_off[u] + kPairs];
      }
    }
#pragma unroll
    for (int u = 0; u < kMatUnroll; ++u) {
      if (!ok[u]) continue;
      if (delta != 0) klo[u] = RotateChunk(klo[u], &khi[u], c, s);
      kc[dst_off[u]] = klo[u];
      kc[dst_off[u] + kPairs] = khi[u];
      vc[dst_off[u]] = vlo[u];
      vc[dst_off[u] + kPairs] = vhi[u];
    }
  }
}

template <int D>
__global__ void __launch_bounds__(kMatThreads)
    MaterializeKernel(const __grid_constant__ MaterializeParams p) {
  MaterializeBody<D>(p);
}

}  // namespace
}  // namespace detail

absl::Status Materialize(const MaterializeParams& p, cudaStream_t stream) {
  if (p.head_dim != 64 && p.head_dim != 128) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim must be 64 or 128, got ", p.head_dim));
  }
  if (p.num_kv_heads <= 0 || p.page_size < 1 || p.num_layers < 1 || p.num_copies < 0 ||
      p.max_len < 0 || p.layer_stride < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad materialize shape: num_kv_heads ", p.num_kv_heads, ", page_size ", p.page_size,
        ", num_layers ", p.num_layers, ", num_copies ", p.num_copies, ", max_len ", p.max_len));
  }
  if (p.num_copies > 65535 || p.num_layers > 65535) {
    return absl::InvalidArgumentError("more than 65535 copies or layers in one launch");
  }
  if (p.num_copies == 0 || p.max_len == 0) return absl::OkStatus();
  if (p.k_cache == nullptr || p.v_cache == nullptr || p.inv_freq == nullptr ||
      p.src_page_indptr == nullptr || p.src_pages == nullptr || p.dst_page_indptr == nullptr ||
      p.dst_pages == nullptr || p.len == nullptr || p.dst_offset == nullptr || p.delta == nullptr) {
    return absl::InvalidArgumentError("null materialize pointer");
  }
  const dim3 grid((p.max_len + detail::kMatTokens - 1) / detail::kMatTokens, p.num_copies,
                  p.num_layers);
  switch (p.head_dim) {
    case 64:
      detail::MaterializeKernel<64><<<grid, detail::kMatThreads, 0, stream>>>(p);
      break;
    case 128:
      detail::MaterializeKernel<128><<<grid, detail::kMatThreads, 0, stream>>>(p);
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("head_dim must be 64 or 128, got ", p.head_dim));
  }
  LAZYRAG_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace lazyrag::kernels
