// lazyrag-worker: one model on one device, serving lazyrag.v1.Inference.
//   lazyrag-worker --listen HOST:PORT --model PATH|synthetic:NAME --device
//   cpu|cuda [--cuda_device N] [--tp N] [--peers HOST:PORT,...]
//     --kvstore embedded:DIR|HOST:PORT,... --kv_pool_bytes N --page_size N
//     [--host_cache_bytes N] --max_batch_tokens N --metrics_port N [--http_listen HOST:PORT]
// Prints one line "lazyrag-worker ready grpc=HOST:PORT metrics=PORT [http=PORT]" on stdout
// once serving (ports resolved when 0 was asked), then runs until SIGINT or
// SIGTERM.
#include <cstdio>
#include <iostream>
#include <memory>

#include "absl/flags/flag.h"
#include "absl/time/clock.h"
#include "common/auth_flags.h"
#include "common/binary_flags.h"
#include "common/logging.h"
#include "common/native_blas.h"
#include "common/server_main.h"
#include "common/tls_flags.h"
#include "worker/peer/peer_store.h"
#include "worker/service/worker_server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "gRPC address HOST:PORT; port 0 picks one");
ABSL_FLAG(std::string, model, "", "GGUF path, Hugging Face directory or synthetic:NAME; required");
ABSL_FLAG(std::string, served_model_name, "",
          "the model's name in metrics (`model` label) and Stats; empty: the GGUF's "
          "general.name, else the file name without extension, or synthetic:NAME");
ABSL_FLAG(std::string, device, "cpu", "cpu | cuda");
ABSL_FLAG(int, cuda_device, 0,
          "cuda: the GPU index to run on (with --tp N: GPUs cuda_device..cuda_device+N-1)");
ABSL_FLAG(int, tp, 1,
          "tensor parallelism: ranks (cuda: GPUs cuda_device.. over NCCL; cpu: threads); 1: off");
ABSL_FLAG(bool, cuda_graphs, true,
          "cuda: replay decode and short query steps from CUDA graphs (captured on a step "
          "shape's second sighting)");
ABSL_FLAG(std::string, kvstore, "",
          "document store: embedded:DIR (in-process RocksDB) or "
          "HOST:PORT[,HOST:PORT...] "
          "(kvstore shards); empty: none (documents computed on a pool miss)");
ABSL_FLAG(std::string, kv_mac_key_file, "",
          "file of at least 32 secret bytes that only workers hold (e.g. openssl rand -hex 32):"
          " documents written to the store carry a MAC under it and a stored value without a"
          " valid one is a miss, recomputed and written back; every worker of a cluster needs the"
          " same key; empty: no MACs (the kvstore is trusted)");
ABSL_FLAG(int, kvstore_replication, 0,
          "copies of every document over the kvstore shards (1..shards); 0: 2 with at least 2 "
          "shards, else 1. Every worker of one store must use the same value");
ABSL_FLAG(double, kvstore_timeout_s, 10,
          "deadline of one document read from the kvstore (past it the document is computed)");
ABSL_FLAG(double, kvstore_put_timeout_s, 60,
          "deadline of one document write-back to the kvstore (background; a Put past it is "
          "abandoned)");
ABSL_FLAG(int64_t, kvstore_writeback_bytes, lazyrag::kDefaultMaxWritebackBytes,
          "host bytes of computed documents waiting for their write-back to the kvstore; "
          "documents past it are not written back");
ABSL_FLAG(std::string, peers, "",
          "HOST:PORT[,HOST:PORT...] of peer workers on this host, asked for a missing document "
          "before the kvstore; empty: none");
ABSL_FLAG(double, peer_timeout_s, 5, "deadline of one document transfer from a peer worker");
ABSL_FLAG(bool, peer_device_copy, true,
          "cuda: copy documents from peer workers' pools GPU to GPU when both can (false: always "
          "as bytes over gRPC)");
ABSL_FLAG(double, peer_lease_s, 10,
          "cuda: how long a peer keeps a document pinned for this worker's GPU-to-GPU copy");
ABSL_FLAG(int64_t, kv_pool_bytes, 0, "KV pool bytes; 0: 256 MiB on the CPU");
ABSL_FLAG(int64_t, host_cache_bytes, -1,
          "bytes of host memory for the host tier (documents evicted from the KV pool, and every "
          "computed one, copied back at bus speed before asking peers or the kvstore); -1: sized "
          "from the machine (cuda: a quarter of RAM or of the container's memory limit, at most "
          "64 GiB; cpu: 0, the pool already is host memory); 0: off; N > 0: N bytes (any "
          "device). Several workers on one host: set it, each takes its own");
ABSL_FLAG(int, page_size, 16, "tokens per KV page");
ABSL_FLAG(int, max_batch_tokens, 2048, "per-step token budget (decode + prefill rows)");
ABSL_FLAG(int, prefill_chunk, 512, "most prompt rows one request feeds per step");
ABSL_FLAG(int, max_running, 64, "requests admitted at once");
ABSL_FLAG(int, max_waiting, 256, "waiting queue bound; beyond it RESOURCE_EXHAUSTED");
ABSL_FLAG(int, max_tokens_limit, 4096, "largest max_tokens accepted");
ABSL_FLAG(int, max_prepare_texts, 256,
          "most texts one PrepareDocuments call may carry (more: RESOURCE_EXHAUSTED)");
ABSL_FLAG(int64_t, max_prepare_bytes, 16 << 20,
          "most text bytes, in all, one PrepareDocuments call may carry (more: "
          "RESOURCE_EXHAUSTED)");
ABSL_FLAG(std::string, http_listen, "",
          "address HOST:PORT of the OpenAI-compatible HTTP API (/v1/chat/completions, "
          "/v1/completions, /v1/models, /health); port 0 picks one; empty: off");
ABSL_FLAG(std::string, shared_prefix, "none",
          "documents encoded after a shared prefix (attention sink) that opens every prompt: "
          "none | template (the chat template's fixed opening); part of every document id");
ABSL_FLAG(bool, parse_special_tokens_in_text, false,
          "recognise control tokens (e.g. <|im_end|>) inside documents, queries and system "
          "prompts; false: they are literal text and only the chat template writes control "
          "tokens. Changes the token ids (and so the cache keys) of such documents");
ABSL_FLAG(double, document_temperature, 1.0,
          "LAZY/MATERIALIZE: temperature of the attention to documents (0.05 .. 20; 1: off); "
          "a request's quality.document_temperature overrides it");
ABSL_FLAG(double, document_scale, 1.0,
          "LAZY/MATERIALIZE: weight of the attention to documents (0.01 .. 100; 1: off); a "
          "request's quality.document_scale overrides it");
ABSL_FLAG(int, drop_first_tokens, -1,
          "LAZY/MATERIALIZE: leave each document's first m tokens (its own attention sink) out "
          "of the request's attention (0 .. 64; a request's quality.drop_first_tokens overrides "
          "it; excludes --recompute_first_tokens > 0). -1: the value measured best on "
          "bench/rag_qa's dev splits (lazyrag::kMeasuredDropFirstTokens) on backends that "
          "support it (CPU, CUDA) when no first-k recompute is set, 0 otherwise; 0: plain LAZY");
ABSL_FLAG(int, recompute_first_tokens, 0,
          "LAZY/MATERIALIZE: recompute each document's first k tokens at their true positions "
          "per request (0 .. 512; a request's quality.recompute_first_tokens overrides it). -1: "
          "the value measured best on bench/rag_qa's dev split "
          "(lazyrag::kMeasuredRecomputeFirstTokens) on backends that support it (CPU, CUDA), "
          "0 on the others");
ABSL_FLAG(int, metrics_port, 0, "port of the /metrics endpoint; 0 picks one, -1 disables");
ABSL_FLAG(std::string, metrics_host, "127.0.0.1",
          "address the /metrics endpoint binds (loopback by default; 0.0.0.0 or :: to be scraped)");
ABSL_FLAG(double, shutdown_grace_s, 10, "seconds running calls get to finish at shutdown");

int main(int argc, char **argv) {
  lazyrag::PreferNativeBlasKernels(argv);
  const lazyrag::BinaryCommandLine command_line = lazyrag::ParseBinaryCommandLine(
      argc, argv, "lazyrag-worker",
      "lazyrag-worker --listen HOST:PORT --model PATH|synthetic:NAME --device "
      "cpu|cuda [--cuda_device N] [--tp N] [--peers HOST:PORT,...] "
      "--kvstore embedded:DIR|HOST:PORT,... --kv_pool_bytes N --page_size N "
      "[--host_cache_bytes N] --max_batch_tokens N --metrics_port N");
  if (command_line.exit_code >= 0) return command_line.exit_code;

  lazyrag::WorkerServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.runtime.model = absl::GetFlag(FLAGS_model);
  options.runtime.device = absl::GetFlag(FLAGS_device);
  options.runtime.served_model_name = absl::GetFlag(FLAGS_served_model_name);
  options.runtime.tensor_parallel = absl::GetFlag(FLAGS_tp);
  options.runtime.cuda_device = absl::GetFlag(FLAGS_cuda_device);
  options.runtime.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  options.runtime.kv_pool_bytes = absl::GetFlag(FLAGS_kv_pool_bytes);
  options.runtime.host_cache_bytes = absl::GetFlag(FLAGS_host_cache_bytes);
  options.runtime.quality.recompute_first_tokens = absl::GetFlag(FLAGS_recompute_first_tokens);
  options.runtime.shared_prefix = absl::GetFlag(FLAGS_shared_prefix);
  options.runtime.parse_special_tokens_in_text = absl::GetFlag(FLAGS_parse_special_tokens_in_text);
  options.runtime.quality.document_temperature = float(absl::GetFlag(FLAGS_document_temperature));
  options.runtime.quality.document_scale = float(absl::GetFlag(FLAGS_document_scale));
  options.runtime.quality.drop_first_tokens = absl::GetFlag(FLAGS_drop_first_tokens);
  options.runtime.page_size = absl::GetFlag(FLAGS_page_size);
  options.runtime.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  options.runtime.prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
  options.runtime.max_running = absl::GetFlag(FLAGS_max_running);
  options.runtime.max_waiting = absl::GetFlag(FLAGS_max_waiting);
  options.runtime.max_writeback_bytes = absl::GetFlag(FLAGS_kvstore_writeback_bytes);
  options.kvstore = absl::GetFlag(FLAGS_kvstore);
  options.kv_mac_key_file = absl::GetFlag(FLAGS_kv_mac_key_file);
  options.kvstore_replication = absl::GetFlag(FLAGS_kvstore_replication);
  options.kvstore_timeout_s = absl::GetFlag(FLAGS_kvstore_timeout_s);
  options.kvstore_put_timeout_s = absl::GetFlag(FLAGS_kvstore_put_timeout_s);
  options.tls = lazyrag::TlsFilesFromFlags();
  options.auth = lazyrag::AuthFilesFromFlags();
  options.peers = lazyrag::SplitPeerList(absl::GetFlag(FLAGS_peers));
  options.peer_timeout_s = absl::GetFlag(FLAGS_peer_timeout_s);
  options.peer_lease_s = absl::GetFlag(FLAGS_peer_lease_s);
  options.peer_device_copy = absl::GetFlag(FLAGS_peer_device_copy);
  options.max_tokens_limit = absl::GetFlag(FLAGS_max_tokens_limit);
  options.max_prepare_texts = absl::GetFlag(FLAGS_max_prepare_texts);
  options.max_prepare_bytes = absl::GetFlag(FLAGS_max_prepare_bytes);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.http.listen = absl::GetFlag(FLAGS_http_listen);
  options.metrics_host = absl::GetFlag(FLAGS_metrics_host);
  if (options.runtime.model.empty()) {
    std::cerr << "lazyrag-worker: --model is required\n";
    return 2;
  }

  return lazyrag::RunServerUntilSignal(
      "lazyrag-worker", [&] { return std::make_unique<lazyrag::WorkerServer>(options); },
      absl::Seconds(absl::GetFlag(FLAGS_shutdown_grace_s)));
}
