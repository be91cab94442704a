// Building a model from an already parsed GGUF file (used by LoadModel, tests and the fuzzer).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "worker/model/gguf.h"
#include "worker/model/model_source.h"

namespace lazyrag {

// The tokenizer.ggml.* metadata and tokenizer.chat_template of `file`. INVALID_ARGUMENT when
// the model or tokens are missing or the metadata is inconsistent.
absl::StatusOr<TokenizerSpec> TokenizerSpecFromGguf(const GgufFile& file);

// Config, tokenizer and fp32 weights of a llama-architecture GGUF (Q/K rows converted to the
// rotate-half layout). Every tensor's presence, shape and type is checked before anything is
// allocated; INVALID_ARGUMENT names the first bad tensor. RESOURCE_EXHAUSTED when the fp32
// weights would exceed options.max_host_bytes. The fingerprint is the hex SHA-256 of the file.
absl::StatusOr<LoadedModel> LoadModelFromGguf(const GgufFile& file, const LoadOptions& options);

}  // namespace lazyrag
