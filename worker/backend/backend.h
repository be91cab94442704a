// The device backend interface: one model on one device with its paged KV pool. The CPU
// backend (fp32, BLAS) is the ground truth; the CUDA backend (bf16) plugs in behind the same
// interface. Backends know nothing of gRPC, scheduling or cache policy (DESIGN section 9).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/attention/attention_cpu.h"
#include "worker/attention/segment_view.h"
#include "worker/model/config.h"

namespace lazyrag {

// One forward step over a batch of requests (prefill chunks and decode tokens mixed).
struct ForwardBatch {
  std::vector<int32_t> tokens;   // [T] token ids; requests are contiguous rows
  std::vector<int32_t> kv_pos;   // [T] local position at which each new key is rotated
  std::vector<int64_t> kv_slot;  // [T] page * page_size + offset where new K/V are written
  // Query rows = the T tokens. q_pos are logical positions. Every token's own K/V slot must be
  // covered by a segment of its request so that it attends to itself.
  SegmentViewHost view;
  std::vector<int32_t> logit_rows;  // rows whose logits are returned, in this order
};

enum class KvDtype { kFloat32 = 0, kBFloat16 = 1 };

// Host memory a backend copies document KV to and from at bus speed (pinned and mapped for the
// CUDA backend, the heap for the CPU one). Owned by the caller; freed on destruction.
class HostMemory {
 public:
  virtual ~HostMemory() = default;
  virtual char* data() = 0;  // 256-byte aligned
  virtual int64_t size() const = 0;
};

// HostMemory over `size` bytes at `data` that `release(data)` frees on destruction.
class OwnedHostMemory final : public HostMemory {
 public:
  OwnedHostMemory(char* data, int64_t size, void (*release)(char*))
      : data_(data), size_(size), release_(release) {}
  ~OwnedHostMemory() override { release_(data_); }
  OwnedHostMemory(const OwnedHostMemory&) = delete;
  OwnedHostMemory& operator=(const OwnedHostMemory&) = delete;
  char* data() override { return data_; }
  int64_t size() const override { return size_; }

 private:
  char* data_;
  int64_t size_;
  void (*release_)(char*);
};

// A copy between the KV pool and host memory queued by StartKvToHost / StartKvFromHost.
using KvTransferId = uint64_t;

// A worker's KV pool as it lends it to the other workers of its host (issue 9, the peer tier's
// fast path): an opaque handle another process can map (CUDA IPC of the pool allocation) and
// the pool's layout, [num_layers][K | V][num_pages * page_size, kv_dim] of elem_bytes
// (worker/backend/cuda/peer_copy.h).
struct PeerPoolHandle {
  std::string ipc_handle;   // opaque bytes (cudaIpcMemHandle_t)
  std::string device_uuid;  // the GPU holding the pool (16 bytes)
  int num_layers = 0;
  int num_pages = 0;
  int page_size = 0;
  int kv_dim = 0;
  int elem_bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual const ModelConfig& config() const = 0;

  // Allocates the KV pool: num_pages pages of page_size tokens, for every layer, K and V.
  virtual absl::Status InitPool(int num_pages, int page_size) = 0;
  virtual int num_pages() const = 0;
  virtual int page_size() const = 0;
  virtual KvDtype kv_dtype() const = 0;
  // Bytes of one page across all layers, K and V.
  int64_t BytesPerPage() const { return KvBytes(page_size()); }

  // Whether Forward honours the segment view's quality fields (seg_skip, seg_scale, seg_bias)
  // and Materialize MaterializeCopy::src_offset: what QualityOptions' recompute_first_tokens
  // and document temperature / scale need. A backend that does not rejects batches and copies
  // that use them with UNIMPLEMENTED.
  virtual bool SupportsQualityViews() const { return false; }

  // Writes the batch's new K/V into the pool, runs attention over the view and returns
  // logits [logit_rows.size(), vocab] (row-major) in `logits`.
  virtual absl::Status Forward(const ForwardBatch& batch, std::vector<float>* logits) = 0;

  // Greedy decoding's shortcut: Forward, but returning for each logit row only the id of its
  // largest logit (the lowest id among equal maxima; unspecified for a row with NaN logits),
  // [logit_rows.size()] in `ids`. This default scans Forward's logits on the host; the CUDA
  // backend reduces on the device and copies back one id per row instead of the whole
  // vocabulary (0.5 MB per row for Llama-3's 128k ids).
  virtual absl::Status ForwardArgmax(const ForwardBatch& batch, std::vector<int32_t>* ids) {
    std::vector<float> logits;
    if (absl::Status st = Forward(batch, &logits); !st.ok()) return st;
    ids->clear();
    const size_t rows = batch.logit_rows.size();
    if (rows == 0) return absl::OkStatus();
    const size_t vocab = logits.size() / rows;
    for (size_t r = 0; r < rows; ++r) {
      const float* row = logits.data() + r * vocab;
      ids->push_back(int32_t(std::max_element(row, row + vocab) - row));
    }
    return absl::OkStatus();
  }

  // MATERIALIZE (Block-Attention): copy + re-rotate on every layer.
  virtual absl::Status Materialize(const std::vector<MaterializeCopy>& copies) = 0;

  // Document KV in transport form (the kvstore payload): for each layer, K then V, each
  // [num_tokens, num_kv_heads, head_dim] in kv_dtype(). Tokens are read from / written to
  // slots 0..num_tokens-1 of the page run.
  virtual absl::Status ExportKv(const std::vector<int32_t>& pages, int num_tokens,
                                std::string* out) = 0;
  virtual absl::Status ImportKv(const std::vector<int32_t>& pages, int num_tokens,
                                std::string_view data) = 0;

  // Bytes of the transport form (ExportKv) of num_tokens tokens: layers x {K, V} x tokens x
  // kv_dim elements of kv_dtype().
  int64_t KvBytes(int64_t num_tokens) const {
    const ModelConfig& c = config();
    return int64_t(2) * c.num_layers * num_tokens * c.kv_dim() *
           (kv_dtype() == KvDtype::kFloat32 ? 4 : 2);
  }

  // The host tier's data path (worker/cache/host_tier.h). The defaults below are synchronous
  // (ExportKv / ImportKv through a copy and common/kv_checksum.h on the host: the CPU backend's
  // pool is host memory already, and test backends); the CUDA backend queues kernels that read
  // and write pinned host memory directly on a stream of their own, checksum included.
  //
  // Host memory of `bytes` (> 0) for StartKvToHost / StartKvFromHost. RESOURCE_EXHAUSTED when it
  // cannot be allocated.
  virtual absl::StatusOr<std::unique_ptr<HostMemory>> AllocateHostMemory(int64_t bytes);
  // Queues the copy of tokens [0, num_tokens) of the page run into `dst` (ExportKv's layout,
  // KvBytes(num_tokens) bytes, inside memory from AllocateHostMemory, valid until the transfer
  // is done), computing KvChecksum of the bytes copied. The pages may be freed and rewritten as
  // soon as this returns: later calls that write them are ordered after the copy.
  // INVALID_ARGUMENT for a bad run; FAILED_PRECONDITION before InitPool.
  virtual absl::StatusOr<KvTransferId> StartKvToHost(const std::vector<int32_t>& pages,
                                                     int num_tokens, char* dst);
  // Queues the copy of KvBytes(num_tokens) bytes at `src` (ExportKv's layout, valid until the
  // transfer is done) into the run's pages, computing KvChecksum of the bytes read. REQUIRES:
  // the pages are not read (Forward, ExportKv, ...) until PollKvTransfer reports it done.
  virtual absl::StatusOr<KvTransferId> StartKvFromHost(const std::vector<int32_t>& pages,
                                                       int num_tokens, const char* src);
  // Non-blocking: nullopt while the transfer runs; once it is done, the checksum of the bytes it
  // moved (the id is then forgotten). NOT_FOUND for an unknown id; INTERNAL when it failed.
  virtual absl::StatusOr<std::optional<uint64_t>> PollKvTransfer(KvTransferId id);
  // Blocks until the transfer is done; as PollKvTransfer otherwise.
  virtual absl::StatusOr<uint64_t> WaitKvTransfer(KvTransferId id);

  // Device-to-device document transfer between workers of one host (issue 9). Backends that
  // cannot share their pool with another process keep these defaults (UNIMPLEMENTED); the
  // engine then takes documents from peers in transport form (ExportKv / ImportKv).
  // The handle of this backend's pool, to send to peer workers. REQUIRES: InitPool.
  virtual absl::StatusOr<PeerPoolHandle> ExportPoolHandle() {
    return absl::UnimplementedError(name() + " backend: no pool sharing between processes");
  }
  // Copies whole pages peer_pages[i] of `peer`'s pool (all layers, K and V) into this pool's
  // pages own_pages[i]; returns once the copy is complete, so the peer may then unpin them.
  // INVALID_ARGUMENT when the layouts differ in page shape or a page is out of range.
  virtual absl::Status CopyPagesFromPeer(const PeerPoolHandle& peer,
                                         const std::vector<int32_t>& peer_pages,
                                         const std::vector<int32_t>& own_pages) {
    (void)peer;
    (void)peer_pages;
    (void)own_pages;
    return absl::UnimplementedError(name() + " backend: no pool sharing between processes");
  }

 private:
  // The synchronous defaults' finished transfers: id -> checksum, until polled.
  std::map<KvTransferId, uint64_t> done_transfers_;
  KvTransferId next_transfer_ = 1;
};

}  // namespace lazyrag
