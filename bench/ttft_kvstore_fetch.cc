#include "bench/ttft_kvstore_fetch.h"

#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/status.h"
#include "common/testing/child_process.h"
#include "kvstore/client/kvstore_client.h"
#include "worker/engine/document_mac.h"

namespace lazyrag::bench {

absl::Status MeasureKvstoreFetch(const std::string& binary, Backend& backend,
                                 const Engine::PinnedDocument& doc, const std::string& kv,
                                 uint64_t checksum, KvstoreFetch* out) {
  const char* tmp_env = std::getenv("TMPDIR");
  std::string dir = std::string(tmp_env != nullptr ? tmp_env : "/tmp") + "/ttft_kvstore.XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) return absl::InternalError("mkdtemp");
  testing::ChildProcess server(
      {binary, "--listen=127.0.0.1:0", "--data_dir=" + dir + "/db", "--metrics_port=-1"});
  RETURN_IF_ERROR(server.Start());
  ASSIGN_OR_RETURN(const std::string line, server.WaitForLine("", absl::Seconds(30)));
  // A second shard with authentication on (common/auth.h), running beside the first: every call
  // to it carries a worker token.
  const std::string token = "ttft-bench-worker-token-0123456789";
  {
    std::ofstream tokens(dir + "/tokens");
    tokens << token << " cluster worker\n";
  }
  testing::ChildProcess auth_server({binary, "--listen=127.0.0.1:0", "--data_dir=" + dir + "/db2",
                                     "--metrics_port=-1", "--auth_tokens_file=" + dir + "/tokens"});
  RETURN_IF_ERROR(auth_server.Start());
  ASSIGN_OR_RETURN(const std::string auth_line, auth_server.WaitForLine("", absl::Seconds(30)));
  kvstore::KvClientOptions co;
  co.shards = {testing::FieldOf(line, "grpc")};
  co.call_timeout = absl::Seconds(120);
  ASSIGN_OR_RETURN(std::unique_ptr<kvstore::KvClient> client, kvstore::KvClient::Create(co));
  co.shards = {testing::FieldOf(auth_line, "grpc")};
  co.auth_token = BearerToken::Fixed(token);
  ASSIGN_OR_RETURN(std::unique_ptr<kvstore::KvClient> auth_client, kvstore::KvClient::Create(co));
  constexpr int kParallel = 4;
  auto key = [](int i) { return kvstore::Key::Document("ttft-bench", "", absl::StrCat("doc", i)); };
  for (int i = 0; i < kParallel; ++i) RETURN_IF_ERROR(client->Put(key(i), {}, kv));
  std::vector<std::unique_ptr<HostMemory>> pinned;
  for (int i = 0; i < kParallel; ++i) {
    ASSIGN_OR_RETURN(std::unique_ptr<HostMemory> m, backend.AllocateHostMemory(int64_t(kv.size())));
    std::memset(m->data(), 0, kv.size());  // touched once, as the host tier's arena is
    pinned.push_back(std::move(m));
  }
  RETURN_IF_ERROR(auth_client->Put(key(1), {}, kv));  // fetched into pinned[1]
  // GetInto's destination: pinned[i], for a value of the document's size only.
  auto into_pinned = [&](int i) {
    return [&, i](const kvstore::ValueHeader&,
                  uint64_t bytes) -> absl::StatusOr<std::vector<kvstore::MutableBytes>> {
      if (bytes != kv.size()) return absl::DataLossError("stored size differs");
      return std::vector<kvstore::MutableBytes>{{pinned[i]->data(), bytes}};
    };
  };
  auto fetch_from = [&](kvstore::KvClient* from, int i) {
    return from->GetInto(key(i), into_pinned(i));
  };
  auto fetch = [&](int i) { return fetch_from(client.get(), i); };
  // A worker with --kv_mac_key_file checks the MAC in the pass that lands each chunk, instead
  // of the client's CRC-32C (worker/engine/document_mac.h); the tag is computed once here.
  const std::shared_ptr<const DocumentMacKey> mac_key =
      DocumentMacKey::FromSecret("ttft_bench MAC key, 32 bytes or more");
  const std::array<uint8_t, kMacNonceBytes> nonce = NewMacNonce();
  const DocumentMacBinding binding = {"", "ttft-bench", "", "doc0"};
  const MacTag tag = ComputeDocumentMac(*mac_key, nonce, binding, kv);
  auto fetch_mac = [&]() -> absl::Status {
    std::unique_ptr<DocumentMacCheck> check;
    kvstore::CallOptions call;
    call.on_chunk = [&check](uint64_t offset, const char* data, uint64_t size) {
      check->Observe(offset, data, size);
    };
    call.on_chunk_verifies = true;
    ASSIGN_OR_RETURN(const kvstore::ValueInfo info,
                     client->GetInto(
                         key(0),
                         [&](const kvstore::ValueHeader&,
                             uint64_t bytes) -> absl::StatusOr<std::vector<kvstore::MutableBytes>> {
                           if (bytes != kv.size()) return absl::DataLossError("size differs");
                           check = std::make_unique<DocumentMacCheck>(mac_key.get(), nonce, bytes);
                           return std::vector<kvstore::MutableBytes>{{pinned[0]->data(), bytes}};
                         },
                         kvstore::LayerSelection{}, call));
    if (!check->Finish({{pinned[0]->data(), info.range_size}}, binding, tag)) {
      return absl::DataLossError("MAC check failed");
    }
    out->mac_observed_bytes = check->observed_bytes();
    return absl::OkStatus();
  };
  // The plain, the MAC'd and the authenticated fetch take turns going first, so none always
  // follows the previous repetition's copy into the pool.
  auto time_mac = [&](bool keep) -> absl::Status {
    const auto tm = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(fetch_mac());
    if (keep) {
      out->to_pinned_mac.ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - tm).count());
    }
    return absl::OkStatus();
  };
  auto time_plain = [&](bool keep) -> absl::Status {
    const auto t0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(const kvstore::ValueInfo info, fetch(0));
    const auto t1 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(const KvTransferId in,
                     backend.StartKvFromHost(doc.pages, doc.num_tokens, pinned[0]->data()));
    ASSIGN_OR_RETURN(const uint64_t in_sum, backend.WaitKvTransfer(in));
    const auto t2 = std::chrono::steady_clock::now();
    if (in_sum != checksum) return absl::DataLossError("fetched KV differs from the pool's");
    out->local = info.local;
    if (!keep) return absl::OkStatus();  // first: connection and fast-path handshake
    out->to_pinned.ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    out->to_pool.ms.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
    return absl::OkStatus();
  };
  auto time_auth = [&](bool keep) -> absl::Status {
    const auto t0 = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(fetch_from(auth_client.get(), 1).status());
    if (keep) {
      out->to_pinned_auth.ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    return absl::OkStatus();
  };
  const std::array<std::function<absl::Status(bool)>, 3> kinds = {time_plain, time_mac, time_auth};
  for (int rep = 0; rep < 10; ++rep) {
    for (int j = 0; j < 3; ++j) RETURN_IF_ERROR(kinds[(rep + j) % 3](rep > 0));
  }
  if (std::memcmp(pinned[1]->data(), kv.data(), kv.size()) != 0) {
    return absl::DataLossError("the authenticated fetch returned other bytes");
  }
  std::vector<double> gbps;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<absl::Status> results(kParallel);
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int i = 0; i < kParallel; ++i) {
      threads.emplace_back([&, i] { results[i] = fetch(i).status(); });
    }
    for (auto& t : threads) t.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (const auto& r : results) RETURN_IF_ERROR(r);
    gbps.push_back(double(kv.size()) * kParallel / s / 1e9);
  }
  std::sort(gbps.begin(), gbps.end());
  out->four_gbps = gbps[1];
  for (int i = 0; i < kParallel; ++i) {
    if (std::memcmp(pinned[i]->data(), kv.data(), kv.size()) != 0) {
      return absl::DataLossError("a concurrent fetch returned other bytes");
    }
  }
  server.Stop(SIGTERM, absl::Seconds(20));
  auth_server.Stop(SIGTERM, absl::Seconds(20));
  std::filesystem::remove_all(dir);
  return absl::OkStatus();
}

}  // namespace lazyrag::bench
