#include "worker/cache/document_store.h"

#include <algorithm>
#include <cstring>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/crc32c.h"
#include "kvstore/client/kvstore_client.h"
#include "kvstore/format.h"
#include "kvstore/kv_engine.h"

namespace lazyrag {
namespace {

// The RocksDB engine of the kvstore, in-process: same keys and layout as the
// service.
class EmbeddedDocumentStore : public DocumentStore {
 public:
  EmbeddedDocumentStore(std::string dir, std::string fingerprint,
                        std::unique_ptr<kvstore::KvEngine> engine)
      : dir_(std::move(dir)), fingerprint_(std::move(fingerprint)), engine_(std::move(engine)) {}

  std::string name() const override { return "embedded:" + dir_; }

  absl::StatusOr<StoredDocument> Get(const std::string &ns, const std::string &id) override {
    auto key = Key(ns, id);
    if (!key.ok()) return key.status();
    auto reader = engine_->Open(*key);
    if (!reader.ok()) return reader.status();
    const kvstore::ValueLayout &layout = (*reader)->layout();
    StoredDocument doc;
    doc.metadata = layout.metadata;
    doc.bytes.reserve(layout.total_size);
    for (uint32_t i = 0; i < layout.num_chunks; ++i) {
      std::string data;
      uint32_t crc = 0;
      if (auto st = (*reader)->ReadChunk(i, &data, &crc); !st.ok()) return st;
      doc.bytes += data;
    }
    if (doc.bytes.size() != layout.total_size) {
      return absl::DataLossError("embedded store: value shorter than its layout");
    }
    return doc;
  }

  // Chunks are not reported to `on_chunk` (the caller checks what it needs afterwards).
  absl::StatusOr<std::string> GetInto(const std::string &ns, const std::string &id,
                                      const DocumentSink &sink,
                                      const ChunkObserver & /*on_chunk*/) override {
    auto key = Key(ns, id);
    if (!key.ok()) return key.status();
    auto reader = engine_->Open(*key);
    if (!reader.ok()) return reader.status();
    const kvstore::ValueLayout &layout = (*reader)->layout();
    auto spans = sink(layout.metadata, layout.total_size);
    if (!spans.ok()) return spans.status();
    size_t span = 0;
    uint64_t into = 0;  // bytes of spans[span] filled
    std::string data;
    for (uint32_t i = 0; i < layout.num_chunks; ++i) {
      uint32_t crc = 0;
      if (auto st = (*reader)->ReadChunk(i, &data, &crc); !st.ok()) return st;
      for (std::string_view rest = data; !rest.empty();) {
        while (span < spans->size() && into == (*spans)[span].size) {
          ++span;
          into = 0;
        }
        if (span == spans->size()) return absl::InternalError("embedded store: sink too small");
        const uint64_t n = std::min<uint64_t>(rest.size(), (*spans)[span].size - into);
        std::memcpy((*spans)[span].data + into, rest.data(), n);
        into += n;
        rest.remove_prefix(n);
      }
    }
    return layout.metadata;
  }

  absl::StatusOr<bool> Contains(const std::string &ns, const std::string &id) override {
    auto key = Key(ns, id);
    if (!key.ok()) return key.status();
    auto stat = engine_->Stat(*key);
    if (!stat.ok()) return stat.status();
    return stat->present;
  }

  absl::Status Put(const std::string &ns, const std::string &id,
                   const StoredDocument &doc) override {
    auto key = Key(ns, id);
    if (!key.ok()) return key.status();
    kvstore::ValueLayout layout;
    layout.total_size = doc.bytes.size();
    layout.chunk_size = kvstore::kDefaultChunkBytes;
    layout.num_chunks = kvstore::NumChunks(layout.total_size, layout.chunk_size);
    layout.metadata = doc.metadata;
    auto session = engine_->BeginPut(*key, layout);
    if (!session.ok()) return session.status();
    for (uint32_t i = 0; i < layout.num_chunks; ++i) {
      std::string_view data(doc.bytes.data() + layout.ChunkBegin(i),
                            layout.ChunkEnd(i) - layout.ChunkBegin(i));
      if (auto st = (*session)->AddChunk(i, data, Crc32c(data)); !st.ok()) return st;
    }
    auto committed = (*session)->Commit();
    return committed.ok() ? absl::OkStatus() : committed.status();
  }

 private:
  absl::StatusOr<std::string> Key(const std::string &ns, const std::string &id) const {
    v1::KvKey key;
    key.mutable_document()->set_model_fingerprint(fingerprint_);
    key.mutable_document()->set_cache_namespace(ns);
    key.mutable_document()->set_document_id(id);
    return kvstore::EncodeKey(key);
  }

  const std::string dir_;
  const std::string fingerprint_;
  std::unique_ptr<kvstore::KvEngine> engine_;
};

// The kvstore service through the client library (placement, replicas,
// checksums).
class RemoteDocumentStore : public DocumentStore {
 public:
  RemoteDocumentStore(std::vector<std::string> shards, std::string fingerprint,
                      std::unique_ptr<kvstore::KvClient> client, absl::Duration put_timeout)
      : shards_(std::move(shards)),
        fingerprint_(std::move(fingerprint)),
        client_(std::move(client)),
        put_timeout_(put_timeout) {}

  std::string name() const override { return "kvstore:" + absl::StrJoin(shards_, ","); }

  absl::StatusOr<StoredDocument> Get(const std::string &ns, const std::string &id) override {
    auto value = client_->Get(kvstore::Key::Document(fingerprint_, ns, id));
    if (!value.ok()) return value.status();
    return StoredDocument{std::move(value->header.metadata), std::move(value->bytes), ""};
  }

  absl::StatusOr<std::string> GetInto(const std::string &ns, const std::string &id,
                                      const DocumentSink &sink,
                                      const ChunkObserver &on_chunk) override {
    kvstore::CallOptions call;
    call.on_chunk = on_chunk;
    call.on_chunk_verifies = on_chunk != nullptr;  // the caller's MAC covers every byte
    auto info = client_->GetInto(
        kvstore::Key::Document(fingerprint_, ns, id),
        [&sink](const kvstore::ValueHeader &header,
                uint64_t bytes) -> absl::StatusOr<std::vector<kvstore::MutableBytes>> {
          auto spans = sink(header.metadata, bytes);
          if (!spans.ok()) return spans.status();
          std::vector<kvstore::MutableBytes> out;
          for (const ByteSpan &b : *spans) out.push_back({b.data, b.size});
          return out;
        },
        kvstore::LayerSelection{}, call);
    if (!info.ok()) return info.status();
    return std::move(info->header.metadata);
  }

  absl::StatusOr<bool> Contains(const std::string &ns, const std::string &id) override {
    const kvstore::Key key = kvstore::Key::Document(fingerprint_, ns, id);
    // A check that saves a write-back is not worth a long wait on the fetch thread.
    kvstore::CallOptions call;
    call.timeout = absl::Seconds(1);
    auto info = client_->Stat(std::span<const kvstore::Key>(&key, 1), call);
    if (!info.ok()) return info.status();
    auto placement = client_->Placement(key);
    if (!placement.ok()) return placement.status();
    return !info->empty() && (*info)[0].replicas_present >= int(placement->size());
  }

  absl::Status Put(const std::string &ns, const std::string &id,
                   const StoredDocument &doc) override {
    kvstore::ValueHeader header;
    header.metadata = doc.metadata;
    kvstore::CallOptions call;
    call.timeout = put_timeout_;
    return client_->Put(kvstore::Key::Document(fingerprint_, ns, id), header, doc.bytes, call);
  }

 private:
  const std::vector<std::string> shards_;
  const std::string fingerprint_;
  std::unique_ptr<kvstore::KvClient> client_;
  const absl::Duration put_timeout_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DocumentStore>> OpenDocumentStore(const DocumentStoreOptions &o) {
  if (o.model_fingerprint.empty()) {
    return absl::InvalidArgumentError("document store: model fingerprint is empty");
  }
  constexpr std::string_view kEmbedded = "embedded:";
  if (o.spec.rfind(kEmbedded, 0) == 0) {
    std::string dir = o.spec.substr(kEmbedded.size());
    if (dir.empty()) return absl::InvalidArgumentError("--kvstore embedded:DIR needs a directory");
    kvstore::RocksEngineOptions ro;
    ro.data_dir = dir;
    ro.capacity_bytes = o.embedded_capacity_bytes;
    ro.sync_commits = false;  // a lost write-back is recomputed, never served wrong
    auto engine = kvstore::OpenRocksEngine(ro);
    if (!engine.ok()) return engine.status();
    return std::unique_ptr<DocumentStore>(
        new EmbeddedDocumentStore(dir, o.model_fingerprint, std::move(*engine)));
  }
  std::vector<std::string> shards = kvstore::SplitShardList(o.spec);
  if (shards.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kvstore '", o.spec, "': expected embedded:DIR or HOST:PORT[,...]"));
  }
  if (!(o.call_timeout_s > 0) || !(o.put_timeout_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("document store: the kvstore deadlines must be > 0 s (get ", o.call_timeout_s,
                     ", put ", o.put_timeout_s, ")"));
  }
  kvstore::KvClientOptions co;
  co.shards = shards;
  co.replication = o.replication;
  co.tls = o.tls;
  co.auth_token = o.auth_token;
  co.call_timeout = absl::Seconds(o.call_timeout_s);
  // A worker recomputes rather than waits: fail fast when the store is down.
  co.max_attempts = 2;
  co.read_reconnect_wait = absl::Milliseconds(100);
  co.reconnect_wait = absl::Milliseconds(300);
  auto client = kvstore::KvClient::Create(co);
  if (!client.ok()) return client.status();
  return std::unique_ptr<DocumentStore>(new RemoteDocumentStore(
      shards, o.model_fingerprint, std::move(*client), absl::Seconds(o.put_timeout_s)));
}

}  // namespace lazyrag
