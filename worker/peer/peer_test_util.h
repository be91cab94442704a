// Test helpers shared by the peer tier's tests (peer_store_test.cc, peer_service_test.cc,
// peer_engine_test.cc, one binary peer_test): a store wrapper that does not own its store, random
// bytes, a metric's value from a registry's text form, and a PeerDocuments service over a map of
// documents on a loopback port. Header-only; include from gtest files only. The test files put
// their tests in this namespace (inside an anonymous one) so that they name the helpers
// unqualified.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/grpc_server.h"
#include "common/metrics.h"
#include "gtest/gtest.h"
#include "worker/cache/memory_store_test_util.h"
#include "worker/peer/peer_service.h"

namespace lazyrag::peer_test {

// The model fingerprint FakePeer serves and the tests' stores ask for.
inline constexpr char kFingerprint[] = "model-fp";

using MemoryStore = MemoryDocumentStore;

// Wraps a store it does not own (the tests keep a pointer to look at its counters).
class Borrowed : public DocumentStore {
 public:
  explicit Borrowed(DocumentStore *s) : s_(s) {}
  std::string name() const override { return s_->name(); }
  absl::StatusOr<StoredDocument> Get(const std::string &ns, const std::string &id) override {
    return s_->Get(ns, id);
  }
  absl::Status Put(const std::string &ns, const std::string &id, const StoredDocument &d) override {
    return s_->Put(ns, id, d);
  }
  absl::StatusOr<std::string> GetInto(const std::string &ns, const std::string &id,
                                      const DocumentSink &sink,
                                      const ChunkObserver &on_chunk) override {
    return s_->GetInto(ns, id, sink, on_chunk);
  }

 private:
  DocumentStore *s_;
};

// `n` pseudo-random bytes from a generator seeded with `seed`.
inline std::string Bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char &c : s) c = char(rng());
  return s;
}

// The value of the sample whose line starts with `line_prefix` (name and labels) in the
// registry's text form; -1 when there is none.
inline double Metric(const metrics::Registry &r, const std::string &line_prefix) {
  const std::string text = r.Serialize();
  size_t pos = 0;
  while ((pos = text.find(line_prefix + " ", pos)) != std::string::npos) {
    if (pos == 0 || text[pos - 1] == '\n') return std::stod(text.substr(pos + line_prefix.size()));
    ++pos;
  }
  return -1;
}

// A worker's PeerDocuments service over a map of documents, on a loopback port.
class FakePeer {
 public:
  explicit FakePeer(PeerServiceOptions o = {}) {
    if (o.model_fingerprint.empty()) o.model_fingerprint = kFingerprint;
    service_ = std::make_unique<PeerDocumentsService>(
        [this](const std::string &id) -> absl::StatusOr<StoredDocument> {
          calls.fetch_add(1);
          if (block_ != nullptr) block_->WaitForNotification();
          absl::MutexLock l(&mu_);
          auto it = docs_.find(id);
          if (it == docs_.end()) return absl::NotFoundError("not resident");
          return it->second;
        },
        o);
    server_ = std::make_unique<GrpcServer>(GrpcServerOptions{});
    server_->AddService(service_.get());
    EXPECT_TRUE(server_->Start().ok());
  }
  void Add(const std::string &id, StoredDocument d) {
    absl::MutexLock l(&mu_);
    docs_[id] = std::move(d);
  }
  std::string address() const { return server_->address(); }
  void Stop() { server_->Shutdown(absl::Now()); }
  void BlockExports(absl::Notification *n) { block_ = n; }
  std::atomic<int> calls{0};

 private:
  absl::Mutex mu_;
  std::map<std::string, StoredDocument> docs_;
  absl::Notification *block_ = nullptr;
  std::unique_ptr<PeerDocumentsService> service_;
  std::unique_ptr<GrpcServer> server_;
};

}  // namespace lazyrag::peer_test
