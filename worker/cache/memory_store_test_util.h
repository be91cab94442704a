// An in-memory DocumentStore for tests: a kvstore stand-in that counts calls and fails every
// call while `down` is set. Header-only; include from test files only.
#pragma once

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "absl/synchronization/mutex.h"
#include "worker/cache/document_store.h"

namespace lazyrag {

class MemoryDocumentStore : public DocumentStore {
 public:
  std::string name() const override { return "memory"; }
  absl::StatusOr<StoredDocument> Get(const std::string &ns, const std::string &id) override {
    absl::MutexLock l(&mu);
    ++gets;
    if (down) return absl::UnavailableError("store down");
    auto it = docs.find(ns + "/" + id);
    if (it == docs.end()) return absl::NotFoundError("absent");
    return it->second;
  }
  // Copies into the sink's spans, like the kvstore client (unless `get_into` is cleared).
  // Chunks are not reported to `on_chunk`.
  absl::StatusOr<std::string> GetInto(const std::string &ns, const std::string &id,
                                      const DocumentSink &sink,
                                      const ChunkObserver & /*on_chunk*/) override {
    StoredDocument doc;
    {
      absl::MutexLock l(&mu);
      if (!get_into) return absl::UnimplementedError("memory store: GetInto off");
      ++gets;
      ++gets_into;
      if (down) return absl::UnavailableError("store down");
      auto it = docs.find(ns + "/" + id);
      if (it == docs.end()) return absl::NotFoundError("absent");
      doc = it->second;
    }
    auto spans = sink(doc.metadata, doc.bytes.size());
    if (!spans.ok()) return spans.status();
    std::string_view rest = doc.bytes;
    for (const ByteSpan &span : *spans) {
      const size_t n = std::min<size_t>(rest.size(), span.size);
      std::memcpy(span.data, rest.data(), n);
      rest.remove_prefix(n);
    }
    if (!rest.empty()) return absl::InternalError("memory store: sink too small");
    return doc.metadata;
  }
  absl::Status Put(const std::string &ns, const std::string &id,
                   const StoredDocument &doc) override {
    absl::MutexLock l(&mu);
    ++puts;
    if (down) return absl::UnavailableError("store down");
    docs[ns + "/" + id] = doc;
    return absl::OkStatus();
  }
  absl::StatusOr<bool> Contains(const std::string &ns, const std::string &id) override {
    absl::MutexLock l(&mu);
    ++contains;
    if (down) return absl::UnavailableError("store down");
    return docs.count(ns + "/" + id) > 0;
  }
  int Gets() {
    absl::MutexLock l(&mu);
    return gets;
  }
  int Puts() {
    absl::MutexLock l(&mu);
    return puts;
  }

  absl::Mutex mu;
  std::map<std::string, StoredDocument> docs;
  int gets = 0, puts = 0, contains = 0;
  int gets_into = 0;  // of `gets`, those through GetInto
  bool down = false;
  bool get_into = true;
};

}  // namespace lazyrag
