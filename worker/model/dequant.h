// Conversion of GGUF tensor data to fp32. Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1.
//
// Block layouts (32 elements per block, little-endian, `d` and `m` are IEEE fp16):
//   Q8_0 (34 bytes): d, int8 q[32];                    x[i] = q[i] * d
//   Q4_0 (18 bytes): d, uint8 qs[16];                  x[i] = (lo(qs[i]) - 8) * d,
//                                                      x[i + 16] = (hi(qs[i]) - 8) * d, i < 16
//   Q4_1 (20 bytes): d, m, uint8 qs[16];               x[i] = lo(qs[i]) * d + m,
//                                                      x[i + 16] = hi(qs[i]) * d + m
// where lo() is the low nibble and hi() the high nibble.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "worker/model/gguf.h"

namespace lazyrag {

float Fp16ToFp32(uint16_t h);
float Bf16ToFp32(uint16_t h);

// True for the types DequantizeRow handles.
bool IsDequantizable(GgmlType type);

// Converts `n` consecutive elements of `type` at `src` to fp32 in `dst[0, n)`.
// REQUIRES: n is a multiple of the type's block size; `src` holds n / block_size * type_size
// bytes (GgufTensorInfo::num_bytes for a whole tensor). INVALID_ARGUMENT for other types.
// Thread-compatible: no shared state.
absl::Status DequantizeRow(GgmlType type, const uint8_t* src, int64_t n, float* dst);

// Converts a whole tensor to fp32 in `dst[0, t.num_elements)`, rows in parallel (ParallelFor).
absl::Status DequantizeTensor(const GgufTensorInfo& t, float* dst);

}  // namespace lazyrag
