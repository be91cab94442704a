// A bounded mutation fuzzer over valid small GGUF files, calling the same entry point as the
// libFuzzer binary. Runs for LAZYRAG_FUZZ_SECONDS (default 15) seconds; LAZYRAG_FUZZ_SEED picks
// the random seed (default: time, printed so a failure can be replayed).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/model/gguf.h"
#include "worker/model/gguf_test_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace lazyrag {
namespace {

double FuzzSeconds() {
  if (const char* s = std::getenv("LAZYRAG_FUZZ_SECONDS")) return std::atof(s);
  return 15.0;
}

std::vector<std::string> SeedCorpus() {
  std::vector<std::string> corpus;
  ModelConfig c = testing_gguf::TinyGgufConfig();
  c.vocab_size = 8;
  c.hidden_size = 32;
  c.intermediate_size = 32;
  c.num_layers = 1;
  corpus.push_back(testing_gguf::TinyLlamaGguf(c));
  testing_gguf::TinyLlamaOptions o;
  o.tied = false;
  o.q8_tensor = "blk.0.ffn_up.weight";
  corpus.push_back(testing_gguf::TinyLlamaGguf(c, o));
  testing_gguf::GgufWriter w;
  w.AddU32("general.alignment", 64);
  w.set_alignment(64);
  w.AddStringArray("sa", {"x", "yy"});
  w.AddI32Array("ia", {1, 2, 3});
  w.AddBool("b", true);
  w.AddTensor("f16", {4}, GgmlType::kF16, std::string(8, '\x3c'));
  w.AddTensor("q4", {32}, GgmlType::kQ4_0, std::string(18, '\x11'));
  w.AddTensor("q41", {32}, GgmlType::kQ4_1, std::string(20, '\x22'));
  w.AddTensor("bf", {2}, GgmlType::kBF16, std::string(4, '\x3f'));
  corpus.push_back(w.Build());
  return corpus;
}

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  std::string Mutate(std::string s, size_t header_end) {
    const int n = 1 + int(Uniform(4));
    for (int k = 0; k < n; ++k) MutateOnce(s, header_end);
    return s;
  }

 private:
  uint64_t Uniform(uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  // Header bytes are the interesting ones: pick there most of the time.
  size_t Pos(const std::string& s, size_t header_end) {
    if (s.empty()) return 0;
    const size_t limit =
        (Uniform(10) < 8 && header_end > 0) ? std::min(header_end, s.size()) : s.size();
    return size_t(Uniform(limit));
  }
  template <typename T>
  void Overwrite(std::string& s, size_t pos, T v) {
    if (pos + sizeof(T) > s.size()) return;
    std::memcpy(&s[pos], &v, sizeof(T));
  }

  void MutateOnce(std::string& s, size_t header_end) {
    static const uint64_t k64[] = {0,
                                   1,
                                   2,
                                   31,
                                   32,
                                   33,
                                   255,
                                   0xffffffffull,
                                   uint64_t(1) << 32,
                                   uint64_t(1) << 60,
                                   uint64_t(1) << 62,
                                   uint64_t(1) << 63,
                                   ~uint64_t(0),
                                   ~uint64_t(0) - 1};
    static const uint32_t k32[] = {0,  1,  2,  3,  4,  5,  6,  7,          8,         9,
                                   10, 12, 13, 24, 30, 31, 99, 0x7fffffff, 0xffffffff};
    static const uint8_t k8[] = {0, 1, 2, 0x7f, 0x80, 0xff, 0x20, 0x40};
    const size_t pos = Pos(s, header_end);
    switch (Uniform(8)) {
      case 0:  // bit flip
        if (!s.empty()) s[pos] ^= char(1u << Uniform(8));
        break;
      case 1:
        if (!s.empty()) s[pos] = char(k8[Uniform(sizeof(k8))]);
        break;
      case 2:
        Overwrite(s, pos, k32[Uniform(sizeof(k32) / 4)]);
        break;
      case 3:
        Overwrite(s, pos, k64[Uniform(sizeof(k64) / 8)]);
        break;
      case 4:  // truncate
        s.resize(size_t(Uniform(s.size() + 1)));
        break;
      case 5: {  // insert random bytes
        std::string ins(1 + Uniform(16), '\0');
        for (char& c : ins) c = char(Uniform(256));
        s.insert(std::min(pos, s.size()), ins);
        break;
      }
      case 6:  // delete a range
        if (!s.empty()) s.erase(pos, 1 + Uniform(16));
        break;
      case 7:  // random byte
        if (!s.empty()) s[pos] = char(Uniform(256));
        break;
    }
  }

  std::mt19937_64 rng_;
};

// With LAZYRAG_FUZZ_CORPUS_OUT=DIR, also writes the seeds there (a corpus for gguf_fuzzer).
TEST(GgufFuzzTest, SeedsAreValid) {
  const char* out_dir = std::getenv("LAZYRAG_FUZZ_CORPUS_OUT");
  int i = 0;
  for (const std::string& s : SeedCorpus()) {
    if (out_dir != nullptr) {
      std::ofstream(std::string(out_dir) + "/seed" + std::to_string(i++) + ".gguf",
                    std::ios::binary)
          << s;
    }
    auto f = GgufFile::FromBuffer(s);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size()), 0);
  }
}

TEST(GgufFuzzTest, MutationLoop) {
  uint64_t seed = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  if (const char* s = std::getenv("LAZYRAG_FUZZ_SEED")) seed = std::strtoull(s, nullptr, 10);
  std::printf("LAZYRAG_FUZZ_SEED=%llu LAZYRAG_FUZZ_SECONDS=%.1f\n", (unsigned long long)seed,
              FuzzSeconds());
  const std::vector<std::string> corpus = SeedCorpus();
  std::vector<size_t> header_ends;
  for (const std::string& s : corpus)
    header_ends.push_back((*GgufFile::FromBuffer(s))->data_offset());
  Mutator mutator(seed);
  std::mt19937_64 pick(seed ^ 0x5eed);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(FuzzSeconds());
  int64_t iterations = 0, parsed = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    const size_t k = pick() % corpus.size();
    const std::string input = mutator.Mutate(corpus[k], header_ends[k]);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
    parsed += GgufFile::FromBuffer(input).ok();
    ++iterations;
  }
  std::printf("fuzz: %lld inputs, %lld parsed as valid GGUF\n", (long long)iterations,
              (long long)parsed);
  EXPECT_GT(iterations, 0);
}

}  // namespace
}  // namespace lazyrag
