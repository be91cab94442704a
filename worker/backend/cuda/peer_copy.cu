#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/kernels/cuda_check.h"
#include "worker/backend/cuda/peer_copy.h"

namespace lazyrag::peer_copy {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 8;  // 16-byte loads in flight per thread (hides NVLink latency)

// One side of a block copy: byte address of (layer, kv, i) = base + layer * layer_stride +
// kv * kv_stride + page(i) * page_stride, where page(i) = pages ? pages[i] : i.
struct Side {
  char *base = nullptr;
  int64_t layer_stride = 0;
  int64_t kv_stride = 0;
  int64_t page_stride = 0;
  const int32_t *pages = nullptr;
};

struct BlockCopyParams {
  Side src;
  Side dst;
  int64_t block_bytes = 0;  // multiple of 16
  int num_pages = 0;
};

Side PoolSide(const void *pool, const PoolLayout &l, const int32_t *pages) {
  return Side{static_cast<char *>(const_cast<void *>(pool)), l.LayerStrideBytes(), l.KvBytes(),
              l.PageBytes(), pages};
}

Side BufferSide(void *buffer, const PoolLayout &l, int num_pages) {
  const int64_t kv = int64_t(num_pages) * l.PageBytes();
  return Side{static_cast<char *>(buffer), 2 * kv, kv, l.PageBytes(), nullptr};
}

__device__ __forceinline__ const uint4 *BlockAddress(const Side &s, int layer, int kv, int i) {
  const int64_t page = s.pages != nullptr ? s.pages[i] : i;
  return reinterpret_cast<const uint4 *>(s.base + layer * s.layer_stride + kv * s.kv_stride +
                                         page * s.page_stride);
}

// Body: the block (blockIdx.x = page index i, blockIdx.y = layer * 2 + kv) copies one page
// block of block_bytes, kUnroll 16-byte loads per thread before the stores.
__device__ void BlockCopy(const BlockCopyParams &p) {
  const int i = blockIdx.x;
  const int layer = blockIdx.y >> 1, kv = blockIdx.y & 1;
  const uint4 *__restrict__ src = BlockAddress(p.src, layer, kv, i);
  uint4 *__restrict__ dst = const_cast<uint4 *>(BlockAddress(p.dst, layer, kv, i));
  const int64_t n = p.block_bytes / 16;
  for (int64_t base = threadIdx.x; base < n; base += int64_t(kThreads) * kUnroll) {
    uint4 r[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int64_t idx = base + int64_t(k) * kThreads;
      if (idx < n) r[k] = src[idx];
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int64_t idx = base + int64_t(k) * kThreads;
      if (idx < n) dst[idx] = r[k];
    }
  }
}

__global__ void __launch_bounds__(kThreads) BlockCopyKernel(const BlockCopyParams p) {
  BlockCopy(p);
}

absl::Status LaunchBlockCopy(const BlockCopyParams &p, int num_layers, cudaStream_t stream) {
  if (p.num_pages == 0 || num_layers == 0) return absl::OkStatus();
  if (p.block_bytes <= 0 || p.block_bytes % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page copy: page block of ", p.block_bytes, " bytes is not a multiple of 16"));
  }
  if (num_layers > 32767) return absl::InvalidArgumentError("page copy: too many layers");
  if (p.src.base == nullptr || p.dst.base == nullptr) {
    return absl::InvalidArgumentError("page copy: null pool or buffer");
  }
  BlockCopyKernel<<<dim3(p.num_pages, 2 * num_layers), kThreads, 0, stream>>>(p);
  LAZYRAG_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

bool SameShape(const PoolLayout &a, const PoolLayout &b) {
  return a.num_layers == b.num_layers && a.page_size == b.page_size && a.kv_dim == b.kv_dim &&
         a.elem_bytes == b.elem_bytes;
}

}  // namespace

absl::Status CheckPageCopy(const PoolLayout &src, const PoolLayout &dst,
                           const std::vector<int32_t> &src_pages,
                           const std::vector<int32_t> &dst_pages) {
  if (!SameShape(src, dst)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page copy: pools differ in shape (layers ", src.num_layers, "/", dst.num_layers,
        ", page size ", src.page_size, "/", dst.page_size, ", kv dim ", src.kv_dim, "/", dst.kv_dim,
        ", element bytes ", src.elem_bytes, "/", dst.elem_bytes, ")"));
  }
  if (src_pages.size() != dst_pages.size()) {
    return absl::InvalidArgumentError(absl::StrCat("page copy: ", src_pages.size(),
                                                   " source pages but ", dst_pages.size(),
                                                   " destination pages"));
  }
  for (size_t i = 0; i < src_pages.size(); ++i) {
    if (src_pages[i] < 0 || src_pages[i] >= src.num_pages || dst_pages[i] < 0 ||
        dst_pages[i] >= dst.num_pages) {
      return absl::InvalidArgumentError(absl::StrCat("page copy: page pair ", i, " (", src_pages[i],
                                                     " -> ", dst_pages[i],
                                                     ") is outside its pool"));
    }
  }
  return absl::OkStatus();
}

absl::Status LaunchPageGather(const PageGatherParams &p, cudaStream_t stream) {
  if (!SameShape(p.src, p.dst)) {
    return absl::InvalidArgumentError("page gather: pools differ in shape");
  }
  BlockCopyParams c;
  c.src = PoolSide(p.src_pool, p.src, p.src_pages);
  c.dst = PoolSide(p.dst_pool, p.dst, p.dst_pages);
  c.block_bytes = p.src.PageBytes();
  c.num_pages = p.num_pages;
  if (p.num_pages > 0 && (p.src_pages == nullptr || p.dst_pages == nullptr)) {
    return absl::InvalidArgumentError("page gather: null page list");
  }
  return LaunchBlockCopy(c, p.src.num_layers, stream);
}

absl::Status LaunchPagesToBuffer(const void *pool, const PoolLayout &layout,
                                 const int32_t *pages_device, int num_pages, void *buffer,
                                 bool to_buffer, cudaStream_t stream) {
  if (num_pages > 0 && pages_device == nullptr) {
    return absl::InvalidArgumentError("pages to buffer: null page list");
  }
  BlockCopyParams c;
  const Side pool_side = PoolSide(pool, layout, pages_device);
  const Side buffer_side = BufferSide(buffer, layout, num_pages);
  c.src = to_buffer ? pool_side : buffer_side;
  c.dst = to_buffer ? buffer_side : pool_side;
  c.block_bytes = layout.PageBytes();
  c.num_pages = num_pages;
  return LaunchBlockCopy(c, layout.num_layers, stream);
}

absl::StatusOr<int64_t> CopyPageRuns(const void *src_pool, int src_device, const PoolLayout &src,
                                     const std::vector<int32_t> &src_pages, void *dst_pool,
                                     int dst_device, const PoolLayout &dst,
                                     const std::vector<int32_t> &dst_pages, cudaStream_t stream) {
  if (auto st = CheckPageCopy(src, dst, src_pages, dst_pages); !st.ok()) return st;
  if (src_pool == nullptr || dst_pool == nullptr) {
    return absl::InvalidArgumentError("page runs: null pool");
  }
  const char *s = static_cast<const char *>(src_pool);
  char *d = static_cast<char *>(dst_pool);
  const int64_t page = src.PageBytes();
  int64_t copies = 0;
  const size_t n = src_pages.size();
  for (size_t i = 0; i < n;) {
    size_t j = i + 1;  // [i, j): consecutive in both pools
    while (j < n && src_pages[j] == src_pages[j - 1] + 1 && dst_pages[j] == dst_pages[j - 1] + 1) {
      ++j;
    }
    const size_t bytes = size_t(j - i) * page;
    for (int layer = 0; layer < src.num_layers; ++layer) {
      for (int kv = 0; kv < 2; ++kv) {
        const char *from = s + src.Offset(layer, kv, src_pages[i]);
        char *to = d + dst.Offset(layer, kv, dst_pages[i]);
        if (src_device == dst_device) {
          LAZYRAG_RETURN_IF_CUDA_ERROR(
              cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream));
        } else {
          LAZYRAG_RETURN_IF_CUDA_ERROR(
              cudaMemcpyPeerAsync(to, dst_device, from, src_device, bytes, stream));
        }
        ++copies;
      }
    }
    i = j;
  }
  return copies;
}

absl::Status EnablePeerAccess(int device, int peer_device) {
  if (device == peer_device) return absl::OkStatus();
  int can = 0;
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaDeviceCanAccessPeer(&can, device, peer_device));
  if (!can) {
    return absl::FailedPreconditionError(
        absl::StrCat("GPU ", device, " cannot address GPU ", peer_device, " (no peer access)"));
  }
  int current = 0;
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaGetDevice(&current));
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaSetDevice(device));
  cudaError_t err = cudaDeviceEnablePeerAccess(peer_device, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();  // clear the sticky-looking but harmless error
    err = cudaSuccess;
  }
  cudaSetDevice(current);
  LAZYRAG_RETURN_IF_CUDA_ERROR(err);
  return absl::OkStatus();
}

absl::StatusOr<std::string> PoolIpcHandle(void *pool_base) {
  if (pool_base == nullptr) return absl::InvalidArgumentError("ipc handle: null pool");
  cudaIpcMemHandle_t h;
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaIpcGetMemHandle(&h, pool_base));
  return std::string(reinterpret_cast<const char *>(&h), sizeof(h));
}

absl::StatusOr<void *> OpenPoolIpcHandle(std::string_view handle) {
  cudaIpcMemHandle_t h;
  if (handle.size() != sizeof(h)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ipc handle: ", handle.size(), " bytes, expected ", sizeof(h)));
  }
  std::memcpy(&h, handle.data(), sizeof(h));
  void *mapped = nullptr;
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaIpcOpenMemHandle(&mapped, h, cudaIpcMemLazyEnablePeerAccess));
  return mapped;
}

absl::Status ClosePoolIpcHandle(void *mapped) {
  if (mapped == nullptr) return absl::OkStatus();
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaIpcCloseMemHandle(mapped));
  return absl::OkStatus();
}

}  // namespace lazyrag::peer_copy
