// A KvEngine that passes every call to another: tests derive from it to delay or damage
// calls (kvstore_service_test, worker/cache/document_store_test). Header-only.
#pragma once

#include <memory>
#include <string_view>
#include <utility>

#include "kvstore/kv_engine.h"

namespace lazyrag::kvstore::testing {

class ForwardingEngine : public KvEngine {
 public:
  explicit ForwardingEngine(std::unique_ptr<KvEngine> inner) : inner_(std::move(inner)) {}
  absl::StatusOr<std::unique_ptr<PutSession>> BeginPut(std::string_view key,
                                                       const ValueLayout& layout) override {
    return inner_->BeginPut(key, layout);
  }
  absl::StatusOr<std::unique_ptr<ValueReader>> Open(std::string_view key) override {
    return inner_->Open(key);
  }
  absl::StatusOr<KeyStat> Stat(std::string_view key) override { return inner_->Stat(key); }
  absl::StatusOr<bool> Delete(std::string_view key) override { return inner_->Delete(key); }
  absl::StatusOr<uint64_t> EvictTo(uint64_t target) override { return inner_->EvictTo(target); }
  EngineUsage Usage() const override { return inner_->Usage(); }

 private:
  std::unique_ptr<KvEngine> inner_;
};

}  // namespace lazyrag::kvstore::testing
