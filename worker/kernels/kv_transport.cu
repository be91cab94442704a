#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/kv_checksum.h"
#include "worker/kernels/cuda_check.h"
#include "worker/kernels/kv_transport.h"

namespace lazyrag::cuda_model {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxGridBlocks = 1 << 20;  // grid-stride beyond this

int GridFor(int64_t work, int threads) {
  return int(std::min<int64_t>((work + threads - 1) / threads, kMaxGridBlocks));
}

// ---------------------------------------------------------------------------------------------
// KV transport (export / import).

// The pool unit that buffer unit `idx` of the transport form holds: buffer index
// ((layer * 2 + kv) * num_tokens + j) * units_per_token + c.
template <typename Unit>
__device__ __forceinline__ Unit* PoolUnit(const KvTransportParams& p, int64_t idx) {
  const int per_token = p.kv_dim / int(sizeof(Unit) / sizeof(uint16_t));
  const int c = int(idx % per_token);
  int64_t rest = idx / per_token;
  const int j = int(rest % p.num_tokens);
  rest /= p.num_tokens;
  const int kv = int(rest % 2), layer = int(rest / 2);
  const int64_t slot = int64_t(p.pages[j / p.page_size]) * p.page_size + j % p.page_size;
  return reinterpret_cast<Unit*>(p.pool + layer * p.layer_stride + kv * p.v_offset +
                                 slot * p.kv_dim) +
         c;
}

template <typename Unit>
__device__ __forceinline__ int64_t TransportUnits(const KvTransportParams& p) {
  return int64_t(p.num_layers) * 2 * p.num_tokens * (p.kv_dim / int(sizeof(Unit) / 2));
}

template <typename Unit>
__global__ void __launch_bounds__(kThreads)
    KvTransportKernel(const __grid_constant__ KvTransportParams p) {
  const int64_t total = TransportUnits<Unit>(p);
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    Unit* pool = PoolUnit<Unit>(p, idx);
    Unit* buf = reinterpret_cast<Unit*>(p.buffer) + idx;
    if (p.to_buffer) {
      *buf = *pool;
    } else {
      *pool = *buf;
    }
  }
}

// The host tier's check: the KvChecksum of the run's transport form, read from the pool in
// place (the copy engines move the bytes). Each thread folds the 64-bit words of its 8- or
// 16-byte units; warps XOR-reduce and lane 0 adds the warp's share with one atomic. The terms are
// common/kv_checksum.h's own (constexpr, compiled for the device too), so both sides follow one
// definition.
template <typename Unit>
__global__ void __launch_bounds__(kThreads)
    KvChecksumKernel(const __grid_constant__ KvChecksumParams cp) {
  constexpr int kWords = sizeof(Unit) / sizeof(uint64_t);
  const KvTransportParams& p = cp.kv;
  const int64_t total = TransportUnits<Unit>(p);
  uint64_t sum = 0;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const Unit u = *PoolUnit<Unit>(p, idx);
    const uint64_t* w = reinterpret_cast<const uint64_t*>(&u);
#pragma unroll
    for (int k = 0; k < kWords; ++k) {
      sum ^= ::lazyrag::KvChecksumTerm(w[k], uint64_t(idx) * kWords + k);
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) sum ^= __shfl_xor_sync(0xffffffffu, sum, off);
  if ((threadIdx.x & 31) == 0 && sum != 0) atomicXor(cp.checksum, (unsigned long long)sum);
}

}  // namespace

absl::Status LaunchKvTransport(const KvTransportParams& p, cudaStream_t stream) {
  const int64_t elems = int64_t(p.num_layers) * 2 * p.num_tokens * p.kv_dim;
  if (elems == 0) return absl::OkStatus();
  if (p.kv_dim % 8 == 0) {
    KvTransportKernel<uint4><<<GridFor(elems / 8, kThreads), kThreads, 0, stream>>>(p);
  } else {
    KvTransportKernel<uint16_t><<<GridFor(elems, kThreads), kThreads, 0, stream>>>(p);
  }
  LAZYRAG_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status LaunchKvChecksum(const KvChecksumParams& cp, cudaStream_t stream) {
  const KvTransportParams& p = cp.kv;
  if (p.kv_dim % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv checksum: kv_dim ", p.kv_dim, " is not a multiple of 4"));
  }
  if (cp.checksum == nullptr) return absl::InvalidArgumentError("kv checksum: no checksum");
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(cp.checksum, 0, sizeof(unsigned long long), stream));
  const int64_t elems = int64_t(p.num_layers) * 2 * p.num_tokens * p.kv_dim;
  if (elems == 0) return absl::OkStatus();
  // A grid that fills the device once: the blocks stride, so the check takes few block slots
  // beside the forward step's kernels.
  constexpr int kChecksumBlocks = 1024;
  if (p.kv_dim % 8 == 0) {
    KvChecksumKernel<uint4>
        <<<std::min(GridFor(elems / 8, kThreads), kChecksumBlocks), kThreads, 0, stream>>>(cp);
  } else {
    KvChecksumKernel<uint2>
        <<<std::min(GridFor(elems / 4, kThreads), kChecksumBlocks), kThreads, 0, stream>>>(cp);
  }
  LAZYRAG_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace lazyrag::cuda_model
