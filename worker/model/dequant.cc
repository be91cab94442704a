#include "worker/model/dequant.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/parallel.h"

namespace lazyrag {
namespace {

constexpr int kQK = 32;  // elements per block of Q4_0, Q4_1, Q8_0

uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

}  // namespace

float Fp16ToFp32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: mant * 2^-24, exact in fp32
      const float f = float(mant) * (1.0f / 16777216.0f);
      return sign ? -f : f;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else {
    bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

float Bf16ToFp32(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

bool IsDequantizable(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
      return true;
    default:
      return false;
  }
}

absl::Status DequantizeRow(GgmlType type, const uint8_t* src, int64_t n, float* dst) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, size_t(n) * 4);
      return absl::OkStatus();
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = Fp16ToFp32(LoadU16(src + 2 * i));
      return absl::OkStatus();
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFp32(LoadU16(src + 2 * i));
      return absl::OkStatus();
    case GgmlType::kQ8_0:
      if (n % kQK != 0) break;
      for (int64_t b = 0; b < n / kQK; ++b, src += 34, dst += kQK) {
        const float d = Fp16ToFp32(LoadU16(src));
        const int8_t* q = reinterpret_cast<const int8_t*>(src + 2);
        for (int i = 0; i < kQK; ++i) dst[i] = float(q[i]) * d;
      }
      return absl::OkStatus();
    case GgmlType::kQ4_0:
      if (n % kQK != 0) break;
      for (int64_t b = 0; b < n / kQK; ++b, src += 18, dst += kQK) {
        const float d = Fp16ToFp32(LoadU16(src));
        const uint8_t* qs = src + 2;
        for (int i = 0; i < kQK / 2; ++i) {
          dst[i] = float(int(qs[i] & 0x0f) - 8) * d;
          dst[i + kQK / 2] = float(int(qs[i] >> 4) - 8) * d;
        }
      }
      return absl::OkStatus();
    case GgmlType::kQ4_1:
      if (n % kQK != 0) break;
      for (int64_t b = 0; b < n / kQK; ++b, src += 20, dst += kQK) {
        const float d = Fp16ToFp32(LoadU16(src));
        const float m = Fp16ToFp32(LoadU16(src + 2));
        const uint8_t* qs = src + 4;
        for (int i = 0; i < kQK / 2; ++i) {
          dst[i] = float(qs[i] & 0x0f) * d + m;
          dst[i + kQK / 2] = float(qs[i] >> 4) * d + m;
        }
      }
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tensor type ", GgmlTypeName(type),
                       " is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(GgmlTypeName(type), ": element count ", n, " is not a multiple of 32"));
}

absl::Status DequantizeTensor(const GgufTensorInfo& t, float* dst) {
  if (!IsDequantizable(t.type)) return DequantizeRow(t.type, nullptr, 0, nullptr);
  const GgmlTypeTraits* traits = GetGgmlTypeTraits(static_cast<uint32_t>(t.type));
  const int64_t row = t.dims[0];
  const int64_t rows = t.num_elements / row;
  const int64_t row_bytes = row / traits->block_size * traits->type_size;
  ParallelFor(rows, std::max<int64_t>(1, 16384 / row), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      // Cannot fail: the type is supported and row is a multiple of the block size (checked
      // when the file was parsed).
      (void)DequantizeRow(t.type, t.data + r * row_bytes, row, dst + r * row);
    }
  });
  return absl::OkStatus();
}

}  // namespace lazyrag
