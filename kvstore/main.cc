// lazyrag-kvstore: one shard of the document-KV store.
//   lazyrag-kvstore --listen HOST:PORT --data_dir DIR --capacity_bytes N --metrics_port N
// Prints one line "lazyrag-kvstore ready grpc=HOST:PORT metrics=PORT" on stdout once serving
// (ports resolved when 0 was asked), then runs until SIGINT or SIGTERM.
#include <cstdio>
#include <iostream>
#include <memory>

#include "absl/flags/flag.h"
#include "absl/time/clock.h"
#include "common/auth_flags.h"
#include "common/binary_flags.h"
#include "common/logging.h"
#include "common/server_main.h"
#include "common/tls_flags.h"
#include "kvstore/kvstore_server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "gRPC address HOST:PORT; port 0 picks one");
ABSL_FLAG(std::string, data_dir, "", "RocksDB directory (created when missing); required");
ABSL_FLAG(uint64_t, capacity_bytes, 64ull << 30,
          "byte capacity; least recently used values are evicted beyond it");
ABSL_FLAG(int, metrics_port, 0, "port of the /metrics endpoint; 0 picks one, -1 disables");
ABSL_FLAG(std::string, metrics_host, "127.0.0.1",
          "address the /metrics endpoint binds (loopback by default; 0.0.0.0 or :: to be scraped)");
ABSL_FLAG(bool, sync_commits, true,
          "fdatasync every value file and fsync the write-ahead log on every committed put");
ABSL_FLAG(uint64_t, index_write_buffer_bytes, 16 << 20,
          "RocksDB memtable bytes of the index; small values flush and compact often (tests)");
ABSL_FLAG(bool, local_clients, true,
          "serve same-host clients through files in --data_dir (they need this process's user)");
ABSL_FLAG(double, shutdown_grace_s, 10, "seconds running calls get to finish at shutdown");

int main(int argc, char** argv) {
  const lazyrag::BinaryCommandLine command_line = lazyrag::ParseBinaryCommandLine(
      argc, argv, "lazyrag-kvstore",
      "lazyrag-kvstore --listen HOST:PORT --data_dir DIR --capacity_bytes N --metrics_port N");
  if (command_line.exit_code >= 0) return command_line.exit_code;

  lazyrag::kvstore::KvStoreServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.capacity_bytes = absl::GetFlag(FLAGS_capacity_bytes);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.metrics_host = absl::GetFlag(FLAGS_metrics_host);
  options.sync_commits = absl::GetFlag(FLAGS_sync_commits);
  options.index_write_buffer_bytes = absl::GetFlag(FLAGS_index_write_buffer_bytes);
  options.tls = lazyrag::TlsFilesFromFlags();
  options.auth_tokens_file = lazyrag::AuthFilesFromFlags().tokens_file;
  options.local_clients = absl::GetFlag(FLAGS_local_clients);
  if (options.data_dir.empty()) {
    std::cerr << "lazyrag-kvstore: --data_dir is required\n";
    return 2;
  }

  return lazyrag::RunServerUntilSignal(
      "lazyrag-kvstore", [&] { return std::make_unique<lazyrag::kvstore::KvStoreServer>(options); },
      absl::Seconds(absl::GetFlag(FLAGS_shutdown_grace_s)));
}
