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
#include "worker/model/model_source.h"
#include "worker/model/tokenizer/tokenizer.h"
#include "worker/runtime/generator.h"

namespace lazyrag {

// The recompute_first_tokens that --recompute_first_tokens=-1 selects: the best exact match of k
// in {0, 4, 8, 16, 32} on bench/rag_qa's dev split (SmolLM2-135M, CPU and GPU; bench/README.md,
// Quality).
inline constexpr int kMeasuredRecomputeFirstTokens = 32;

// The drop_first_tokens that --drop_first_tokens=-1 (the worker's default) selects: of the
// settings that cost no TTFT, the best exact match summed over bench/rag_qa's 300-question dev
// splits (make_quality_sets.py --large; SmolLM2-135M, CPU and GPU; bench/README.md, Quality).
inline constexpr int kMeasuredDropFirstTokens = 1;

struct RuntimeOptions {
  std::string model;           // GGUF path, HF directory or synthetic:NAME[@SEED]
  std::string device = "cpu";  // cpu | cuda
  // The `model` label of the metrics and Stats' model (--served_model_name). Empty: the
  // model's own name (LoadedModel::name: a GGUF's general.name, else the file's stem).
  std::string served_model_name;
  int page_size = 16;         // tokens per KV page
  int64_t kv_pool_bytes = 0;  // all ranks together; 0: 256 MiB on the CPU, 16 GiB per GPU
  int prefill_chunk = 512;    // query rows per forward step during prefill
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
  // The workers' key for MACs on stored document KV (EngineOptions::kv_mac_key); null: none.
  std::shared_ptr<const DocumentMacKey> kv_mac_key;
  // Bytes of the host-memory tier (EngineOptions::host_cache_bytes). -1 (the default): sized
  // from the machine by DefaultHostCacheBytes; 0: no host tier; > 0: that many bytes, on any
  // device (on the CPU the pool already is host memory, but tests and benchmarks use it there
  // too). Below -1: CreateRuntime fails with INVALID_ARGUMENT.
  int64_t host_cache_bytes = -1;
  // Server defaults of the answer-quality settings (EngineOptions::quality; the worker's
  // --recompute_first_tokens, --drop_first_tokens). recompute_first_tokens -1:
  // kMeasuredRecomputeFirstTokens where the backend supports it (Backend::SupportsQualityViews:
  // CPU and CUDA), else 0. drop_first_tokens -1: kMeasuredDropFirstTokens where the backend
  // supports it and recompute_first_tokens resolved to 0 (the two exclude each other), else 0.
  // Otherwise out of range: CreateRuntime fails with INVALID_ARGUMENT.
  QualitySettings quality;
  // The engine's shared prefix (EngineOptions::shared_prefix, the worker's --shared_prefix):
  // "none" (or empty): documents encoded alone; "template": the prompt layout's fixed opening
  // (RagTemplate::Opening, ChatML "<|im_start|>system\n"), moved out of the prompt prefix into
  // the shared prefix. Anything else: INVALID_ARGUMENT.
  std::string shared_prefix = "none";
  // Control tokens inside callers' text (documents, query, system prompt) are literal text
  // (false, the default: only the chat template writes control tokens), or recognised as
  // control tokens (true, the behaviour before; --parse_special_tokens_in_text).
  bool parse_special_tokens_in_text = false;
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
  std::string model_name;  // served_model_name, or the model's own name
  int64_t page_bytes = 0;  // bytes of one KV page of the pool (all ranks together)
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<DocumentStore> store;  // null without a store; outlives the engine
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Generator> generator;
};

// Most bytes RuntimeOptions::host_cache_bytes = -1 gives: 64 GiB.
inline constexpr int64_t kMaxDefaultHostCacheBytes = int64_t(64) << 30;

// The host tier's size for RuntimeOptions::host_cache_bytes = -1 on `device`, given the memory
// the process may use (`memory_bytes`: the machine's RAM, or less under a cgroup limit): on
// cuda a quarter of it, at most kMaxDefaultHostCacheBytes; on cpu 0 (the KV pool already is
// host memory; a second copy there buys nothing). Pure: MachineMemoryBytes() gives the input.
int64_t DefaultHostCacheBytes(const std::string &device, int64_t memory_bytes);

// The memory this process may use: physical RAM (sysconf _SC_PHYS_PAGES x _SC_PAGE_SIZE), or
// the cgroup's memory limit when one is set and lower (a container's limit; v2 memory.max or
// v1 memory.limit_in_bytes). 0 when neither can be read.
int64_t MachineMemoryBytes();

// The host tier's bytes for a RuntimeOptions::host_cache_bytes value (see there):
// INVALID_ARGUMENT below -1.
absl::StatusOr<int64_t> ResolveHostCacheBytes(int64_t requested, const std::string &device,
                                              int64_t memory_bytes);

absl::StatusOr<std::unique_ptr<Runtime>> CreateRuntime(const RuntimeOptions &options);

}  // namespace lazyrag
