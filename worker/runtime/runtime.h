// Everything one model needs to serve: weights on a backend, KV pool,
// tokenizer, template, engine and text generator, built from a model path or
// synthetic name.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/cache/document_store.h"
#include "worker/engine/engine.h"
#include "worker/runtime/generator.h"
#include "worker/model/model_source.h"
#include "worker/model/tokenizer/tokenizer.h"

namespace lazyrag {

struct RuntimeOptions {
  std::string model;           // GGUF path, HF directory or synthetic:NAME[@SEED]
  std::string device = "cpu";  // cpu | cuda
  int page_size = 16;          // tokens per KV page
  int64_t kv_pool_bytes = 0;   // all ranks together; 0: 256 MiB on the CPU, 16 GiB per GPU
  int prefill_chunk = 512;     // query rows per forward step during prefill
  bool reference_attention = false;
  // CUDA: the GPU index the backend runs on (with tensor parallelism the first of
  // cuda_device .. cuda_device + N - 1). Default 0. Two workers of one host on GPUs 0 and 1 take
  // documents from each other GPU to GPU (worker/peer).
  int cuda_device = 0;
  // Tensor parallelism: ranks (CPU: threads of this process; CUDA: GPUs cuda_device..+N-1, NCCL).
  // 1: the plain backend, no wrapper. The model's KV heads and intermediate size must divide.
  int tensor_parallel = 1;
  // CUDA: replay decode and short query steps from CUDA graphs (CudaBackendOptions::cuda_graphs).
  bool cuda_graphs = true;
  int max_batch_tokens = 2048;  // per-step token budget of the scheduler
  int max_running = 64;         // requests admitted at once
  int max_waiting = 256;        // waiting queue bound (RESOURCE_EXHAUSTED beyond)
  // Host bytes of document KV waiting for the store (EngineOptions::max_writeback_bytes).
  int64_t max_writeback_bytes = kDefaultMaxWritebackBytes;
  // Optional: opens the store tier once the model fingerprint (part of every
  // key) is known; the runtime owns the store. Empty: no store (pool ->
  // compute).
  std::function<absl::StatusOr<std::unique_ptr<DocumentStore>>(const std::string &fingerprint)>
      store_factory;
  // Optional, not owned, must outlive the runtime: where the engine exports its
  // metrics.
  metrics::Registry *registry = nullptr;
};

struct Runtime {
  ModelConfig config;
  std::string fingerprint;
  std::string model_name;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<DocumentStore> store;  // null without a store; outlives the engine
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Generator> generator;
};

absl::StatusOr<std::unique_ptr<Runtime>> CreateRuntime(const RuntimeOptions &options);

}  // namespace lazyrag
