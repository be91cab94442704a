// Deterministic synthetic weights: the value of element `index` of tensor `tag` depends only on
// (seed, tag, index), so the CPU loader and the CUDA backend (which generates weights directly
// in device memory) produce bit-identical fp32 values. Usable from host and device code.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define LAZYRAG_HD __host__ __device__ __forceinline__
#else
#define LAZYRAG_HD inline
#endif

namespace lazyrag {

// Tensor tags: tensor kind in the low byte, layer index above it.
enum SyntheticTensor : uint32_t {
  kSynEmbedding = 1, kSynFinalNorm = 2, kSynLmHead = 3,
  kSynAttnNorm = 16, kSynWq, kSynWk, kSynWv, kSynWo, kSynFfnNorm, kSynWGate, kSynWUp, kSynWDown,
};
LAZYRAG_HD uint32_t SyntheticTag(uint32_t kind, uint32_t layer) { return kind | (layer << 8); }

LAZYRAG_HD uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1).
LAZYRAG_HD float SyntheticUniform(uint64_t seed, uint32_t tag, uint64_t index) {
  uint64_t h = SplitMix64(seed ^ SplitMix64((uint64_t(tag) << 40) ^ index));
  return float(int64_t(h >> 40) - (int64_t(1) << 23)) * (1.0f / float(1 << 23));
}

// Norm weights: 1 + 0.1 u; linear weights: u * sqrt(3 / fan_in) (unit-variance outputs);
// embeddings: u.
LAZYRAG_HD float SyntheticNormWeight(uint64_t seed, uint32_t tag, uint64_t i) {
  return 1.0f + 0.1f * SyntheticUniform(seed, tag, i);
}
LAZYRAG_HD float SyntheticLinearWeight(uint64_t seed, uint32_t tag, uint64_t i, float bound) {
  return bound * SyntheticUniform(seed, tag, i);
}
// The `bound` for a linear weight with `fan_in` inputs: sqrtf(3.0f / float(fan_in)), computed
// in fp32 with IEEE division and square root on host and device alike.
LAZYRAG_HD float SyntheticLinearBound(uint32_t fan_in) { return sqrtf(3.0f / float(fan_in)); }

}  // namespace lazyrag
