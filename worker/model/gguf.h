// GGUF (v2, v3) reader: header, metadata key/values of every type, tensor infos and the location
// of every tensor's data. Everything read from the file is validated before use (magic,
// version, counts against the file size, string and array lengths, dimensions, element-count
// overflow, tensor types, alignment, tensor data inside the file), so a corrupt or hostile file
// yields INVALID_ARGUMENT and never a crash or an absurd allocation.
//
// Format (little-endian):
//   "GGUF" u32 version, u64 n_tensors, u64 n_kv,
//   n_kv x (string key, u32 value_type, value),
//   n_tensors x (string name, u32 n_dims, n_dims x u64 ne (fastest-varying first), u32 ggml_type,
//                u64 offset relative to the data section),
//   padding to `general.alignment` (default 32), data section.
// A string is u64 length + bytes (no terminator). An array is u32 element type, u64 count,
// elements.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lazyrag {

// ggml tensor element types (values as stored in the file).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
};

// Layout of a ggml type: `block_size` elements stored in `type_size` bytes.
struct GgmlTypeTraits {
  const char* name;
  int64_t block_size;
  int64_t type_size;
};
// Null for types this reader does not know (the file is then rejected).
const GgmlTypeTraits* GetGgmlTypeTraits(uint32_t type);
std::string GgmlTypeName(GgmlType type);

enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
const char* GgufValueTypeName(GgufValueType type);

// One metadata value. Scalars: integers (and bools) in `int_value` (uint64 values above
// INT64_MAX are kept bit-for-bit in `uint_value`), floats in `float_value`, strings in `str`.
// Arrays: `array_type` says the element type and exactly one of the vectors holds the elements:
// integer/bool elements in `ints`, float elements in `floats`, strings in `strings`, nested
// arrays in `arrays`.
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  int64_t int_value = 0;
  uint64_t uint_value = 0;
  double float_value = 0.0;
  std::string str;

  GgufValueType array_type = GgufValueType::kUint8;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;
  std::vector<GgufValue> arrays;

  bool is_integer() const;  // any integer type or bool
  bool is_float() const {
    return type == GgufValueType::kFloat32 || type == GgufValueType::kFloat64;
  }
  // Number of array elements (0 for scalars).
  size_t array_size() const;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ne: fastest-varying first; a [out, in] matrix is {in, out}
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;  // from the start of the data section
  int64_t num_elements = 0;
  uint64_t num_bytes = 0;
  const uint8_t* data = nullptr;  // into the file's bytes; valid while the GgufFile lives
};

// A parsed GGUF file. Owns its bytes (a read-only mapping of the file, or a copy of a buffer).
// Immutable after construction, so safe to read from several threads.
class GgufFile {
 public:
  // Maps `path` and parses the header. NOT_FOUND if it cannot be opened; INVALID_ARGUMENT for a
  // malformed file. Only the header pages are touched; tensor data is paged in on use.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses a copy of `bytes` (tests, fuzzing).
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBuffer(absl::string_view bytes);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the data section

  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  // Null when absent.
  const GgufValue* Find(absl::string_view key) const;

  // Typed accessors: NOT_FOUND when absent, INVALID_ARGUMENT when the stored type does not fit
  // (wrong kind, or an integer that does not fit the range).
  absl::StatusOr<int64_t> GetInt(absl::string_view key) const;
  absl::StatusOr<double> GetFloat(absl::string_view key) const;  // float or integer values
  absl::StatusOr<std::string> GetString(absl::string_view key) const;
  absl::StatusOr<bool> GetBool(absl::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* FindTensor(absl::string_view name) const;

  const uint8_t* bytes() const { return bytes_; }
  size_t size() const { return size_; }

 private:
  GgufFile() = default;
  absl::Status Parse();

  const uint8_t* bytes_ = nullptr;
  size_t size_ = 0;
  void* mapping_ = nullptr;  // munmap on destruction when non-null
  std::string buffer_;       // owned copy for FromBuffer

  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> metadata_index_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
};

}  // namespace lazyrag
