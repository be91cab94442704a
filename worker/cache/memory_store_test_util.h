// An in-memory DocumentStore for tests: a kvstore stand-in that counts calls and fails every
// call while `down` is set. Header-only; include from test files only.
#pragma once

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
  bool down = false;
};

}  // namespace lazyrag
