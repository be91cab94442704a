// Everything one model needs to serve: weights on a backend, KV pool, tokenizer, template,
// engine and text generator, built from a model path or synthetic name.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/engine/engine.h"
#include "worker/engine/generator.h"
#include "worker/model/model_source.h"
#include "worker/model/tokenizer/tokenizer.h"

namespace lazyrag {

struct RuntimeOptions {
  std::string model;              // GGUF path, HF directory or synthetic:NAME[@SEED]
  std::string device = "cpu";     // cpu | cuda
  int page_size = 16;             // tokens per KV page
  int64_t kv_pool_bytes = 0;      // 0: 256 MiB on the CPU
  int prefill_chunk = 512;        // query rows per forward step during prefill
  bool reference_attention = false;
};

struct Runtime {
  ModelConfig config;
  std::string fingerprint;
  std::string model_name;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Generator> generator;
};

absl::StatusOr<std::unique_ptr<Runtime>> CreateRuntime(const RuntimeOptions& options);

}  // namespace lazyrag
