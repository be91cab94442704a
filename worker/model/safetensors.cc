#include "worker/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json.h"
#include "common/parallel.h"
#include "common/sha256.h"
#include "common/status.h"
#include "worker/model/dequant.h"

namespace lazyrag {
namespace {

constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;

// A read-only mapping of a whole file.
class MappedFile {
 public:
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      std::string msg = absl::StrCat("cannot open ", path, ": ", std::strerror(err));
      return err == ENOENT ? absl::NotFoundError(msg) : absl::InvalidArgumentError(msg);
    }
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
    }
    auto f = std::unique_ptr<MappedFile>(new MappedFile());
    f->size_ = size_t(st.st_size);
    if (f->size_ > 0) {
      void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        return absl::InternalError(absl::StrCat("mmap of ", path, " failed: ", std::strerror(err)));
      }
      f->data_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);
    return f;
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> f, MappedFile::Open(path));
  if (f->size() > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is too large (", f->size(), " bytes)"));
  }
  return std::string(reinterpret_cast<const char*>(f->data()), f->size());
}

struct StTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  uint64_t num_bytes = 0;
  std::string file;
};

int64_t DtypeSize(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2")
    return 1;
  return 0;
}

absl::StatusOr<int64_t> GetNonNegativeInt(const Json& v, absl::string_view what) {
  const std::optional<int64_t> i = JsonInt64(v);
  if (!i.has_value() || *i < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be a non-negative integer"));
  }
  return *i;
}

// Parses one safetensors file's header and adds its tensors to `out`.
absl::Status IndexSafetensors(const MappedFile& f, const std::string& path,
                              std::map<std::string, StTensor>* out) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": malformed safetensors: ", what));
  };
  if (f.size() < 8) return bad("file shorter than the 8-byte header length");
  uint64_t n = 0;
  std::memcpy(&n, f.data(), 8);
  if (n > f.size() - 8 || n > kMaxHeaderBytes) {
    return bad(absl::StrCat("header length ", n, " exceeds the file (", f.size(), " bytes)"));
  }
  absl::StatusOr<Json> header =
      ParseJson(absl::string_view(reinterpret_cast<const char*>(f.data() + 8), n));
  if (!header.ok()) return bad(header.status().message());
  if (!header->is_object()) return bad("header is not a JSON object");
  const uint8_t* base = f.data() + 8 + n;
  const uint64_t data_size = f.size() - 8 - n;
  for (const auto& [name, info] : header->items()) {
    if (name == "__metadata__") continue;
    const std::string what = absl::StrCat("tensor '", name, "'");
    const Json* dtype = JsonMember(info, "dtype");
    const Json* shape = JsonMember(info, "shape");
    const Json* offsets = JsonMember(info, "data_offsets");
    if (dtype == nullptr || !dtype->is_string() || shape == nullptr || !shape->is_array() ||
        offsets == nullptr || !offsets->is_array() || offsets->size() != 2) {
      return bad(absl::StrCat(what, " needs dtype, shape and data_offsets [begin, end]"));
    }
    StTensor t;
    t.dtype = dtype->get_ref<const std::string&>();
    t.file = path;
    const int64_t elem = DtypeSize(t.dtype);
    if (elem == 0) return bad(absl::StrCat(what, " has unknown dtype '", t.dtype, "'"));
    if (shape->size() > 8) return bad(absl::StrCat(what, " has too many dimensions"));
    int64_t count = 1;
    for (const Json& d : *shape) {
      absl::StatusOr<int64_t> dim = GetNonNegativeInt(d, absl::StrCat(what, " shape"));
      if (!dim.ok()) return bad(dim.status().message());
      if (*dim != 0 && count > std::numeric_limits<int64_t>::max() / elem / *dim) {
        return bad(absl::StrCat(what, " element count overflows"));
      }
      count *= *dim;
      t.shape.push_back(*dim);
    }
    absl::StatusOr<int64_t> begin = GetNonNegativeInt((*offsets)[0], what);
    absl::StatusOr<int64_t> end = GetNonNegativeInt((*offsets)[1], what);
    if (!begin.ok() || !end.ok()) return bad(absl::StrCat(what, " has bad data_offsets"));
    if (*begin > *end || uint64_t(*end) > data_size) {
      return bad(absl::StrCat(what, " data [", *begin, ", ", *end, ") lies outside the ", data_size,
                              "-byte data section"));
    }
    if (*end - *begin != count * elem) {
      return bad(absl::StrCat(what, " has ", *end - *begin, " bytes, shape needs ", count * elem));
    }
    t.data = base + *begin;
    t.num_bytes = uint64_t(*end - *begin);
    if (!out->emplace(name, std::move(t)).second) {
      return bad(absl::StrCat(what, " appears in more than one file"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> GetInt(const Json& cfg, absl::string_view key, std::optional<int> dflt) {
  const Json* v = JsonMember(cfg, key);
  if (v == nullptr || v->is_null()) {
    if (dflt.has_value()) return *dflt;
    return absl::InvalidArgumentError(absl::StrCat("config.json: '", key, "' is missing"));
  }
  const std::optional<int64_t> i = JsonInt64(*v);
  if (!i.has_value() || *i < std::numeric_limits<int>::min() ||
      *i > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: '", key, "' must be an integer"));
  }
  return int(*i);
}

absl::StatusOr<float> GetFloat(const Json& cfg, absl::string_view key, float dflt) {
  const Json* v = JsonMember(cfg, key);
  if (v == nullptr || v->is_null()) return dflt;
  if (!v->is_number()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: '", key, "' must be a number"));
  }
  return float(v->get<double>());
}

// bos/eos ids: an integer, a list (first element used) or absent (-1).
absl::StatusOr<int32_t> GetTokenId(const Json& cfg, absl::string_view key) {
  const Json* v = JsonMember(cfg, key);
  if (v == nullptr || v->is_null()) return -1;
  if (v->is_array() && !v->empty()) v = &(*v)[0];
  const std::optional<int64_t> i = JsonInt64(*v);
  if (!i.has_value() || *i < 0 || *i > (int64_t(1) << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: bad '", key, "'"));
  }
  return int32_t(*i);
}

}  // namespace

absl::StatusOr<ModelConfig> ParseHfConfigJson(absl::string_view json_text) {
  absl::StatusOr<Json> doc = ParseJson(json_text);
  if (!doc.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", doc.status().message()));
  }
  const Json& cfg = *doc;
  if (!cfg.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  ModelConfig c;
  if (const Json* mt = JsonMember(cfg, "model_type"); mt != nullptr && mt->is_string()) {
    if (mt->get_ref<const std::string&>() != "llama" &&
        mt->get_ref<const std::string&>() != "mistral") {
      return absl::InvalidArgumentError(absl::StrCat("config.json: model_type '",
                                                     mt->get_ref<const std::string&>(),
                                                     "' is not a llama-family decoder"));
    }
  }
  c.architecture = "llama";
  ASSIGN_OR_RETURN(c.vocab_size, GetInt(cfg, "vocab_size", std::nullopt));
  ASSIGN_OR_RETURN(c.hidden_size, GetInt(cfg, "hidden_size", std::nullopt));
  ASSIGN_OR_RETURN(c.intermediate_size, GetInt(cfg, "intermediate_size", std::nullopt));
  ASSIGN_OR_RETURN(c.num_layers, GetInt(cfg, "num_hidden_layers", std::nullopt));
  ASSIGN_OR_RETURN(c.num_heads, GetInt(cfg, "num_attention_heads", std::nullopt));
  ASSIGN_OR_RETURN(c.num_kv_heads, GetInt(cfg, "num_key_value_heads", c.num_heads));
  if (c.num_heads <= 0) return absl::InvalidArgumentError("config.json: num_attention_heads <= 0");
  ASSIGN_OR_RETURN(c.head_dim, GetInt(cfg, "head_dim", c.hidden_size / c.num_heads));
  ASSIGN_OR_RETURN(c.rms_norm_eps, GetFloat(cfg, "rms_norm_eps", 1e-6f));
  ASSIGN_OR_RETURN(c.rope_theta, GetFloat(cfg, "rope_theta", 10000.0f));
  ASSIGN_OR_RETURN(c.max_position, GetInt(cfg, "max_position_embeddings", 2048));
  if (const Json* tie = JsonMember(cfg, "tie_word_embeddings"); tie != nullptr && !tie->is_null()) {
    if (!tie->is_boolean()) {
      return absl::InvalidArgumentError("config.json: tie_word_embeddings must be a bool");
    }
    c.tie_word_embeddings = tie->get<bool>();
  }
  ASSIGN_OR_RETURN(c.bos_token_id, GetTokenId(cfg, "bos_token_id"));
  ASSIGN_OR_RETURN(c.eos_token_id, GetTokenId(cfg, "eos_token_id"));
  if (const Json* rs = JsonMember(cfg, "rope_scaling"); rs != nullptr && !rs->is_null()) {
    if (!rs->is_object()) return absl::InvalidArgumentError("config.json: bad rope_scaling");
    const Json* type = JsonMember(*rs, "rope_type");
    if (type == nullptr) type = JsonMember(*rs, "type");
    if (type == nullptr || !type->is_string()) {
      return absl::InvalidArgumentError("config.json: rope_scaling without rope_type");
    }
    if (type->get_ref<const std::string&>() == "llama3") {
      c.rope_scaling.type = RopeScaling::Type::kLlama3;
      ASSIGN_OR_RETURN(c.rope_scaling.factor, GetFloat(*rs, "factor", 8.0f));
      ASSIGN_OR_RETURN(c.rope_scaling.low_freq_factor, GetFloat(*rs, "low_freq_factor", 1.0f));
      ASSIGN_OR_RETURN(c.rope_scaling.high_freq_factor, GetFloat(*rs, "high_freq_factor", 4.0f));
      ASSIGN_OR_RETURN(c.rope_scaling.original_max_position,
                       GetInt(*rs, "original_max_position_embeddings", 8192));
      if (!(c.rope_scaling.factor > 0) || !(c.rope_scaling.low_freq_factor > 0) ||
          !(c.rope_scaling.high_freq_factor > c.rope_scaling.low_freq_factor) ||
          c.rope_scaling.original_max_position <= 0) {
        return absl::InvalidArgumentError("config.json: llama3 rope_scaling out of range");
      }
    } else if (type->get_ref<const std::string&>() != "default") {
      return absl::InvalidArgumentError(absl::StrCat("config.json: rope_scaling type '",
                                                     type->get_ref<const std::string&>(),
                                                     "' is not supported"));
    }
  }
  RETURN_IF_ERROR(c.Validate());
  return c;
}

absl::StatusOr<HfCheckpoint> LoadHfCheckpoint(const std::string& dir, int64_t max_host_bytes) {
  absl::StatusOr<std::string> config_text = ReadSmallFile(dir + "/config.json");
  if (!config_text.ok()) {
    return absl::Status(config_text.status().code(),
                        absl::StrCat("Hugging Face checkpoint: ", config_text.status().message()));
  }
  absl::StatusOr<ModelConfig> config = ParseHfConfigJson(*config_text);
  if (!config.ok()) {
    return absl::Status(config.status().code(), absl::StrCat(dir, "/", config.status().message()));
  }
  const ModelConfig& c = *config;
  const int64_t host_bytes = c.NumParameters() * int64_t(sizeof(float));
  if (host_bytes > max_host_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(dir, ": fp32 host weights need ", host_bytes,
                                                     " bytes, more than max_host_bytes ",
                                                     max_host_bytes));
  }

  // Weight files: the shards named by the index, else model.safetensors.
  std::vector<std::string> files;
  absl::StatusOr<std::string> index_text = ReadSmallFile(dir + "/model.safetensors.index.json");
  if (index_text.ok()) {
    absl::StatusOr<Json> index = ParseJson(*index_text);
    if (!index.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, "/model.safetensors.index.json: ", index.status().message()));
    }
    const Json* map = JsonMember(*index, "weight_map");
    if (map == nullptr || !map->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, "/model.safetensors.index.json: no weight_map object"));
    }
    std::set<std::string> names;
    for (const auto& [tensor, file] : map->items()) {
      if (!file.is_string() || file.get_ref<const std::string&>().find('/') != std::string::npos ||
          file.get_ref<const std::string&>().empty() ||
          file.get_ref<const std::string&>()[0] == '.') {
        return absl::InvalidArgumentError(
            absl::StrCat(dir, "/model.safetensors.index.json: bad file for '", tensor, "'"));
      }
      names.insert(file.get_ref<const std::string&>());
    }
    files.assign(names.begin(), names.end());
  } else if (index_text.status().code() == absl::StatusCode::kNotFound) {
    files.push_back("model.safetensors");
  } else {
    return index_text.status();
  }

  std::vector<std::unique_ptr<MappedFile>> mapped;
  std::map<std::string, StTensor> tensors;
  for (const std::string& name : files) {
    const std::string path = dir + "/" + name;
    ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> f, MappedFile::Open(path));
    RETURN_IF_ERROR(IndexSafetensors(*f, path, &tensors));
    mapped.push_back(std::move(f));
  }

  struct Job {
    const StTensor* t;
    std::vector<float>* dst;
  };
  std::vector<Job> jobs;
  auto expect = [&](const std::string& name, std::vector<int64_t> shape,
                    std::vector<float>* dst) -> absl::Status {
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": tensor '", name, "' is missing"));
    }
    const StTensor& t = it->second;
    if (t.shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": tensor '", name, "' has shape [",
                                                     absl::StrJoin(t.shape, ", "), "], expected [",
                                                     absl::StrJoin(shape, ", "), "]"));
    }
    if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16") {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": tensor '", name, "' has dtype ",
                                                     t.dtype, " (supported: F32, F16, BF16)"));
    }
    jobs.push_back({&t, dst});
    return absl::OkStatus();
  };

  auto w = std::make_unique<ModelWeights>();
  w->config = c;
  w->layers.resize(c.num_layers);
  const int64_t d = c.hidden_size, v = c.vocab_size, ff = c.intermediate_size;
  RETURN_IF_ERROR(expect("model.embed_tokens.weight", {v, d}, &w->token_embedding));
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights& L = w->layers[l];
    const std::string p = absl::StrCat("model.layers.", l, ".");
    RETURN_IF_ERROR(expect(p + "input_layernorm.weight", {d}, &L.attn_norm));
    RETURN_IF_ERROR(expect(p + "self_attn.q_proj.weight", {c.q_dim(), d}, &L.wq));
    RETURN_IF_ERROR(expect(p + "self_attn.k_proj.weight", {c.kv_dim(), d}, &L.wk));
    RETURN_IF_ERROR(expect(p + "self_attn.v_proj.weight", {c.kv_dim(), d}, &L.wv));
    RETURN_IF_ERROR(expect(p + "self_attn.o_proj.weight", {d, c.q_dim()}, &L.wo));
    RETURN_IF_ERROR(expect(p + "post_attention_layernorm.weight", {d}, &L.ffn_norm));
    RETURN_IF_ERROR(expect(p + "mlp.gate_proj.weight", {ff, d}, &L.w_gate));
    RETURN_IF_ERROR(expect(p + "mlp.up_proj.weight", {ff, d}, &L.w_up));
    RETURN_IF_ERROR(expect(p + "mlp.down_proj.weight", {d, ff}, &L.w_down));
  }
  RETURN_IF_ERROR(expect("model.norm.weight", {d}, &w->final_norm));
  if (!c.tie_word_embeddings) RETURN_IF_ERROR(expect("lm_head.weight", {v, d}, &w->lm_head));

  // Fingerprint (config.json, then the weight files in name order) while converting.
  std::string fingerprint;
  std::thread hasher([&] {
    Sha256 h;
    h.Update(*config_text);
    for (const auto& f : mapped) {
      if (f->size() > 0) h.Update(f->data(), f->size());
    }
    fingerprint = ToHex(h.Finish());
  });
  for (const Job& job : jobs) {
    const StTensor& t = *job.t;
    const GgmlType type = t.dtype == "F32"   ? GgmlType::kF32
                          : t.dtype == "F16" ? GgmlType::kF16
                                             : GgmlType::kBF16;
    const int64_t elem = DtypeSize(t.dtype);
    const int64_t n = int64_t(t.num_bytes) / elem;
    job.dst->resize(size_t(n));
    float* dst = job.dst->data();
    ParallelFor(n, 1 << 16, [&](int64_t begin, int64_t end) {
      (void)DequantizeRow(type, t.data + begin * elem, end - begin, dst + begin);
    });
  }
  hasher.join();

  HfCheckpoint out;
  out.config = c;
  out.weights = std::move(w);
  out.fingerprint = std::move(fingerprint);
  return out;
}

}  // namespace lazyrag
