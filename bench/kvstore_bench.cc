// Throughput of the document-KV store against its peers, one run, one table (issue 3):
//   * memcpy of the same bytes (the machine's ceiling) and CRC-32C over them (a cost every
//     put and get pays),
//   * the RocksDB engine used in-process (the engine's ceiling), with and without an fsync per
//     commit,
//   * a real lazyrag-kvstore process on loopback through the client library (KvClient), with
//     and without --sync_commits,
//   * the same gRPC service with an in-memory engine in this process (gRPC framing, copies and
//     checksums without storage),
//   * a Debian redis-server (no persistence) through hiredis SET/GET,
//   * with --mac: the MAC pass alone, one thread (JSON mac_pass): CRC-32C and the workers' GMAC
//     (libcrypto's and the VPCLMULQDQ one, worker/engine/gmac.h) over one 256 KiB block in L2,
//     and the landing pass of a same-host get without the shard (pread of a page-cached file in
//     the client's 512 KiB steps into a buffer, then the check) for 1 and 4 threads,
//   * with --auth: bearer-token authentication's cost (issue 28), two lazyrag-kvstore processes
//     (gRPC streams, --sync_commits=false), one started with --auth_tokens_file and called with a
//     worker token, one without (and the token sent to that one, unchecked: the client's share),
//     for --size_mib values and for --auth_small_kib values (many calls per round, where the
//     per-call cost shows), printed as a cost table; with the certificates of --auth_tls_dir the
//     same over mTLS, the worker known by its certificate (no token) or by its token, against
//     mTLS without a token file.
// Every value is --size_mib MiB of pseudo-random bytes; N concurrent clients each put and get
// their own key; GB/s = N * size / wall time / 1e9, median over the repetitions. Every value
// read back is compared with what was written (outside the timed region).
//
//   kvstore_bench [--kvstore_binary PATH] [--redis_server PATH] [--out FILE] [--size_mib 256]
//                 [--clients 1,4] [--reps 5] [--reps_multi 3] [--breakdown] [--tmp_dir DIR]
//                 [--commit SHA] [--mac] [--only mac|auth]
//                 [--gmac_impl auto|openssl|vpclmulqdq-avx2|vpclmulqdq]
//                 [--auth] [--auth_small_kib 4] [--auth_small_calls 200]
//                 [--auth_tls_dir tests/fixtures/tls/identities]
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <latch>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/auth.h"
#include "common/crc32c.h"
#include "common/file_io.h"
#include "common/json.h"
#include "common/status.h"
#include "common/testing/child_process.h"
#include "kvstore/client/kvstore_client.h"
#include "kvstore/format.h"
#include "kvstore/kv_engine.h"
#include "kvstore/kvstore_server.h"
#include "worker/engine/document_mac.h"
#include "worker/engine/gmac.h"

#ifdef LAZYRAG_HAVE_HIREDIS
#include <hiredis/hiredis.h>
#endif

#ifndef LAZYRAG_KVSTORE_BINARY
#define LAZYRAG_KVSTORE_BINARY ""
#endif

ABSL_FLAG(std::string, kvstore_binary, LAZYRAG_KVSTORE_BINARY, "path of lazyrag-kvstore");
ABSL_FLAG(std::string, redis_server, "redis-server",
          "path (or name on PATH) of redis-server; the redis rows are skipped when missing");
ABSL_FLAG(std::string, out, "", "write the results as JSON here");
ABSL_FLAG(int, size_mib, 256, "bytes of each value, MiB");
ABSL_FLAG(std::string, clients, "1,4", "concurrent client counts, comma-separated");
ABSL_FLAG(int, reps, 5, "repetitions with one client (median reported)");
ABSL_FLAG(int, reps_multi, 3, "repetitions with more than one client (median reported)");
ABSL_FLAG(bool, breakdown, true,
          "also measure the no-fsync and in-memory-engine variants (where the time goes)");
ABSL_FLAG(std::string, tmp_dir, "", "where the data directories go; default $TMPDIR or /tmp");
ABSL_FLAG(std::string, commit, "", "source revision to record in the JSON");
ABSL_FLAG(bool, mac, true,
          "with the lazyrag-kvstore process rows, also time each get with the workers' MAC check"
          " (op get+mac: after the CRC-32C check; get,mac: instead of it), beside get, in the"
          " same repetitions");
ABSL_FLAG(std::string, only, "",
          "mac: only memcpy, the MAC pass alone and the same-host lazyrag-kvstore rows; auth: only "
          "memcpy and the authentication rows; empty: every row");
ABSL_FLAG(std::string, gmac_impl, "auto",
          "the workers' GMAC in the get,mac and get+mac rows: auto (the widest the CPU runs), "
          "openssl (libcrypto's GHASH), vpclmulqdq-avx2 or vpclmulqdq");

ABSL_FLAG(bool, auth, true,
          "also time puts and gets against a lazyrag-kvstore with --auth_tokens_file (the client "
          "sending a worker token) beside one without, same values, alternating repetitions");
ABSL_FLAG(int, auth_small_kib, 4,
          "the small value of the authentication rows, KiB (0: only the --size_mib value)");
ABSL_FLAG(int, auth_small_calls, 200,
          "calls per client per round of the small-value authentication rows");
ABSL_FLAG(std::string, auth_tls_dir, "tests/fixtures/tls/identities",
          "certificates (ca.pem, server.pem, worker.pem and their -key.pem) for the mTLS "
          "authentication rows: certificate identity and token over mTLS against mTLS alone; "
          "empty or absent: plaintext rows only");

namespace lazyrag::kvstore {
namespace {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Measurement plumbing.

// What one get handed back; `owner` keeps `bytes` alive until they are checked.
struct Fetched {
  std::string_view bytes;
  std::shared_ptr<const void> owner;
};

using PutFn = std::function<absl::Status(int client)>;
using GetFn = std::function<absl::StatusOr<Fetched>(int client)>;

struct Row {
  std::string system;  // e.g. "lazyrag-kvstore (gRPC, sync)"
  std::string op;      // put, get, copy, crc32c
  int clients = 0;
  std::vector<double> gbps;  // one per repetition
  std::string note;          // why it is missing, when it is
  uint64_t value_bytes = 0;  // 0: the bench's size; else this row's (the authentication rows)
  int calls_per_round = 1;   // calls each client made per timed round
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Runs `fn(c)` on `clients` threads at once; returns the wall seconds from the common start to
// the last finish, or the first error.
absl::StatusOr<double> TimeRound(int clients, const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> status(clients);
  std::latch ready(clients);
  std::latch go(1);
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      ready.count_down();
      go.wait();
      status[c] = fn(c);
    });
  }
  ready.wait();
  const auto start = Clock::now();
  go.count_down();
  for (auto& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (const auto& s : status) {
    if (!s.ok()) return s;
  }
  return seconds;
}

class Bench {
 public:
  Bench(uint64_t size, std::vector<int> client_counts, int reps, int reps_multi)
      : size_(size),
        client_counts_(std::move(client_counts)),
        reps_(reps),
        reps_multi_(reps_multi) {
    const int max_clients = *std::max_element(client_counts_.begin(), client_counts_.end());
    for (int c = 0; c < max_clients; ++c) sources_.push_back(RandomBytes(size_, c + 1));
  }

  uint64_t size() const { return size_; }
  const std::string& source(int client) const { return sources_[client]; }
  const std::vector<int>& client_counts() const { return client_counts_; }
  int Reps(int clients) const { return clients == 1 ? reps_ : reps_multi_; }
  const std::vector<Row>& rows() const { return rows_; }
  void AddRow(Row row) { rows_.push_back(std::move(row)); }

  // Each repetition: one round of puts (every client its own key), then, when `get` is set, one
  // round of gets of those keys, checked against what was put.
  void PutGet(const std::string& system, int clients, const PutFn& put, const GetFn& get,
              const std::string& put_op = "put", const std::string& get_op = "get") {
    std::vector<std::pair<std::string, GetFn>> gets;
    if (get) gets.emplace_back(get_op, get);
    PutGets(system, clients, put, gets, put_op);
  }

  // The same with several kinds of get of the same stored values (e.g. without and with a MAC
  // check), one round of each per repetition, their order alternating between repetitions.
  void PutGets(const std::string& system, int clients, const PutFn& put,
               const std::vector<std::pair<std::string, GetFn>>& gets,
               const std::string& put_op = "put") {
    Row put_row{system, put_op, clients, {}, ""};
    std::vector<Row> get_rows;
    for (const auto& [op, fn] : gets) get_rows.push_back({system, op, clients, {}, ""});
    std::fprintf(stderr, "  %s, %d client(s) ...", system.c_str(), clients);
    bool failed = false;
    for (int rep = 0; rep < Reps(clients) && !failed; ++rep) {
      absl::StatusOr<double> seconds = TimeRound(clients, put);
      if (!seconds.ok()) {
        put_row.note = "put failed: " + std::string(seconds.status().message());
        for (Row& r : get_rows) r.note = put_row.note;
        break;
      }
      put_row.gbps.push_back(Gbps(clients, *seconds));
      for (size_t k = 0; k < gets.size() && !failed; ++k) {
        const size_t g = rep % 2 == 0 ? k : gets.size() - 1 - k;
        Row& get_row = get_rows[g];
        std::vector<Fetched> fetched(clients);
        seconds = TimeRound(clients, [&](int c) -> absl::Status {
          absl::StatusOr<Fetched> f = gets[g].second(c);
          if (!f.ok()) return f.status();
          fetched[c] = *std::move(f);
          return absl::OkStatus();
        });
        if (!seconds.ok()) {
          get_row.note = get_row.op + " failed: " + std::string(seconds.status().message());
          failed = true;
          break;
        }
        for (int c = 0; c < clients; ++c) {
          if (fetched[c].bytes != sources_[c]) {
            get_row.note = get_row.op + " returned different bytes";
            failed = true;
            break;
          }
        }
        if (!failed) get_row.gbps.push_back(Gbps(clients, *seconds));
      }
    }
    std::fprintf(stderr, " %s %.2f GB/s", put_op.c_str(), Median(put_row.gbps));
    for (const Row& r : get_rows) {
      std::fprintf(stderr, ", %s %.2f GB/s", r.op.c_str(), Median(r.gbps));
    }
    std::fprintf(stderr, "\n");
    rows_.push_back(std::move(put_row));
    for (Row& r : get_rows) rows_.push_back(std::move(r));
  }

  // A row that could not be measured.
  void Skip(const std::string& system, const std::string& op, const std::string& why) {
    for (int clients : client_counts_) rows_.push_back({system, op, clients, {}, why});
  }

  double Gbps(int clients, double seconds) const {
    return static_cast<double>(size_) * clients / seconds / 1e9;
  }

  static std::string RandomBytes(uint64_t size, uint64_t seed) {
    std::string out(size, '\0');
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (uint64_t i = 0; i + 8 <= size; i += 8) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      std::memcpy(out.data() + i, &x, 8);
    }
    return out;
  }

 private:
  const uint64_t size_;
  const std::vector<int> client_counts_;
  const int reps_;
  const int reps_multi_;
  std::vector<std::string> sources_;  // one value per client
  std::vector<Row> rows_;
};

// ---------------------------------------------------------------------------------------------
// Child processes and ports.

using ::lazyrag::testing::ChildProcess;
using ::lazyrag::testing::PickFreePort;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The full path of `name` (searched on PATH unless it has a slash), or "" when not found.
std::string FindExecutable(const std::string& name) {
  if (name.find('/') != std::string::npos) return access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path == nullptr ? "/usr/bin:/bin" : path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = dir + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// A lazyrag-kvstore shard process on a loopback port it picks itself.
class KvStoreChild {
 public:
  // Waits (up to 30 s) for its "lazyrag-kvstore ready grpc=HOST:PORT" line.
  // `extra`: more flags (--auth_tokens_file).
  absl::Status Start(const std::string& binary, const std::string& dir, bool sync_commits,
                     const std::vector<std::string>& extra = {}) {
    std::filesystem::create_directories(dir);
    std::vector<std::string> argv = {
        binary, "--listen=127.0.0.1:0", "--data_dir=" + dir + "/db", "--metrics_port=-1",
        std::string("--sync_commits=") + (sync_commits ? "true" : "false")};
    argv.insert(argv.end(), extra.begin(), extra.end());
    process_ = std::make_unique<ChildProcess>(std::move(argv));
    process_->SetOutputFiles("", dir + "/stderr.txt");
    if (absl::Status started = process_->Start(); !started.ok()) return started;
    absl::StatusOr<std::string> line = process_->WaitForLine("", absl::Seconds(30));
    const std::string address =
        line.ok() ? lazyrag::testing::FieldOf(*line, "grpc") : std::string();
    if (address.empty()) {
      return absl::UnavailableError("lazyrag-kvstore did not become ready: " +
                                    ReadFile(dir + "/stderr.txt").substr(0, 2000));
    }
    address_ = address;
    return absl::OkStatus();
  }
  void Stop() {
    if (process_ != nullptr) process_->Stop(SIGTERM, absl::Seconds(20));
  }
  const std::string& address() const { return address_; }

 private:
  std::unique_ptr<ChildProcess> process_;
  std::string address_;
};

// ---------------------------------------------------------------------------------------------
// The systems.

std::string DocumentId(int client) { return "bench-doc-" + std::to_string(client); }

void MeasureMemcpy(Bench& bench) {
  const int max_clients = bench.client_counts().back();
  std::vector<std::string> dst(max_clients, std::string(bench.size(), '\1'));  // pre-faulted
  for (int clients : bench.client_counts()) {
    bench.PutGet(
        "memcpy (machine ceiling)", clients,
        [&](int c) {
          std::memcpy(dst[c].data(), bench.source(c).data(), bench.size());
          return absl::OkStatus();
        },
        nullptr, "copy");
  }
}

// Where a get's time goes before any storage: the same copy into a freshly allocated buffer
// (page faults on first touch), which is what every get that returns a new value pays.
void MeasureFreshCopy(Bench& bench) {
  for (int clients : bench.client_counts()) {
    bench.PutGet(
        "memcpy into a fresh allocation (page faults)", clients,
        [&](int c) {
          std::string out(bench.source(c).data(), bench.size());
          return out.size() == bench.size() ? absl::OkStatus() : absl::InternalError("short");
        },
        nullptr, "copy");
  }
}

// The disk under the data directories: write the value to a file and fsync it (what a
// committed put must reach when commits are synced).
void MeasureDisk(Bench& bench, const std::string& dir) {
  std::filesystem::create_directories(dir);
  for (int clients : bench.client_counts()) {
    bench.PutGet(
        "file write + fsync (disk under the data dir)", clients,
        [&](int c) -> absl::Status {
          const std::string path = dir + "/value-" + std::to_string(c);
          const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
          if (fd < 0) return absl::InternalError("open " + path);
          const std::string& value = bench.source(c);
          for (uint64_t done = 0; done < value.size();) {
            const ssize_t n = write(fd, value.data() + done, value.size() - done);
            if (n <= 0) {
              close(fd);
              return absl::InternalError("write " + path);
            }
            done += static_cast<uint64_t>(n);
          }
          const bool synced = fsync(fd) == 0;
          close(fd);
          return synced ? absl::OkStatus() : absl::InternalError("fsync " + path);
        },
        nullptr, "write");
  }
  std::filesystem::remove_all(dir);
}

void MeasureCrc(Bench& bench) {
  std::atomic<uint32_t> sink{0};
  for (int clients : bench.client_counts()) {
    bench.PutGet(
        "CRC-32C (SSE4.2 crc32 instruction)", clients,
        [&](int c) {
          sink += Crc32c(bench.source(c));
          return absl::OkStatus();
        },
        nullptr, "crc32c");
  }
}

// The engine the way the service drives it: the writer computes each 2 MiB chunk's CRC-32C,
// the engine stores chunks and commits; a get opens a reader and reads every chunk (the engine
// checks each chunk's CRC-32C) into the client's buffer.
void MeasureEngine(Bench& bench, const std::string& dir, bool sync_commits, bool with_get) {
  const std::string system =
      std::string("RocksDB engine in-process") + (sync_commits ? " (sync)" : " (no sync)");
  RocksEngineOptions options;
  options.data_dir = dir;
  options.sync_commits = sync_commits;
  absl::StatusOr<std::unique_ptr<KvEngine>> engine = OpenRocksEngine(options);
  if (!engine.ok()) {
    bench.Skip(system, "put", "open failed: " + std::string(engine.status().message()));
    return;
  }
  std::vector<std::string> keys;
  for (int c = 0; c < bench.client_counts().back(); ++c) {
    lazyrag::v1::KvKey k;
    k.mutable_document()->set_model_fingerprint("bench-model");
    k.mutable_document()->set_cache_namespace("bench");
    k.mutable_document()->set_document_id(DocumentId(c));
    keys.push_back(*EncodeKey(k));
  }
  ValueLayout layout;
  layout.total_size = bench.size();
  layout.chunk_size = kDefaultChunkBytes;
  layout.num_chunks = NumChunks(layout.total_size, layout.chunk_size);
  auto put = [&](int c) -> absl::Status {
    absl::StatusOr<std::unique_ptr<PutSession>> session = (*engine)->BeginPut(keys[c], layout);
    if (!session.ok()) return session.status();
    const std::string_view value = bench.source(c);
    for (uint32_t i = 0; i < layout.num_chunks; ++i) {
      const std::string_view chunk = value.substr(layout.ChunkBegin(i), layout.chunk_size);
      absl::Status s = (*session)->AddChunk(i, chunk, Crc32c(chunk));
      if (!s.ok()) return s;
    }
    return (*session)->Commit().status();
  };
  std::vector<std::string> buffers(with_get ? bench.client_counts().back() : 0,
                                   std::string(bench.size(), '\1'));
  auto get = [&](int c) -> absl::StatusOr<Fetched> {
    absl::StatusOr<std::unique_ptr<ValueReader>> reader = (*engine)->Open(keys[c]);
    if (!reader.ok()) return reader.status();
    uint32_t crc = 0;
    for (uint32_t i = 0; i < (*reader)->layout().num_chunks; ++i) {
      absl::Status s =
          (*reader)->ReadChunkInto(i, buffers[c].data() + (*reader)->layout().ChunkBegin(i), &crc);
      if (!s.ok()) return s;
    }
    return Fetched{std::string_view(buffers[c].data(), (*reader)->layout().total_size), nullptr};
  };
  for (int clients : bench.client_counts()) {
    bench.PutGet(system, clients, put, with_get ? GetFn(get) : GetFn());
  }
}

// N clients, each its own KvClient (its own channel and TCP connection), against `address`;
// `fast_path`: the same-host fast path (files in the shard's data directory) where the shard
// offers it, else the gRPC streams. A get lands in the client's buffer (allocated and touched
// once, as a worker's pinned staging memory is), through KvClient::GetInto.
//
// `mac`: each repetition also gets the values with the worker's MAC check folded into the chunk
// pass (worker/engine/document_mac.h: GMAC per 256 KiB block on the reading threads as each
// chunk lands, HMAC over the block tags at the end): op "get+mac" after each chunk's CRC-32C
// check, op "get,mac" instead of it (what a worker with --kv_mac_key_file does), beside "get"
// (CRC-32C only).
void MeasureService(Bench& bench, const std::string& system, const std::string& address,
                    bool with_get, bool fast_path, bool mac = false) {
  std::vector<std::unique_ptr<KvClient>> clients;
  std::vector<std::string> buffers;
  for (int c = 0; c < bench.client_counts().back(); ++c) {
    KvClientOptions options;
    options.shards = {address};
    options.call_timeout = absl::Seconds(600);
    options.local_fast_path = fast_path;
    absl::StatusOr<std::unique_ptr<KvClient>> client = KvClient::Create(options);
    if (!client.ok()) {
      bench.Skip(system, "put", "client: " + std::string(client.status().message()));
      return;
    }
    clients.push_back(*std::move(client));
    if (with_get) buffers.emplace_back(bench.size(), '\1');
  }
  const ValueHeader header;
  auto key = [](int c) { return Key::Document("bench-model", "bench", DocumentId(c)); };
  auto put = [&](int c) { return clients[c]->Put(key(c), header, bench.source(c)); };
  auto get = [&](int c) -> absl::StatusOr<Fetched> {
    absl::StatusOr<ValueInfo> info = clients[c]->GetInto(
        key(c),
        [&](const ValueHeader&, uint64_t bytes) -> absl::StatusOr<std::vector<MutableBytes>> {
          if (bytes > buffers[c].size()) return absl::InternalError("value larger than expected");
          return std::vector<MutableBytes>{{buffers[c].data(), bytes}};
        });
    if (!info.ok()) return info.status();
    if (info->local != fast_path) {
      return absl::InternalError(fast_path ? "the shard offered no same-host fast path"
                                           : "the fast path was used although turned off");
    }
    return Fetched{std::string_view(buffers[c].data(), info->range_size), nullptr};
  };
  // The MAC variant: the tag each value would carry, computed once outside the timed region.
  const std::shared_ptr<const DocumentMacKey> mac_key =
      DocumentMacKey::FromSecret("kvstore_bench MAC key, 32 bytes or more");
  const std::array<uint8_t, kMacNonceBytes> nonce = NewMacNonce();
  std::vector<std::string> ids;
  std::vector<MacTag> tags;
  if (mac && with_get) {
    for (int c = 0; c < bench.client_counts().back(); ++c) {
      ids.push_back(DocumentId(c));
      tags.push_back(ComputeDocumentMac(*mac_key, nonce, {"", "bench-model", "bench", ids[c]},
                                        bench.source(c)));
    }
  }
  // `instead_of_crc`: the MAC replaces the client's CRC-32C pass (CallOptions::on_chunk_verifies,
  // what a worker with a MAC key does); else both run.
  auto mac_get = [&](int c, bool instead_of_crc) -> absl::StatusOr<Fetched> {
    std::unique_ptr<DocumentMacCheck> check;
    CallOptions call;
    call.on_chunk = [&check](uint64_t offset, const char* data, uint64_t size) {
      check->Observe(offset, data, size);
    };
    call.on_chunk_verifies = instead_of_crc;
    absl::StatusOr<ValueInfo> info = clients[c]->GetInto(
        key(c),
        [&](const ValueHeader&, uint64_t bytes) -> absl::StatusOr<std::vector<MutableBytes>> {
          if (bytes > buffers[c].size()) return absl::InternalError("value larger than expected");
          check = std::make_unique<DocumentMacCheck>(mac_key.get(), nonce, bytes);
          return std::vector<MutableBytes>{{buffers[c].data(), bytes}};
        },
        LayerSelection{}, call);
    if (!info.ok()) return info.status();
    const std::vector<ByteSpan> spans = {{buffers[c].data(), info->range_size}};
    if (!check->Finish(spans, {"", "bench-model", "bench", ids[c]}, tags[c])) {
      return absl::DataLossError("MAC check failed");
    }
    return Fetched{std::string_view(buffers[c].data(), info->range_size), nullptr};
  };
  for (int n : bench.client_counts()) {
    std::vector<std::pair<std::string, GetFn>> gets;
    if (with_get) gets.emplace_back("get", get);
    if (with_get && mac) {
      gets.emplace_back("get+mac", [&](int c) { return mac_get(c, false); });
      gets.emplace_back("get,mac", [&](int c) { return mac_get(c, true); });
    }
    bench.PutGets(system, n, put, gets);
  }
}

// ---------------------------------------------------------------------------------------------
// The MAC pass alone (issue 28): what the workers' check costs a reading thread, without the
// shard, gRPC or the other clients' noise.

// One row: `check` over `data` by `threads` threads; GB/s of all threads together.
struct PassRow {
  std::string data;
  std::string check;  // none, crc32c, gmac:IMPL (GmacImplName)
  int threads = 1;
  std::vector<double> gbps;  // one per repetition
  std::string note;          // why it is missing, when it is
};

std::string CheckName(GmacImpl impl) { return std::string("gmac:") + GmacImplName(impl); }

// Every GMAC implementation this CPU runs (gmac.h).
std::vector<GmacImpl> SupportedGmacImpls() {
  std::vector<GmacImpl> impls;
  for (GmacImpl impl : {GmacImpl::kOpenSsl, GmacImpl::kVpclmulqdqAvx2, GmacImpl::kVpclmulqdq}) {
    if (GmacImplSupported(impl)) impls.push_back(impl);
  }
  return impls;
}

// Rows, each `reps` repetitions in alternating order:
//   * "256 KiB block in L2", 1 thread: CRC-32C and each GMAC over one kMacBlockBytes block
//     (Start, Update, Finish per block, a fresh IV each), `size` bytes in all;
//   * "pread 512 KiB steps + check", 1 and 4 threads: a value of `size` bytes from a page-cached
//     file under `dir` into a pre-faulted buffer in the client's steps (kvstore client,
//     value_file_io.cc), each step checked right after its pread, the threads on disjoint
//     quarters: none, CRC-32C, the workers' DocumentMacCheck (Observe per step, Finish) with
//     each GMAC.
std::vector<PassRow> MeasureMacPass(uint64_t size, int reps, const std::string& dir) {
  std::fprintf(stderr, "  MAC pass alone ...");
  const GmacImpl restore = AutoGmacImpl();
  const std::vector<GmacImpl> impls = SupportedGmacImpls();
  const std::shared_ptr<const DocumentMacKey> key =
      DocumentMacKey::FromSecret("kvstore_bench MAC key, 32 bytes or more");
  const std::array<uint8_t, kMacNonceBytes> nonce = NewMacNonce();
  const std::string value = Bench::RandomBytes(size, 99);
  std::vector<PassRow> rows;

  // In L2.
  const std::string_view block(value.data(), std::min<uint64_t>(kMacBlockBytes, size));
  const uint64_t passes = std::max<uint64_t>(1, size / block.size());
  std::vector<std::string> checks = {"crc32c"};
  for (GmacImpl impl : impls) checks.push_back(CheckName(impl));
  for (const std::string& c : checks) rows.push_back({"256 KiB block in L2", c, 1, {}, ""});
  std::atomic<uint32_t> sink{0};
  for (int rep = 0; rep < reps; ++rep) {
    for (size_t k = 0; k < checks.size(); ++k) {
      const size_t i = rep % 2 == 0 ? k : checks.size() - 1 - k;
      std::unique_ptr<Gmac> gmac;
      if (i > 0) gmac = std::make_unique<Gmac>(key->gmac_key(), impls[i - 1]);
      const auto start = Clock::now();
      for (uint64_t p = 0; p < passes; ++p) {
        if (!gmac) {
          sink += Crc32c(block);
          continue;
        }
        uint8_t iv[Gmac::kIvBytes] = {};
        std::memcpy(iv, &p, sizeof(p));
        gmac->Start(iv);
        gmac->Update(reinterpret_cast<const uint8_t*>(block.data()), block.size());
        uint8_t tag[Gmac::kTagBytes];
        gmac->Finish(tag);
        sink += tag[0];
      }
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      rows[i].gbps.push_back(static_cast<double>(passes * block.size()) / seconds / 1e9);
    }
  }

  // The landing pass from a page-cached file.
  const std::string path = dir + "/value";
  std::filesystem::create_directories(dir);
  absl::StatusOr<UniqueFd> fd = OpenFile(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  absl::Status written = fd.ok() ? PwriteAll(fd->get(), value, 0) : fd.status();
  const DocumentMacBinding binding{"", "bench-model", "bench", "bench-pass"};
  const MacTag tag = ComputeDocumentMac(*key, nonce, binding, value);
  std::string dst(size, '\1');  // pre-faulted, as the client's buffer
  constexpr uint64_t kStep = 512 << 10;
  checks = {"none", "crc32c"};
  for (GmacImpl impl : impls) checks.push_back(CheckName(impl));
  for (int threads : {1, 4}) {
    const size_t first = rows.size();
    for (const std::string& c : checks) {
      rows.push_back({"pread 512 KiB steps + check", c, threads, {}, ""});
      if (!written.ok()) rows.back().note = std::string(written.message());
    }
    if (!written.ok()) continue;
    for (int rep = 0; rep < reps; ++rep) {
      for (size_t k = 0; k < checks.size(); ++k) {
        const size_t i = rep % 2 == 0 ? k : checks.size() - 1 - k;
        PassRow& row = rows[first + i];
        if (i >= 2) SetAutoGmacImpl(impls[i - 2]);
        DocumentMacCheck check(key.get(), nonce, size);
        absl::StatusOr<double> seconds = TimeRound(threads, [&](int t) -> absl::Status {
          const uint64_t steps = (size + kStep - 1) / kStep;
          uint32_t crc = 0;
          for (uint64_t s = steps * t / threads; s < steps * (t + 1) / threads; ++s) {
            const uint64_t at = s * kStep, n = std::min(kStep, size - at);
            RETURN_IF_ERROR(PreadAll(fd->get(), dst.data() + at, n, at));
            if (i == 1) crc = Crc32cExtend(crc, std::string_view(dst.data() + at, n));
            if (i >= 2) check.Observe(at, dst.data() + at, n);
          }
          sink += crc;
          return absl::OkStatus();
        });
        if (seconds.ok() && i >= 2 && !check.Finish({ByteSpan{dst.data(), size}}, binding, tag)) {
          seconds = absl::DataLossError("the MAC check failed");
        }
        if (!seconds.ok()) {
          row.note = std::string(seconds.status().message());
          continue;
        }
        row.gbps.push_back(static_cast<double>(size) / *seconds / 1e9);
      }
    }
  }
  SetAutoGmacImpl(restore);
  std::filesystem::remove(path);
  std::fprintf(stderr, " done\n");
  return rows;
}

void PrintMacPass(const std::vector<PassRow>& rows) {
  if (rows.empty()) return;
  std::printf(
      "\nMAC pass alone (worker/engine/gmac.h, document_mac.h), GB/s of all threads, "
      "median over repetitions\n");
  std::printf("%-30s %-16s %7s %9s %9s %9s\n", "data", "check", "threads", "GB/s", "min", "max");
  for (const PassRow& r : rows) {
    if (r.gbps.empty()) {
      std::printf("%-30s %-16s %7d %9s  (%s)\n", r.data.c_str(), r.check.c_str(), r.threads, "n/a",
                  r.note.c_str());
      continue;
    }
    std::printf("%-30s %-16s %7d %9.2f %9.2f %9.2f\n", r.data.c_str(), r.check.c_str(), r.threads,
                Median(r.gbps), *std::min_element(r.gbps.begin(), r.gbps.end()),
                *std::max_element(r.gbps.begin(), r.gbps.end()));
  }
}

void MeasureKvStoreProcess(Bench& bench, const std::string& binary, const std::string& dir,
                           bool sync_commits, bool with_get, bool fast_path) {
  const std::string system = std::string("lazyrag-kvstore ") +
                             (fast_path ? "same-host files" : "gRPC streams") +
                             (sync_commits ? " (sync)" : " (--sync_commits=false)");
  if (binary.empty() || access(binary.c_str(), X_OK) != 0) {
    bench.Skip(system, "put", "no lazyrag-kvstore binary (--kvstore_binary)");
    return;
  }
  KvStoreChild server;
  absl::Status s = server.Start(binary, dir, sync_commits);
  if (!s.ok()) {
    bench.Skip(system, "put", std::string(s.message()));
    return;
  }
  MeasureService(bench, system, server.address(), with_get, fast_path,
                 /*mac=*/absl::GetFlag(FLAGS_mac));
  server.Stop();
}

// A token file like a cluster's: a few client tokens and the workers' token, last.
constexpr char kBenchWorkerToken[] = "kvstore-bench-worker-token-0123456789abcdef";
// The worker identity of the fixtures' certificate (CN lazyrag-worker), for the mTLS rows.
constexpr char kBenchWorkerCertificateLine[] = "x509:lazyrag-worker cluster worker\n";
std::string BenchTokensFile() {
  std::string out;
  for (int i = 0; i < 8; ++i) {
    out += absl::StrCat("kvstore-bench-client-token-", i, "-0123456789 t", i, " client\n");
  }
  return absl::StrCat(out, kBenchWorkerToken, " cluster worker\n");
}

// Bearer-token authentication's cost (issue 28) for values of `value_bytes`: four lazyrag-kvstore
// processes on loopback (gRPC streams, --sync_commits=false, so that neither the disk nor an
// fsync hides a per-call cost), one started with --auth_tokens_file and called with a worker
// token (KvClientOptions::auth_token: the "authorization" metadata on every call, the shard's
// SHA-256 and constant-time compare against every entry), three without. Four kinds of client,
// one process each: without a token to a shard without authentication (`system`), with the
// worker token to the shard that checks it (`system` + " + token"), with the token to a shard
// that does not check it (`system` + " + token, unchecked": the client's and the header's share
// alone), and without a token to the fourth shard (`system` + ", second process": the control,
// how far two identical kinds read apart). With one call per round (large values) each
// repetition puts then gets every client's value with each kind, the order rotating between
// repetitions; with `calls` > 1 (small values) the kinds alternate call by call and every call is
// a sample. Either way all kinds see the same machine load, and every repetition starts fresh
// processes and clients (a process's luck stays with no kind). Ops put and get.
//
// With `tls_dir` (the certificates of tests/fixtures/tls/identities) every shard and client speaks
// mTLS and the kinds are: no token file (`system` + " (mTLS)"), a shard with the token file whose
// `x509:lazyrag-worker` line the client's certificate matches, no token sent (" + certificate":
// the per-call cost of certificate identities), another such shard called with the worker
// token (" + token"), and the control.
void MeasureAuth(Bench& bench, const std::string& binary, const std::string& dir,
                 uint64_t value_bytes, int calls, const std::string& plain_system,
                 const std::string& tls_dir = "") {
  const bool tls = !tls_dir.empty();
  const std::string system = tls ? plain_system + " (mTLS)" : plain_system;
  const std::string auth_system = system + (tls ? " + certificate" : " + token");
  const std::string sent_system = system + (tls ? " + token" : " + token, unchecked");
  const std::string same_system = system + ", second process";
  auto skip = [&](const std::string& why) {
    for (const std::string& sys : {system, auth_system, sent_system, same_system}) {
      for (const char* op : {"put", "get"}) {
        for (int n : bench.client_counts()) {
          bench.AddRow({sys, op, n, {}, why, value_bytes, calls});
        }
      }
    }
  };
  if (binary.empty() || access(binary.c_str(), X_OK) != 0) {
    return skip("no lazyrag-kvstore binary (--kvstore_binary)");
  }
  std::filesystem::create_directories(dir);
  const std::string worker_token = kBenchWorkerToken;
  {
    std::ofstream f(dir + "/tokens");
    f << BenchTokensFile();
    if (tls) f << kBenchWorkerCertificateLine;
  }
  std::vector<std::string> server_tls;
  TlsFiles client_tls;
  if (tls) {
    server_tls = {"--tls_cert=" + tls_dir + "/server.pem",
                  "--tls_key=" + tls_dir + "/server-key.pem", "--tls_ca=" + tls_dir + "/ca.pem"};
    client_tls = {tls_dir + "/worker.pem", tls_dir + "/worker-key.pem", tls_dir + "/ca.pem"};
  }
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), server_tls.begin(), server_tls.end());
    return extra;
  };
  const std::string tokens_flag = "--auth_tokens_file=" + dir + "/tokens";
  const int max_clients = bench.client_counts().back();
  std::vector<std::string> owned;  // the small values; the bench's own for its size
  for (int c = 0; c < max_clients && value_bytes != bench.size(); ++c) {
    owned.push_back(Bench::RandomBytes(value_bytes, c + 101));
  }
  std::vector<std::string_view> sources;
  for (int c = 0; c < max_clients; ++c) {
    sources.push_back(owned.empty() ? std::string_view(bench.source(c)) : owned[c]);
  }
  std::vector<std::string> buffers(max_clients, std::string(value_bytes, '\1'));  // every side's
  constexpr int kSides = 4;
  const std::string side_names[kSides] = {system, auth_system, sent_system, same_system};
  // Side 0 never checks a token; side 1 checks the token (plaintext) or the certificate (mTLS);
  // side 2 is sent the token and does not check it (plaintext) or checks it (mTLS); side 3 is
  // side 0 again in its own process (the control: how far two identical kinds read apart).
  const std::vector<std::string> side_flags[kSides] = {
      with({}), with({tokens_flag}),
      with(tls ? std::vector<std::string>{tokens_flag} : std::vector<std::string>{}), with({})};
  const char* side_dirs[kSides] = {"/plain", "/auth", "/sent", "/same"};
  // One process per kind, so that each serves the same share of the calls (how often a process
  // is called changes how soon its threads wake for the next small call), and fresh processes
  // and clients every repetition, started in rotating order: whatever luck a process has (where
  // its threads run, how its pools warmed) falls on every kind across the repetitions instead of
  // on one kind for a whole run (one set of processes per run measured per-run biases of up to
  // +-12% between identical processes; bench/HISTORY.md).
  struct Fleet {
    KvStoreChild servers[kSides];
    std::vector<std::unique_ptr<KvClient>> clients[kSides];
    void Stop() {
      for (auto& c : clients) c.clear();
      for (auto& s : servers) s.Stop();
    }
  };
  const ValueHeader header;
  auto warm_key = [](int c) {
    return Key::Document("bench-model", "bench-auth", "warm-" + std::to_string(c));
  };
  const std::string warm_value(4096, 'w');
  auto start_fleet = [&](Fleet& f, int rep) -> absl::Status {
    for (int j = 0; j < kSides; ++j) {
      const int k = (j + rep) % kSides;
      RETURN_IF_ERROR(f.servers[k].Start(binary, dir + side_dirs[k], false, side_flags[k]));
    }
    for (int k = 0; k < kSides; ++k) {
      for (int c = 0; c < max_clients; ++c) {
        KvClientOptions options;
        options.shards = {f.servers[k].address()};
        options.call_timeout = absl::Seconds(600);
        options.local_fast_path = false;
        options.tls = client_tls;
        // mTLS: the certificate is the identity on side 1, the token on side 2.
        if (k == 2 || (k == 1 && !tls)) options.auth_token = BearerToken::Fixed(worker_token);
        absl::StatusOr<std::unique_ptr<KvClient>> client = KvClient::Create(options);
        if (!client.ok()) return client.status();
        // Connected and warm before anything is timed: a few small calls on every channel.
        for (int i = 0; i < 3; ++i) {
          RETURN_IF_ERROR((*client)->Put(warm_key(c), header, warm_value));
          RETURN_IF_ERROR((*client)->Get(warm_key(c)).status());
        }
        f.clients[k].push_back(*std::move(client));
      }
    }
    return absl::OkStatus();
  };
  {
    // The binary and flags start at all before anything is measured.
    Fleet probe;
    absl::Status s = start_fleet(probe, 0);
    probe.Stop();
    if (!s.ok()) return skip(std::string(s.message()));
  }
  auto key = [](int c) { return Key::Document("bench-model", "bench-auth", DocumentId(c)); };
  for (int n : bench.client_counts()) {
    std::fprintf(stderr, "  %s, %llu-byte values x%d calls, %d client(s) ...", system.c_str(),
                 static_cast<unsigned long long>(value_bytes), calls, n);
    Row rows[kSides][2];  // [side][put, get]
    for (int k = 0; k < kSides; ++k) {
      rows[k][0] = {side_names[k], "put", n, {}, "", value_bytes, calls};
      rows[k][1] = {side_names[k], "get", n, {}, "", value_bytes, calls};
    }
    const double bytes_per_round = static_cast<double>(value_bytes) * n * calls;
    std::string failed;
    // One get of client c's value through `client`, checked against what was put.
    auto get_once = [&](KvClient* client, int c) -> absl::Status {
      absl::StatusOr<ValueInfo> info = client->GetInto(
          key(c),
          [&](const ValueHeader&, uint64_t bytes) -> absl::StatusOr<std::vector<MutableBytes>> {
            if (bytes > buffers[c].size()) return absl::InternalError("value larger than expected");
            return std::vector<MutableBytes>{{buffers[c].data(), bytes}};
          });
      if (!info.ok()) return info.status();
      if (info->range_size != value_bytes || std::string_view(buffers[c]) != sources[c]) {
        return absl::DataLossError("get returned different bytes");
      }
      return absl::OkStatus();
    };
    for (int rep = 0; rep < bench.Reps(n) && failed.empty(); ++rep) {
      Fleet fleet;
      if (absl::Status s = start_fleet(fleet, rep); !s.ok()) {
        fleet.Stop();
        failed = "start: " + std::string(s.message());
        break;
      }
      if (calls > 1) {
        // Small values: the kinds alternate call by call inside every client's round, the
        // order rotating, so that the machine's noise falls on every kind alike; each call is
        // timed alone and a row's samples are value_bytes * n / (one call's seconds), so its
        // median is the median call.
        for (int op = 0; op < 2 && failed.empty(); ++op) {
          std::vector<std::vector<std::vector<double>>> secs(
              n, std::vector<std::vector<double>>(kSides));
          absl::StatusOr<double> round = TimeRound(n, [&](int c) -> absl::Status {
            for (int i = 0; i < calls; ++i) {
              for (int j = 0; j < kSides; ++j) {
                const int k = (i + j + rep) % kSides;
                KvClient* client = fleet.clients[k][c].get();
                const auto t0 = Clock::now();
                absl::Status st =
                    op == 0 ? client->Put(key(c), header, sources[c]) : get_once(client, c);
                if (!st.ok()) return st;
                secs[c][k].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
              }
            }
            return absl::OkStatus();
          });
          if (!round.ok()) {
            failed = std::string(op == 0 ? "put" : "get") +
                     " failed: " + std::string(round.status().message());
            break;
          }
          for (int c = 0; c < n; ++c) {
            for (int k = 0; k < kSides; ++k) {
              for (double t : secs[c][k]) {
                rows[k][op].gbps.push_back(static_cast<double>(value_bytes) * n / t / 1e9);
              }
            }
          }
        }
      }
      for (int j = 0; calls == 1 && j < kSides && failed.empty(); ++j) {
        // Large values: each kind's round of puts then gets, the order rotating.
        const int k = (j + rep) % kSides;
        std::vector<std::unique_ptr<KvClient>>& clients = fleet.clients[k];
        absl::StatusOr<double> seconds = TimeRound(
            n, [&](int c) -> absl::Status { return clients[c]->Put(key(c), header, sources[c]); });
        if (!seconds.ok()) {
          failed = "put failed: " + std::string(seconds.status().message());
          break;
        }
        rows[k][0].gbps.push_back(bytes_per_round / *seconds / 1e9);
        seconds = TimeRound(n, [&](int c) { return get_once(clients[c].get(), c); });
        if (!seconds.ok()) {
          failed = "get failed: " + std::string(seconds.status().message());
          break;
        }
        rows[k][1].gbps.push_back(bytes_per_round / *seconds / 1e9);
      }
      fleet.Stop();
    }
    std::fprintf(stderr, " put %.4f/%.4f/%.4f/%.4f GB/s, get %.4f/%.4f/%.4f/%.4f GB/s (%s)%s\n",
                 Median(rows[0][0].gbps), Median(rows[1][0].gbps), Median(rows[2][0].gbps),
                 Median(rows[3][0].gbps), Median(rows[0][1].gbps), Median(rows[1][1].gbps),
                 Median(rows[2][1].gbps), Median(rows[3][1].gbps),
                 tls ? "mTLS: no token file / certificate / token / no token file again"
                     : "without / with / unchecked token / without again",
                 failed.empty() ? "" : (" " + failed).c_str());
    for (int k = 0; k < kSides; ++k) {
      for (Row& r : rows[k]) {
        if (!failed.empty()) r.note = failed, r.gbps.clear();
        bench.AddRow(std::move(r));
      }
    }
  }
  std::filesystem::remove_all(dir);
}

// The shard's own work per authenticated call, in-process: TokenStore::Authenticate against the
// token file MeasureAuth writes with mTLS, of the worker token (SHA-256 of the token, a
// constant-time compare with each of its 9 token entries) and of the worker's certificate name
// (the x509: entry); the stat at most once a second. Nanoseconds per call, median of 5 rounds
// of 100000 calls each; -1 when the store cannot be opened or a lookup fails.
struct AuthenticateNs {
  double token = -1, certificate = -1;
};
AuthenticateNs MeasureAuthenticateNs(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::string worker_token = kBenchWorkerToken;
  std::ofstream(dir + "/tokens") << BenchTokensFile() << kBenchWorkerCertificateLine;
  absl::StatusOr<std::unique_ptr<TokenStore>> store = TokenStore::Open(dir + "/tokens");
  AuthenticateNs out;
  if (!store.ok()) return out;
  constexpr int kCalls = 100000;
  const auto measure = [&](std::optional<std::string_view> token,
                           std::optional<std::string_view> certificate) -> double {
    std::vector<double> ns;
    for (int round = 0; round < 5; ++round) {
      int ok = 0;
      const auto start = Clock::now();
      for (int i = 0; i < kCalls; ++i) {
        ok += (*store)->Authenticate(token, Role::kWorker, certificate).ok();
      }
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      if (ok != kCalls) return -1;
      ns.push_back(seconds * 1e9 / kCalls);
    }
    return Median(ns);
  };
  out.token = measure(worker_token, std::nullopt);
  out.certificate = measure(std::nullopt, "lazyrag-worker");
  std::filesystem::remove_all(dir);
  return out;
}

// A KvEngine that keeps values in memory: lets the service be measured without storage.
class MemoryEngine final : public KvEngine {
 public:
  absl::StatusOr<std::unique_ptr<PutSession>> BeginPut(std::string_view key,
                                                       const ValueLayout& layout) override {
    return std::make_unique<Session>(this, std::string(key), layout);
  }
  absl::StatusOr<std::unique_ptr<ValueReader>> Open(std::string_view key) override {
    absl::MutexLock lock(&mu_);
    auto it = values_.find(std::string(key));
    if (it == values_.end()) return absl::NotFoundError("no such key");
    return std::make_unique<Reader>(it->second);
  }
  absl::StatusOr<KeyStat> Stat(std::string_view key) override {
    absl::MutexLock lock(&mu_);
    auto it = values_.find(std::string(key));
    if (it == values_.end()) return KeyStat{};
    return KeyStat{true, it->second->layout.total_size, 0};
  }
  absl::StatusOr<bool> Delete(std::string_view key) override {
    absl::MutexLock lock(&mu_);
    return values_.erase(std::string(key)) > 0;
  }
  absl::StatusOr<uint64_t> EvictTo(uint64_t) override { return 0; }
  EngineUsage Usage() const override { return {}; }

 private:
  struct Stored {
    ValueLayout layout;
    std::vector<std::string> chunks;
    std::vector<uint32_t> crcs;
  };
  class Session final : public PutSession {
   public:
    Session(MemoryEngine* engine, std::string key, ValueLayout layout)
        : engine_(engine), key_(std::move(key)), value_(std::make_shared<Stored>()) {
      value_->layout = std::move(layout);
    }
    absl::Status AddChunk(uint32_t, std::string_view data, uint32_t crc32c) override {
      value_->chunks.emplace_back(data);
      value_->crcs.push_back(crc32c);
      return absl::OkStatus();
    }
    absl::StatusOr<bool> Commit() override {
      absl::MutexLock lock(&engine_->mu_);
      auto& slot = engine_->values_[key_];
      const bool replaced = slot != nullptr;
      slot = value_;
      return replaced;
    }

   private:
    MemoryEngine* const engine_;
    const std::string key_;
    std::shared_ptr<Stored> value_;
  };
  class Reader final : public ValueReader {
   public:
    explicit Reader(std::shared_ptr<const Stored> value) : value_(std::move(value)) {}
    const ValueLayout& layout() const override { return value_->layout; }
    absl::Status ReadChunk(uint32_t index, std::string* data, uint32_t* crc32c) override {
      // Checked like the RocksDB engine checks what it reads.
      if (Crc32c(value_->chunks[index]) != value_->crcs[index]) {
        return absl::DataLossError("chunk failed its CRC-32C check");
      }
      data->assign(value_->chunks[index]);
      *crc32c = value_->crcs[index];
      return absl::OkStatus();
    }

   private:
    std::shared_ptr<const Stored> value_;
  };

  absl::Mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const Stored>> values_ ABSL_GUARDED_BY(mu_);
};

void MeasureMemoryService(Bench& bench) {
  const std::string system = "kvstore gRPC service, in-memory engine (in-process)";
  KvStoreServerOptions options;
  options.listen = "127.0.0.1:0";
  options.metrics_port = -1;
  KvStoreServer server(options, [](KvStoreMetrics*) -> absl::StatusOr<std::unique_ptr<KvEngine>> {
    return std::make_unique<MemoryEngine>();
  });
  absl::Status s = server.Start();
  if (!s.ok()) {
    bench.Skip(system, "put", std::string(s.message()));
    return;
  }
  MeasureService(bench, system, server.address(), /*with_get=*/true, /*fast_path=*/false);
  server.Shutdown(absl::Now() + absl::Seconds(5));
}

#ifdef LAZYRAG_HAVE_HIREDIS
struct RedisFree {
  void operator()(redisContext* c) const { redisFree(c); }
};
using RedisConnection = std::unique_ptr<redisContext, RedisFree>;

absl::StatusOr<RedisConnection> RedisConnect(int port) {
  const timeval connect_timeout{2, 0};
  RedisConnection c(redisConnectWithTimeout("127.0.0.1", port, connect_timeout));
  if (c == nullptr || c->err != 0) {
    return absl::UnavailableError("redis connect: " + std::string(c ? c->errstr : "no memory"));
  }
  const timeval io_timeout{600, 0};
  redisSetTimeout(c.get(), io_timeout);
  return c;
}

// One command; the reply (owned) or an error.
absl::StatusOr<std::shared_ptr<redisReply>> RedisCall(redisContext* c,
                                                      const std::vector<std::string_view>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (auto a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  auto* reply = static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()));
  if (reply == nullptr) return absl::UnavailableError("redis: " + std::string(c->errstr));
  std::shared_ptr<redisReply> owned(reply, freeReplyObject);
  if (reply->type == REDIS_REPLY_ERROR) {
    return absl::InternalError("redis: " + std::string(reply->str, reply->len));
  }
  return owned;
}
#endif

// redis-server on a free loopback port, no persistence, large bulk strings allowed.
void MeasureRedis(Bench& bench, const std::string& redis_server, const std::string& dir,
                  std::string* version) {
  const std::string system = "redis-server via hiredis (no persistence)";
#ifndef LAZYRAG_HAVE_HIREDIS
  (void)redis_server;
  (void)dir;
  (void)version;
  bench.Skip(system, "SET", "built without hiredis (libhiredis-dev)");
  bench.Skip(system, "GET", "built without hiredis (libhiredis-dev)");
#else
  const std::string path = FindExecutable(redis_server);
  auto skip = [&](const std::string& why) {
    std::fprintf(stderr, "  redis skipped: %s\n", why.c_str());
    bench.Skip(system, "SET", why);
    bench.Skip(system, "GET", why);
  };
  if (path.empty()) return skip("redis-server not found (apt-get install redis-server)");
  const int port = PickFreePort();
  if (port == 0) return skip("no free loopback port");
  std::filesystem::create_directories(dir);
  ChildProcess process({path, "--port", std::to_string(port), "--bind", "127.0.0.1", "--save", "",
                        "--appendonly", "no", "--dir", dir, "--proto-max-bulk-len", "512mb",
                        "--client-query-buffer-limit", "1gb", "--daemonize", "no"},
                       /*capture_stdout=*/false);
  process.SetOutputFiles(dir + "/stdout.txt", dir + "/stderr.txt");
  absl::Status s = process.Start();
  if (!s.ok()) return skip(std::string(s.message()));
  std::vector<RedisConnection> connections;
  for (int attempt = 0; attempt < 500 && connections.empty(); ++attempt) {
    absl::StatusOr<RedisConnection> c = RedisConnect(port);
    if (c.ok() && RedisCall(c->get(), {"PING"}).ok()) {
      connections.push_back(*std::move(c));
    } else {
      if (!process.Alive()) break;
      usleep(10000);
    }
  }
  if (connections.empty()) {
    return skip("redis-server did not start: " + ReadFile(dir + "/stdout.txt").substr(0, 1000));
  }
  if (auto info = RedisCall(connections[0].get(), {"INFO", "server"}); info.ok()) {
    const std::string text((*info)->str, (*info)->len);
    const size_t at = text.find("redis_version:");
    if (at != std::string::npos) *version = text.substr(at + 14, text.find('\r', at) - at - 14);
  }
  while (static_cast<int>(connections.size()) < bench.client_counts().back()) {
    absl::StatusOr<RedisConnection> c = RedisConnect(port);
    if (!c.ok()) return skip(std::string(c.status().message()));
    connections.push_back(*std::move(c));
  }
  auto put = [&](int c) -> absl::Status {
    const std::string key = DocumentId(c);
    return RedisCall(connections[c].get(), {"SET", key, bench.source(c)}).status();
  };
  auto get = [&](int c) -> absl::StatusOr<Fetched> {
    const std::string key = DocumentId(c);
    absl::StatusOr<std::shared_ptr<redisReply>> reply =
        RedisCall(connections[c].get(), {"GET", key});
    if (!reply.ok()) return reply.status();
    if ((*reply)->type != REDIS_REPLY_STRING) return absl::NotFoundError("redis: GET: no value");
    return Fetched{std::string_view((*reply)->str, (*reply)->len), *reply};
  };
  for (int clients : bench.client_counts()) bench.PutGet(system, clients, put, get, "SET", "GET");
  connections.clear();
  process.Stop(SIGTERM, absl::Seconds(20));
#endif
}

// ---------------------------------------------------------------------------------------------
// Report.

std::string FirstLineWith(const std::string& path, const std::string& prefix) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) {
      const size_t colon = line.find(':');
      return colon == std::string::npos ? line
                                        : line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "";
}

void PrintTable(const Bench& bench) {
  // system -> op -> clients -> row, in first-seen order.
  std::vector<std::pair<std::string, std::string>> order;
  std::map<std::pair<std::string, std::string>, std::map<int, const Row*>> cells;
  for (const Row& r : bench.rows()) {
    // Small-value rows (authentication) are in their own table: GB/s says little there.
    if (r.value_bytes != 0 && r.value_bytes != bench.size()) continue;
    auto k = std::make_pair(r.system, r.op);
    if (cells.find(k) == cells.end()) order.push_back(k);
    cells[k][r.clients] = &r;
  }
  std::printf("\nkvstore throughput: %llu MiB values, GB/s (1e9 B/s), median over repetitions\n",
              static_cast<unsigned long long>(bench.size() >> 20));
  std::printf("%-52s %-7s", "system", "op");
  for (int n : bench.client_counts()) std::printf(" %8d client%s", n, n == 1 ? " " : "s");
  std::printf("\n");
  std::string last_system;
  for (const auto& k : order) {
    std::printf("%-52s %-7s", k.first == last_system ? "" : k.first.c_str(), k.second.c_str());
    last_system = k.first;
    std::string notes;
    for (int n : bench.client_counts()) {
      auto it = cells[k].find(n);
      if (it == cells[k].end()) {
        std::printf(" %16s", "-");
      } else if (it->second->gbps.empty()) {
        std::printf(" %16s", "n/a");
        if (notes.empty()) notes = it->second->note;
      } else {
        std::printf(" %16.2f", Median(it->second->gbps));
      }
    }
    if (!notes.empty()) std::printf("  (%s)", notes.c_str());
    std::printf("\n");
  }
}

// Each "get+mac" and "get,mac" row against the "get" row of the same system and clients: the MAC
// check's share of the fetch time, (t_mac - t_get) / t_get = get_gbps / mac_gbps - 1 (medians).
struct MacCost {
  std::string system;
  std::string op;  // get+mac (after the CRC-32C) or get,mac (instead of it)
  int clients = 0;
  double get_gbps = 0, mac_gbps = 0;
  double cost() const { return get_gbps / mac_gbps - 1; }
};
std::vector<MacCost> MacCosts(const Bench& bench) {
  std::vector<MacCost> out;
  for (const Row& m : bench.rows()) {
    if ((m.op != "get+mac" && m.op != "get,mac") || m.gbps.empty()) continue;
    for (const Row& g : bench.rows()) {
      if (g.op == "get" && g.system == m.system && g.clients == m.clients && !g.gbps.empty()) {
        out.push_back({m.system, m.op, m.clients, Median(g.gbps), Median(m.gbps)});
      }
    }
  }
  return out;
}

void PrintMacCosts(const Bench& bench) {
  const std::vector<MacCost> costs = MacCosts(bench);
  if (costs.empty()) return;
  std::printf("\nMAC check on get (worker/engine/document_mac.h), same stored values, same runs\n");
  std::printf(
      "(get+mac: MAC after each chunk's CRC-32C; get,mac: MAC instead of it, as workers do)\n");
  std::printf("%-52s %-8s %7s %9s %9s %9s\n", "system", "op", "clients", "get", "with mac", "cost");
  for (const MacCost& c : costs) {
    std::printf("%-52s %-8s %7d %9.2f %9.2f %8.1f%%\n", c.system.c_str(), c.op.c_str(), c.clients,
                c.get_gbps, c.mac_gbps, 100 * c.cost());
  }
}

// Each "... + token" row against the same op, clients and value size without: what the
// bearer token adds, (t_auth - t_plain) / t_plain = plain_gbps / auth_gbps - 1 (medians), and the
// same as time per call of one client (value_bytes * clients / GB/s).
struct AuthCost {
  std::string system;      // the row without authentication
  std::string credential;  // "token" or "certificate"
  std::string op;          // put or get
  int clients = 0;
  uint64_t value_bytes = 0;
  int calls_per_round = 1;
  double plain_gbps = 0, auth_gbps = 0;
  double sent_gbps = 0;  // the token sent to the shard that does not check it; 0: not measured
  double same_gbps = 0;  // the plain kind again in a second process (the control); 0: not measured
  double cost() const { return plain_gbps / auth_gbps - 1; }
  double sent_cost() const { return sent_gbps > 0 ? plain_gbps / sent_gbps - 1 : 0; }
  double same_cost() const { return same_gbps > 0 ? plain_gbps / same_gbps - 1 : 0; }
  double plain_us() const { return 1e-3 * static_cast<double>(value_bytes) * clients / plain_gbps; }
  double auth_us() const { return 1e-3 * static_cast<double>(value_bytes) * clients / auth_gbps; }
};
std::vector<AuthCost> AuthCosts(const Bench& bench) {
  std::vector<AuthCost> out;
  for (const Row& a : bench.rows()) {
    std::string credential;
    for (const char* c : {"token", "certificate"}) {
      if (absl::EndsWith(a.system, absl::StrCat(" + ", c))) credential = c;
    }
    if (a.gbps.empty() || credential.empty()) continue;
    const std::string plain = a.system.substr(0, a.system.size() - credential.size() - 3);
    for (const Row& p : bench.rows()) {
      if (p.system == plain && p.op == a.op && p.clients == a.clients &&
          p.value_bytes == a.value_bytes && !p.gbps.empty()) {
        const uint64_t bytes = a.value_bytes != 0 ? a.value_bytes : bench.size();
        AuthCost cost{plain, credential,        a.op,           a.clients,
                      bytes, a.calls_per_round, Median(p.gbps), Median(a.gbps)};
        for (const Row& u : bench.rows()) {
          if (u.system == a.system + ", unchecked" && u.op == a.op && u.clients == a.clients &&
              u.value_bytes == a.value_bytes && !u.gbps.empty()) {
            cost.sent_gbps = Median(u.gbps);
          }
          if (u.system == plain + ", second process" && u.op == a.op && u.clients == a.clients &&
              u.value_bytes == a.value_bytes && !u.gbps.empty()) {
            cost.same_gbps = Median(u.gbps);
          }
        }
        out.push_back(cost);
      }
    }
  }
  return out;
}

void PrintAuthCosts(const Bench& bench) {
  const std::vector<AuthCost> costs = AuthCosts(bench);
  if (costs.empty()) return;
  std::printf(
      "\nAuthentication (--auth_tokens_file; the worker's token, or with mTLS its certificate, on "
      "every\ncall) against none, same values; us/call: one client's time per call; unchecked: "
      "the token sent\nto the shard without --auth_tokens_file (the client's and the header's "
      "share); control: the\nunauthenticated kind again in a second process (what two identical "
      "kinds read apart)\n");
  std::printf("%-43s %-11s %-4s %7s %9s %9s %10s %10s %8s %10s %8s\n", "system", "credential", "op",
              "clients", "GB/s", "w/ auth", "us/call", "w/ auth", "cost", "unchecked", "control");
  const auto pct = [](bool measured, double fraction) {
    return measured ? absl::StrFormat("%.1f%%", 100 * fraction) : std::string("-");
  };
  for (const AuthCost& c : costs) {
    std::printf("%-43s %-11s %-4s %7d %9.4f %9.4f %10.1f %10.1f %7.1f%% %10s %8s\n",
                c.system.c_str(), c.credential.c_str(), c.op.c_str(), c.clients, c.plain_gbps,
                c.auth_gbps, c.plain_us(), c.auth_us(), 100 * c.cost(),
                pct(c.sent_gbps > 0, c.sent_cost()).c_str(),
                pct(c.same_gbps > 0, c.same_cost()).c_str());
  }
}

std::string ToJson(const Bench& bench, const std::vector<PassRow>& pass,
                   const std::map<std::string, std::string>& info, double total_seconds) {
  Json j;
  j = Json::object();
  j["benchmark"] = "kvstore_bench";
  for (const auto& [k, v] : info) j[k] = v;
  j["value_bytes"] = static_cast<int64_t>(bench.size());
  j["chunk_bytes"] = kDefaultChunkBytes;
  j["hardware_threads"] = std::thread::hardware_concurrency();
  j["total_seconds"] = total_seconds;
  Json& j1 = j["results"] = Json::array();
  for (const Row& r : bench.rows()) {
    Json& j2 = j1.emplace_back(Json::object());
    j2["system"] = r.system;
    j2["op"] = r.op;
    j2["clients"] = r.clients;
    if (r.value_bytes != 0) j2["value_bytes"] = static_cast<int64_t>(r.value_bytes);
    if (r.calls_per_round != 1) j2["calls_per_round"] = r.calls_per_round;
    if (r.gbps.empty()) {
      j2["skipped"] = r.note;
    } else {
      j2["median_gbps"] = Median(r.gbps);
      Json& j3 = j2["gbps"] = Json::array();
      for (double g : r.gbps) j3.push_back(g);
    }
  }
  Json& jp = j["mac_pass"] = Json::array();
  for (const PassRow& r : pass) {
    Json& e = jp.emplace_back(Json::object());
    e["data"] = r.data;
    e["check"] = r.check;
    e["threads"] = r.threads;
    if (r.gbps.empty()) {
      e["skipped"] = r.note;
    } else {
      e["median_gbps"] = Median(r.gbps);
      Json& g = e["gbps"] = Json::array();
      for (double x : r.gbps) g.push_back(x);
    }
  }
  Json& mac = j["mac_cost"] = Json::array();
  for (const MacCost& c : MacCosts(bench)) {
    Json& e = mac.emplace_back(Json::object());
    e["system"] = c.system;
    e["op"] = c.op;
    e["clients"] = c.clients;
    e["get_gbps"] = c.get_gbps;
    e["get_mac_gbps"] = c.mac_gbps;
    e["cost_fraction"] = c.cost();
  }
  Json& auth = j["auth_cost"] = Json::array();
  for (const AuthCost& c : AuthCosts(bench)) {
    Json& e = auth.emplace_back(Json::object());
    e["system"] = c.system;
    e["credential"] = c.credential;
    e["op"] = c.op;
    e["clients"] = c.clients;
    e["value_bytes"] = static_cast<int64_t>(c.value_bytes);
    e["calls_per_round"] = c.calls_per_round;
    e["gbps"] = c.plain_gbps;
    e["auth_gbps"] = c.auth_gbps;
    e["us_per_call"] = c.plain_us();
    e["auth_us_per_call"] = c.auth_us();
    e["cost_fraction"] = c.cost();
    if (c.sent_gbps > 0) {
      e["unchecked_gbps"] = c.sent_gbps;
      e["unchecked_cost_fraction"] = c.sent_cost();
    }
    if (c.same_gbps > 0) {
      e["control_gbps"] = c.same_gbps;
      e["control_cost_fraction"] = c.same_cost();
    }
  }
  return JsonDump(j) + "\n";
}

std::vector<int> ParseCounts(const std::string& list) {
  std::vector<int> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty() && std::atoi(item.c_str()) > 0) out.push_back(std::atoi(item.c_str()));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

int Main() {
  const auto started = Clock::now();
  const uint64_t size = uint64_t{static_cast<uint64_t>(absl::GetFlag(FLAGS_size_mib))} << 20;
  const std::vector<int> counts = ParseCounts(absl::GetFlag(FLAGS_clients));
  if (size == 0 || size > kMaxValueBytes || counts.empty()) {
    std::fprintf(stderr, "kvstore_bench: --size_mib must be 1..1024, --clients non-empty\n");
    return 2;
  }
  std::string tmp_root = absl::GetFlag(FLAGS_tmp_dir);
  if (tmp_root.empty()) tmp_root = std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp";
  std::string tmp = tmp_root + "/kvstore_bench.XXXXXX";
  if (mkdtemp(tmp.data()) == nullptr) {
    std::fprintf(stderr, "kvstore_bench: cannot create a directory under %s\n", tmp_root.c_str());
    return 1;
  }
  std::map<std::string, std::string> info;
  info["commit"] = absl::GetFlag(FLAGS_commit);
  info["cpu"] = FirstLineWith("/proc/cpuinfo", "model name");
  info["load_average_start"] = ReadFile("/proc/loadavg").substr(0, 14);
  info["memory_total"] = FirstLineWith("/proc/meminfo", "MemTotal");
  info["data_dir_root"] = tmp_root;

  std::fprintf(stderr, "kvstore_bench: %llu MiB values, clients %s, data under %s\n",
               static_cast<unsigned long long>(size >> 20), absl::GetFlag(FLAGS_clients).c_str(),
               tmp.c_str());
  const bool breakdown = absl::GetFlag(FLAGS_breakdown);
  const std::string only = absl::GetFlag(FLAGS_only);
  if (!only.empty() && only != "mac" && only != "auth") {
    std::fprintf(stderr, "kvstore_bench: --only %s: not mac or auth\n", only.c_str());
    return 2;
  }
  const bool mac_only = only == "mac", auth_only = only == "auth";
  const std::string gmac_impl = absl::GetFlag(FLAGS_gmac_impl);
  bool gmac_known = gmac_impl == "auto";
  for (GmacImpl impl : SupportedGmacImpls()) {
    if (gmac_impl == GmacImplName(impl)) SetAutoGmacImpl(impl), gmac_known = true;
  }
  if (!gmac_known) {
    std::fprintf(stderr,
                 "kvstore_bench: --gmac_impl %s: not auto or one this CPU runs (openssl, "
                 "vpclmulqdq-avx2, vpclmulqdq)\n",
                 gmac_impl.c_str());
    return 2;
  }
  info["gmac_impl"] = CheckName(AutoGmacImpl());
  const std::string binary = absl::GetFlag(FLAGS_kvstore_binary);
  std::string redis_version;
  {
    Bench bench(size, counts, std::max(1, absl::GetFlag(FLAGS_reps)),
                std::max(1, absl::GetFlag(FLAGS_reps_multi)));
    MeasureMemcpy(bench);
    std::vector<PassRow> pass;
    if ((absl::GetFlag(FLAGS_mac) && !auth_only) || mac_only) {
      pass = MeasureMacPass(size, std::max(1, absl::GetFlag(FLAGS_reps)), tmp + "/pass");
    }
    if (breakdown && only.empty()) {
      MeasureFreshCopy(bench);
      MeasureCrc(bench);
      MeasureDisk(bench, tmp + "/disk");
    }
    if (only.empty()) {
      MeasureEngine(bench, tmp + "/engine-sync", /*sync_commits=*/true, /*with_get=*/true);
      std::filesystem::remove_all(tmp + "/engine-sync");
    }
    if (breakdown && only.empty()) {
      MeasureEngine(bench, tmp + "/engine-nosync", /*sync_commits=*/false, /*with_get=*/false);
      std::filesystem::remove_all(tmp + "/engine-nosync");
    }
    for (bool fast_path : {true, false}) {
      if (auth_only || (mac_only && !fast_path)) continue;
      MeasureKvStoreProcess(bench, binary, tmp + "/kvstore-sync", true, /*with_get=*/true,
                            fast_path);
      std::filesystem::remove_all(tmp + "/kvstore-sync");
    }
    if (breakdown && only.empty()) {
      for (bool fast_path : {true, false}) {
        MeasureKvStoreProcess(bench, binary, tmp + "/kvstore-nosync", false, /*with_get=*/false,
                              fast_path);
        std::filesystem::remove_all(tmp + "/kvstore-nosync");
      }
      MeasureMemoryService(bench);
    }
    if ((absl::GetFlag(FLAGS_auth) && only.empty()) || auth_only) {
      const AuthenticateNs ns = MeasureAuthenticateNs(tmp + "/authenticate");
      info["authenticate_ns_per_call"] = absl::StrCat(static_cast<int64_t>(ns.token + 0.5));
      info["authenticate_certificate_ns_per_call"] =
          absl::StrCat(static_cast<int64_t>(ns.certificate + 0.5));
      std::fprintf(stderr,
                   "  TokenStore::Authenticate in-process: token %.0f ns, certificate %.0f ns a "
                   "call\n",
                   ns.token, ns.certificate);
      const std::string tls_dir = absl::GetFlag(FLAGS_auth_tls_dir);
      const bool tls = !tls_dir.empty() && access((tls_dir + "/worker.pem").c_str(), R_OK) == 0;
      if (!tls_dir.empty() && !tls) {
        std::fprintf(stderr, "  no %s/worker.pem: the mTLS authentication rows are skipped\n",
                     tls_dir.c_str());
      }
      for (const std::string& d :
           tls ? std::vector<std::string>{"", tls_dir} : std::vector<std::string>{""}) {
        MeasureAuth(bench, binary, tmp + "/kvstore-auth", size, 1,
                    absl::StrCat("kvstore gRPC (no sync), ", size >> 20, " MiB"), d);
        if (const int kib = absl::GetFlag(FLAGS_auth_small_kib); kib > 0) {
          const int calls = std::max(1, absl::GetFlag(FLAGS_auth_small_calls));
          MeasureAuth(bench, binary, tmp + "/kvstore-auth-small", uint64_t(kib) << 10, calls,
                      absl::StrCat("kvstore gRPC (no sync), ", kib, " KiB x", calls), d);
        }
      }
    }
    if (only.empty()) {
      MeasureRedis(bench, absl::GetFlag(FLAGS_redis_server), tmp + "/redis", &redis_version);
    }
    std::filesystem::remove_all(tmp);

    const double total = std::chrono::duration<double>(Clock::now() - started).count();
    info["redis_version"] = redis_version;
    info["load_average_end"] = ReadFile("/proc/loadavg").substr(0, 14);
    PrintTable(bench);
    PrintMacPass(pass);
    PrintMacCosts(bench);
    PrintAuthCosts(bench);
    if (info.count("authenticate_ns_per_call") != 0) {
      std::printf(
          "the shard's TokenStore::Authenticate alone, in-process: token %s ns, certificate %s "
          "ns a call\n",
          info["authenticate_ns_per_call"].c_str(),
          info["authenticate_certificate_ns_per_call"].c_str());
    }
    std::printf("total %.0f s; load average at start %s, at end %s\n", total,
                info["load_average_start"].c_str(), info["load_average_end"].c_str());
    const std::string out = absl::GetFlag(FLAGS_out);
    if (!out.empty()) {
      std::ofstream f(out);
      f << ToJson(bench, pass, info, total);
      if (!f) {
        std::fprintf(stderr, "kvstore_bench: cannot write %s\n", out.c_str());
        return 1;
      }
      std::printf("wrote %s\n", out.c_str());
    }
  }
  return 0;
}

}  // namespace
}  // namespace lazyrag::kvstore

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "kvstore_bench [--kvstore_binary PATH] [--redis_server PATH] [--out FILE] [--size_mib N]");
  absl::ParseCommandLine(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  return lazyrag::kvstore::Main();
}
