#include "worker/model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace lazyrag {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayDepth = 3;
constexpr uint64_t kMaxAlignment = uint64_t(1) << 30;

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed GGUF: ", what));
}

// Bounds-checked little-endian reader over [data, data + size).
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  template <typename T>
  absl::Status Read(T* out, absl::string_view what) {
    if (remaining() < sizeof(T)) {
      return Malformed(absl::StrCat("file ends inside ", what, " at byte ", pos_));
    }
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  absl::Status ReadString(std::string* out, absl::string_view what) {
    uint64_t len = 0;
    RETURN_IF_ERROR(Read(&len, what));
    if (len > remaining()) {
      return Malformed(absl::StrCat(what, ": string length ", len, " at byte ", pos_ - 8,
                                    " exceeds the ", remaining(), " bytes left in the file"));
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return absl::OkStatus();
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Smallest number of bytes one value of `type` can occupy; 0 for an unknown type.
uint64_t MinValueBytes(uint32_t type) {
  switch (static_cast<GgufValueType>(type)) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
    case GgufValueType::kString:  // u64 length
      return 8;
    case GgufValueType::kArray:  // u32 type + u64 count
      return 12;
  }
  return 0;
}

template <typename T>
absl::Status ReadScalarAs(Cursor& c, absl::string_view what, int64_t* out) {
  T v{};
  RETURN_IF_ERROR(c.Read(&v, what));
  *out = static_cast<int64_t>(v);
  return absl::OkStatus();
}

// Reads one integer-like element (bool, 8..64-bit ints). For uint64 above INT64_MAX the bits are
// kept (callers that need the unsigned value read uint_value).
absl::Status ReadInteger(Cursor& c, GgufValueType type, absl::string_view what, int64_t* out,
                         uint64_t* out_unsigned) {
  switch (type) {
    case GgufValueType::kUint8:
      RETURN_IF_ERROR(ReadScalarAs<uint8_t>(c, what, out));
      break;
    case GgufValueType::kInt8:
      RETURN_IF_ERROR(ReadScalarAs<int8_t>(c, what, out));
      break;
    case GgufValueType::kBool: {
      uint8_t b = 0;
      RETURN_IF_ERROR(c.Read(&b, what));
      if (b > 1) return Malformed(absl::StrCat(what, ": bool value ", int(b), " is not 0 or 1"));
      *out = b;
      break;
    }
    case GgufValueType::kUint16:
      RETURN_IF_ERROR(ReadScalarAs<uint16_t>(c, what, out));
      break;
    case GgufValueType::kInt16:
      RETURN_IF_ERROR(ReadScalarAs<int16_t>(c, what, out));
      break;
    case GgufValueType::kUint32:
      RETURN_IF_ERROR(ReadScalarAs<uint32_t>(c, what, out));
      break;
    case GgufValueType::kInt32:
      RETURN_IF_ERROR(ReadScalarAs<int32_t>(c, what, out));
      break;
    case GgufValueType::kUint64: {
      uint64_t v = 0;
      RETURN_IF_ERROR(c.Read(&v, what));
      *out = static_cast<int64_t>(v);
      if (out_unsigned) *out_unsigned = v;
      return absl::OkStatus();
    }
    case GgufValueType::kInt64:
      RETURN_IF_ERROR(ReadScalarAs<int64_t>(c, what, out));
      break;
    default:
      return absl::InternalError("ReadInteger on a non-integer type");
  }
  if (out_unsigned) *out_unsigned = static_cast<uint64_t>(*out);
  return absl::OkStatus();
}

absl::Status ReadFloat(Cursor& c, GgufValueType type, absl::string_view what, double* out) {
  if (type == GgufValueType::kFloat32) {
    float f = 0;
    RETURN_IF_ERROR(c.Read(&f, what));
    *out = f;
  } else {
    RETURN_IF_ERROR(c.Read(out, what));
  }
  return absl::OkStatus();
}

bool IsIntegerType(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kBool:
      return true;
    default:
      return false;
  }
}

absl::Status ReadValue(Cursor& c, uint32_t raw_type, const std::string& key, int depth,
                       GgufValue* out) {
  if (MinValueBytes(raw_type) == 0) {
    return Malformed(absl::StrCat("metadata '", key, "' has unknown value type ", raw_type));
  }
  const auto type = static_cast<GgufValueType>(raw_type);
  out->type = type;
  const std::string what = absl::StrCat("metadata '", key, "'");
  if (IsIntegerType(type)) return ReadInteger(c, type, what, &out->int_value, &out->uint_value);
  if (type == GgufValueType::kFloat32 || type == GgufValueType::kFloat64) {
    return ReadFloat(c, type, what, &out->float_value);
  }
  if (type == GgufValueType::kString) return c.ReadString(&out->str, what);

  // Array.
  if (depth >= kMaxArrayDepth) {
    return Malformed(absl::StrCat(what, ": arrays nested deeper than ", kMaxArrayDepth));
  }
  uint32_t elem_raw = 0;
  uint64_t count = 0;
  RETURN_IF_ERROR(c.Read(&elem_raw, what));
  RETURN_IF_ERROR(c.Read(&count, what));
  const uint64_t min_bytes = MinValueBytes(elem_raw);
  if (min_bytes == 0) {
    return Malformed(absl::StrCat(what, ": array of unknown value type ", elem_raw));
  }
  // Every element takes at least min_bytes, so this bounds every allocation below by the file.
  if (count > c.remaining() / min_bytes) {
    return Malformed(absl::StrCat(what, ": array of ", count, " elements cannot fit in the ",
                                  c.remaining(), " bytes left in the file"));
  }
  const auto elem = static_cast<GgufValueType>(elem_raw);
  out->array_type = elem;
  if (IsIntegerType(elem)) {
    out->ints.resize(count);
    for (uint64_t i = 0; i < count; ++i) {
      RETURN_IF_ERROR(ReadInteger(c, elem, what, &out->ints[i], nullptr));
    }
  } else if (elem == GgufValueType::kFloat32 || elem == GgufValueType::kFloat64) {
    out->floats.resize(count);
    for (uint64_t i = 0; i < count; ++i) RETURN_IF_ERROR(ReadFloat(c, elem, what, &out->floats[i]));
  } else if (elem == GgufValueType::kString) {
    out->strings.resize(count);
    for (uint64_t i = 0; i < count; ++i) RETURN_IF_ERROR(c.ReadString(&out->strings[i], what));
  } else {
    out->arrays.resize(count);
    for (uint64_t i = 0; i < count; ++i) {
      RETURN_IF_ERROR(ReadValue(c, elem_raw, key, depth + 1, &out->arrays[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const GgmlTypeTraits* GetGgmlTypeTraits(uint32_t type) {
  static const GgmlTypeTraits kF32{"F32", 1, 4}, kF16{"F16", 1, 2}, kQ4_0{"Q4_0", 32, 18},
      kQ4_1{"Q4_1", 32, 20}, kQ5_0{"Q5_0", 32, 22}, kQ5_1{"Q5_1", 32, 24}, kQ8_0{"Q8_0", 32, 34},
      kQ8_1{"Q8_1", 32, 36}, kQ2_K{"Q2_K", 256, 84}, kQ3_K{"Q3_K", 256, 110},
      kQ4_K{"Q4_K", 256, 144}, kQ5_K{"Q5_K", 256, 176}, kQ6_K{"Q6_K", 256, 210},
      kQ8_K{"Q8_K", 256, 292}, kI8{"I8", 1, 1}, kI16{"I16", 1, 2}, kI32{"I32", 1, 4},
      kI64{"I64", 1, 8}, kF64{"F64", 1, 8}, kBF16{"BF16", 1, 2};
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32:
      return &kF32;
    case GgmlType::kF16:
      return &kF16;
    case GgmlType::kQ4_0:
      return &kQ4_0;
    case GgmlType::kQ4_1:
      return &kQ4_1;
    case GgmlType::kQ5_0:
      return &kQ5_0;
    case GgmlType::kQ5_1:
      return &kQ5_1;
    case GgmlType::kQ8_0:
      return &kQ8_0;
    case GgmlType::kQ8_1:
      return &kQ8_1;
    case GgmlType::kQ2_K:
      return &kQ2_K;
    case GgmlType::kQ3_K:
      return &kQ3_K;
    case GgmlType::kQ4_K:
      return &kQ4_K;
    case GgmlType::kQ5_K:
      return &kQ5_K;
    case GgmlType::kQ6_K:
      return &kQ6_K;
    case GgmlType::kQ8_K:
      return &kQ8_K;
    case GgmlType::kI8:
      return &kI8;
    case GgmlType::kI16:
      return &kI16;
    case GgmlType::kI32:
      return &kI32;
    case GgmlType::kI64:
      return &kI64;
    case GgmlType::kF64:
      return &kF64;
    case GgmlType::kBF16:
      return &kBF16;
  }
  return nullptr;
}

std::string GgmlTypeName(GgmlType type) {
  const GgmlTypeTraits* t = GetGgmlTypeTraits(static_cast<uint32_t>(type));
  return t ? t->name : absl::StrCat("type#", static_cast<uint32_t>(type));
}

const char* GgufValueTypeName(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
      return "uint8";
    case GgufValueType::kInt8:
      return "int8";
    case GgufValueType::kUint16:
      return "uint16";
    case GgufValueType::kInt16:
      return "int16";
    case GgufValueType::kUint32:
      return "uint32";
    case GgufValueType::kInt32:
      return "int32";
    case GgufValueType::kFloat32:
      return "float32";
    case GgufValueType::kBool:
      return "bool";
    case GgufValueType::kString:
      return "string";
    case GgufValueType::kArray:
      return "array";
    case GgufValueType::kUint64:
      return "uint64";
    case GgufValueType::kInt64:
      return "int64";
    case GgufValueType::kFloat64:
      return "float64";
  }
  return "unknown";
}

bool GgufValue::is_integer() const { return IsIntegerType(type); }

size_t GgufValue::array_size() const {
  if (type != GgufValueType::kArray) return 0;
  return ints.size() + floats.size() + strings.size() + arrays.size();
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    std::string msg = absl::StrCat("cannot open GGUF file ", path, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::InvalidArgumentError(msg);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {
    void* p = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat("mmap of ", path, " failed: ", std::strerror(err)));
    }
    file->mapping_ = p;
    file->bytes_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  absl::Status st2 = file->Parse();
  if (!st2.ok()) {
    return absl::Status(st2.code(), absl::StrCat(path, ": ", st2.message()));
  }
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBuffer(absl::string_view bytes) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->buffer_.assign(bytes.data(), bytes.size());
  file->bytes_ = reinterpret_cast<const uint8_t*>(file->buffer_.data());
  file->size_ = file->buffer_.size();
  RETURN_IF_ERROR(file->Parse());
  return file;
}

GgufFile::~GgufFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, size_);
}

absl::Status GgufFile::Parse() {
  Cursor c(bytes_, size_);
  uint32_t magic = 0;
  RETURN_IF_ERROR(c.Read(&magic, "the magic"));
  if (magic != kGgufMagic) {
    return Malformed(
        absl::StrCat("bad magic 0x", absl::Hex(magic, absl::kZeroPad8), " (expected \"GGUF\")"));
  }
  RETURN_IF_ERROR(c.Read(&version_, "the version"));
  if (version_ != 2 && version_ != 3) {
    return Malformed(absl::StrCat("unsupported version ", version_,
                                  " (supported: 2, 3; a huge value means a big-endian file)"));
  }
  uint64_t n_tensors = 0, n_kv = 0;
  RETURN_IF_ERROR(c.Read(&n_tensors, "the tensor count"));
  RETURN_IF_ERROR(c.Read(&n_kv, "the metadata count"));
  // A key/value takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least
  // 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset).
  if (n_kv > c.remaining() / 13) {
    return Malformed(
        absl::StrCat("metadata count ", n_kv, " cannot fit in a file of ", size_, " bytes"));
  }
  if (n_tensors > c.remaining() / 24) {
    return Malformed(
        absl::StrCat("tensor count ", n_tensors, " cannot fit in a file of ", size_, " bytes"));
  }

  metadata_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key;
    RETURN_IF_ERROR(c.ReadString(&key, absl::StrCat("metadata key #", i)));
    uint32_t type = 0;
    RETURN_IF_ERROR(c.Read(&type, absl::StrCat("the type of metadata '", key, "'")));
    GgufValue value;
    RETURN_IF_ERROR(ReadValue(c, type, key, 0, &value));
    if (!metadata_index_.emplace(key, metadata_.size()).second) {
      return Malformed(absl::StrCat("duplicate metadata key '", key, "'"));
    }
    metadata_.emplace_back(std::move(key), std::move(value));
  }

  if (const GgufValue* a = Find("general.alignment")) {
    if (!a->is_integer() || a->type == GgufValueType::kBool || a->int_value <= 0 ||
        uint64_t(a->int_value) > kMaxAlignment || (a->int_value & (a->int_value - 1)) != 0) {
      return Malformed("general.alignment must be a power-of-two integer");
    }
    alignment_ = static_cast<uint64_t>(a->int_value);
  } else {
    alignment_ = kDefaultAlignment;
  }

  tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    RETURN_IF_ERROR(c.ReadString(&t.name, absl::StrCat("tensor name #", i)));
    const std::string what = absl::StrCat("tensor '", t.name, "'");
    uint32_t n_dims = 0;
    RETURN_IF_ERROR(c.Read(&n_dims, what));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return Malformed(absl::StrCat(what, " has ", n_dims, " dimensions (1..", kMaxDims, ")"));
    }
    t.dims.resize(n_dims);
    int64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t ne = 0;
      RETURN_IF_ERROR(c.Read(&ne, what));
      if (ne == 0 || ne > uint64_t(std::numeric_limits<int64_t>::max())) {
        return Malformed(absl::StrCat(what, " dimension ", d, " = ", ne, " is out of range"));
      }
      if (int64_t(ne) > std::numeric_limits<int64_t>::max() / elements) {
        return Malformed(absl::StrCat(what, " element count overflows"));
      }
      t.dims[d] = static_cast<int64_t>(ne);
      elements *= static_cast<int64_t>(ne);
    }
    t.num_elements = elements;
    uint32_t type = 0;
    RETURN_IF_ERROR(c.Read(&type, what));
    const GgmlTypeTraits* traits = GetGgmlTypeTraits(type);
    if (traits == nullptr) {
      return Malformed(absl::StrCat(what, " has unknown tensor type ", type));
    }
    t.type = static_cast<GgmlType>(type);
    if (t.dims[0] % traits->block_size != 0) {
      return Malformed(absl::StrCat(what, " of type ", traits->name, ": row length ", t.dims[0],
                                    " is not a multiple of the block size ", traits->block_size));
    }
    const int64_t blocks = elements / traits->block_size;
    if (blocks > std::numeric_limits<int64_t>::max() / traits->type_size) {
      return Malformed(absl::StrCat(what, " byte size overflows"));
    }
    t.num_bytes = static_cast<uint64_t>(blocks * traits->type_size);
    RETURN_IF_ERROR(c.Read(&t.offset, what));
    if (t.offset % alignment_ != 0) {
      return Malformed(absl::StrCat(what, " data offset ", t.offset, " is not a multiple of the ",
                                    alignment_, "-byte alignment"));
    }
    if (!tensor_index_.emplace(t.name, tensors_.size()).second) {
      return Malformed(absl::StrCat("duplicate tensor name '", t.name, "'"));
    }
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment (the padding may be absent
  // when there are no tensors).
  const uint64_t end_of_header = c.pos();
  data_offset_ = (end_of_header + alignment_ - 1) / alignment_ * alignment_;
  if (!tensors_.empty() && data_offset_ > size_) {
    return Malformed(
        absl::StrCat("file ends at byte ", size_, " before the data section at ", data_offset_));
  }
  const uint64_t data_size = size_ > data_offset_ ? size_ - data_offset_ : 0;
  for (GgufTensorInfo& t : tensors_) {
    if (t.offset > data_size || t.num_bytes > data_size - t.offset) {
      return Malformed(absl::StrCat("tensor '", t.name, "' data [", t.offset, ", +", t.num_bytes,
                                    ") runs past the end of the file (data section holds ",
                                    data_size, " bytes)"));
    }
    t.data = bytes_ + data_offset_ + t.offset;
  }
  return absl::OkStatus();
}

const GgufValue* GgufFile::Find(absl::string_view key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

const GgufTensorInfo* GgufFile::FindTensor(absl::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<int64_t> GgufFile::GetInt(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat("GGUF metadata '", key, "' missing"));
  if (!v->is_integer() || v->type == GgufValueType::kBool) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GGUF metadata '", key, "' is a ", GgufValueTypeName(v->type), ", expected an integer"));
  }
  if (v->type == GgufValueType::kUint64 &&
      v->uint_value > uint64_t(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF metadata '", key, "' = ", v->uint_value, " is out of range"));
  }
  return v->int_value;
}

absl::StatusOr<double> GgufFile::GetFloat(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat("GGUF metadata '", key, "' missing"));
  if (v->is_float()) return v->float_value;
  if (v->is_integer() && v->type != GgufValueType::kBool) return double(v->int_value);
  return absl::InvalidArgumentError(absl::StrCat(
      "GGUF metadata '", key, "' is a ", GgufValueTypeName(v->type), ", expected a number"));
}

absl::StatusOr<std::string> GgufFile::GetString(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat("GGUF metadata '", key, "' missing"));
  if (v->type != GgufValueType::kString) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GGUF metadata '", key, "' is a ", GgufValueTypeName(v->type), ", expected a string"));
  }
  return v->str;
}

absl::StatusOr<bool> GgufFile::GetBool(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat("GGUF metadata '", key, "' missing"));
  if (v->type != GgufValueType::kBool) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GGUF metadata '", key, "' is a ", GgufValueTypeName(v->type), ", expected a bool"));
  }
  return v->int_value != 0;
}

}  // namespace lazyrag
