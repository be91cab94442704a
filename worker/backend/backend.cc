#include "worker/backend/backend.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/kv_checksum.h"

namespace lazyrag {

absl::StatusOr<std::unique_ptr<HostMemory>> Backend::AllocateHostMemory(int64_t bytes) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("host memory: ", bytes, " bytes asked"));
  }
  constexpr int64_t kAlign = 256;
  char* p = static_cast<char*>(std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign));
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host memory: cannot allocate ", bytes, " bytes"));
  }
  return std::make_unique<OwnedHostMemory>(p, bytes, [](char* q) { std::free(q); });
}

absl::StatusOr<KvTransferId> Backend::StartKvToHost(const std::vector<int32_t>& pages,
                                                    int num_tokens, char* dst) {
  std::string kv;
  if (absl::Status st = ExportKv(pages, num_tokens, &kv); !st.ok()) return st;
  std::memcpy(dst, kv.data(), kv.size());
  const KvTransferId id = next_transfer_++;
  done_transfers_[id] = KvChecksum(dst, kv.size());
  return id;
}

absl::StatusOr<KvTransferId> Backend::StartKvFromHost(const std::vector<int32_t>& pages,
                                                      int num_tokens, const char* src) {
  if (num_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("kv from host: ", num_tokens, " tokens"));
  }
  const int64_t bytes = KvBytes(num_tokens);
  const uint64_t checksum = KvChecksum(src, size_t(bytes));
  if (absl::Status st = ImportKv(pages, num_tokens, std::string_view(src, size_t(bytes)));
      !st.ok()) {
    return st;
  }
  const KvTransferId id = next_transfer_++;
  done_transfers_[id] = checksum;
  return id;
}

absl::StatusOr<std::optional<uint64_t>> Backend::PollKvTransfer(KvTransferId id) {
  auto it = done_transfers_.find(id);
  if (it == done_transfers_.end()) {
    return absl::NotFoundError(absl::StrCat("kv transfer ", id, ": unknown"));
  }
  const uint64_t checksum = it->second;
  done_transfers_.erase(it);
  return std::optional<uint64_t>(checksum);
}

absl::StatusOr<uint64_t> Backend::WaitKvTransfer(KvTransferId id) {
  for (;;) {
    absl::StatusOr<std::optional<uint64_t>> polled = PollKvTransfer(id);
    if (!polled.ok()) return polled.status();
    if (polled->has_value()) return **polled;
  }
}

}  // namespace lazyrag
