// Writes the binary seed corpora of the fuzz targets (valid inputs the fuzzers mutate) into
// DIR/gguf, DIR/kv_format: small GGUF files (worker/model/gguf_test_util.h), encoded keys, a
// value header, an index record and a stored document, each behind its target's selector
// byte. Generated at fuzz time from the current formats rather than committed as binaries.
// Usage: make_fuzz_seeds DIR
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kvstore/format.h"
#include "kvstore/rocks_index.h"
#include "worker/engine/document_codec.h"
#include "worker/model/gguf_test_util.h"

namespace {

using namespace lazyrag;

void Write(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_fuzz_seeds DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir / "gguf");
  std::filesystem::create_directories(dir / "kv_format");

  ModelConfig c = testing_gguf::TinyGgufConfig();
  c.vocab_size = 8;
  c.hidden_size = 32;
  c.intermediate_size = 32;
  c.num_layers = 1;
  Write(dir / "gguf/tiny_tied", testing_gguf::TinyLlamaGguf(c));
  testing_gguf::TinyLlamaOptions o;
  o.tied = false;
  o.q8_tensor = "blk.0.ffn_up.weight";
  Write(dir / "gguf/tiny_q8", testing_gguf::TinyLlamaGguf(c, o));

  int n = 0;
  auto seed = [&](char selector, const std::string& bytes) {
    Write(dir / "kv_format" / ("seed" + std::to_string(n++)), std::string(1, selector) + bytes);
  };
  v1::KvKey raw;
  raw.set_raw("operator/key");
  if (auto k = kvstore::EncodeKey(raw); k.ok()) seed(0, *k);
  v1::KvKey doc;
  doc.mutable_document()->set_model_fingerprint("fp");
  doc.mutable_document()->set_document_id("0123456789abcdef");
  if (auto k = kvstore::EncodeKey(doc); k.ok()) seed(0, *k);

  kvstore::ValueLayout layout;
  layout.total_size = 5000;
  layout.chunk_size = 1024;
  layout.num_chunks = kvstore::NumChunks(layout.total_size, layout.chunk_size);
  layout.layer_offsets = {0, 2500};
  layout.metadata = "meta";
  v1::ValueHeader header;
  kvstore::LayoutToProto(layout, &header);
  seed(1, header.SerializeAsString());
  seed(2, kvstore::EncodeValueRecord(7, layout, std::vector<uint32_t>(layout.num_chunks, 42)));

  ModelConfig m = testing_gguf::TinyGgufConfig();
  const std::vector<int32_t> tokens = {1, 2, 3};
  for (KvDtype dtype : {KvDtype::kFloat32, KvDtype::kBFloat16}) {
    const std::string payload(DocumentPayloadBytes(m, dtype, int64_t(tokens.size())), '\x01');
    const StoredDocument stored = EncodeDocument(m, dtype, tokens, payload);
    seed(3, stored.metadata + stored.bytes);
  }
  std::printf("seeds: %d kv_format, 2 gguf in %s\n", n, dir.c_str());
  return 0;
}
