// Fuzz entry point for the GGUF reader and the GGUF model loader. Built into the gtest mutation
// driver (gguf_fuzz_test.cc) and, with -DLAZYRAG_LIBFUZZER=ON and clang, into a libFuzzer binary.
// Any input must yield a status, never a crash, hang or huge allocation.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "worker/model/dequant.h"
#include "worker/model/gguf.h"
#include "worker/model/gguf_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lazyrag;
  auto file = GgufFile::FromBuffer(absl::string_view(reinterpret_cast<const char*>(data), size));
  if (!file.ok()) return 0;
  const GgufFile& f = **file;
  for (const auto& kv : f.metadata()) {
    (void)f.GetInt(kv.first);
    (void)f.GetFloat(kv.first);
    (void)f.GetString(kv.first);
    (void)f.GetBool(kv.first);
  }
  // Tensor data lies inside the input, so element counts are bounded by its size.
  for (const GgufTensorInfo& t : f.tensors()) {
    if (!IsDequantizable(t.type) || t.num_elements > (int64_t(1) << 22)) continue;
    std::vector<float> out(static_cast<size_t>(t.num_elements));
    (void)DequantizeTensor(t, out.data());
  }
  (void)TokenizerSpecFromGguf(f);
  LoadOptions options;
  options.max_host_bytes = int64_t(64) << 20;
  (void)LoadModelFromGguf(f, options);
  return 0;
}
