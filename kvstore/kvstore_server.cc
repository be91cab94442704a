#include "kvstore/kvstore_server.h"

#include <fcntl.h>

#include <cerrno>
#include <cstdio>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/auth_flags.h"
#include "common/file_io.h"
#include "common/grpc_server.h"
#include "common/logging.h"
#include "common/metrics_http.h"
#include "common/status.h"
#include "kvstore/kvstore_handler.h"
#include "kvstore/kvstore_metrics.h"
#include "kvstore/kvstore_service.h"

namespace lazyrag::kvstore {
namespace {

// A fresh random token in <dir>/local-token (written whole, then renamed): a client that reads
// the token Describe names there sees this process's filesystem.
absl::StatusOr<std::string> WriteLocalToken(const std::string& dir) {
  std::random_device rd;
  const std::string token = absl::StrCat(absl::Hex(uint64_t{rd()} << 32 | rd(), absl::kZeroPad16),
                                         absl::Hex(uint64_t{rd()} << 32 | rd(), absl::kZeroPad16));
  const std::string path = dir + "/local-token", tmp = path + ".tmp";
  {
    ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600));
    RETURN_IF_ERROR(PwriteAll(fd.get(), token, 0));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return ErrnoStatus(errno, absl::StrCat("renaming ", tmp));
  }
  return token;
}

}  // namespace

KvStoreServer::KvStoreServer(KvStoreServerOptions options, EngineFactory engine_factory)
    : options_(std::move(options)), engine_factory_(std::move(engine_factory)) {
  metrics_ = std::make_unique<KvStoreMetrics>(&registry_);
}

KvStoreServer::~KvStoreServer() { Shutdown(absl::Now()); }

absl::Status KvStoreServer::Start() {
  if (engine_ != nullptr) return absl::FailedPreconditionError("kvstore server already started");
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   ServerCredentialsFor(options_.tls));
  if (engine_factory_) {
    ASSIGN_OR_RETURN(engine_, engine_factory_(metrics_.get()));
  } else {
    RocksEngineOptions engine_options;
    engine_options.data_dir = options_.data_dir;
    engine_options.capacity_bytes = options_.capacity_bytes;
    engine_options.sync_commits = options_.sync_commits;
    engine_options.index_write_buffer_bytes = options_.index_write_buffer_bytes;
    engine_options.metrics = metrics_.get();
    ASSIGN_OR_RETURN(engine_, OpenRocksEngine(engine_options));
  }
  metrics_->capacity_bytes().Set(static_cast<double>(engine_->Usage().capacity_bytes));
  handler_ = std::make_unique<KvStoreHandler>(engine_.get(), metrics_.get());
  if (options_.local_clients && !engine_->local_dir().empty()) {
    ASSIGN_OR_RETURN(std::string token, WriteLocalToken(engine_->local_dir()));
    handler_->EnableLocalClients(engine_->local_dir(), std::move(token));
  }
  ASSIGN_OR_RETURN(tokens_, OpenTokenStore(options_.auth_tokens_file, &auth_metrics_));
  service_ = std::make_unique<KvStoreService>(handler_.get(), tokens_.get());

  GrpcServerOptions grpc_options;
  grpc_options.listen = options_.listen;
  grpc_options.max_receive_message_bytes = kMaxMessageBytes;
  grpc_options.max_send_message_bytes = kMaxMessageBytes;
  grpc_options.credentials = std::move(credentials);
  grpc_ = std::make_unique<GrpcServer>(grpc_options);
  grpc_->AddService(service_.get());
  RETURN_IF_ERROR(grpc_->Start());

  if (options_.metrics_port >= 0) {
    http_ = std::make_unique<metrics::MetricsHttpServer>(
        &registry_, metrics::MetricsHttpOptions{options_.metrics_host, options_.metrics_port});
    absl::Status st = http_->Start();
    if (!st.ok()) {
      grpc_->Shutdown(absl::Now());
      return st;
    }
  }
  const EngineUsage usage = engine_->Usage();
  LOG_INFO.With("grpc", grpc_->address())
          .With("metrics_port", metrics_port())
          .With("data_dir", options_.data_dir)
          .With("capacity_bytes", usage.capacity_bytes)
          .With("used_bytes", usage.bytes)
          .With("entries", usage.entries)
          .With("sync_commits", options_.sync_commits)
          .With("tls", options_.tls.enabled())
          .With("local_clients", options_.local_clients && !engine_->local_dir().empty())
      << "lazyrag-kvstore: serving";
  return absl::OkStatus();
}

void KvStoreServer::Shutdown(absl::Time deadline) {
  if (grpc_ != nullptr) grpc_->Shutdown(deadline);
  if (http_ != nullptr) http_->Stop();
  // Every call has returned: nothing uses the engine any more.
  grpc_.reset();
  http_.reset();
  service_.reset();
  handler_.reset();
  engine_.reset();
}

int KvStoreServer::port() const { return grpc_ != nullptr ? grpc_->port() : 0; }
std::string KvStoreServer::address() const { return grpc_ != nullptr ? grpc_->address() : ""; }
int KvStoreServer::metrics_port() const { return http_ != nullptr ? http_->port() : -1; }

}  // namespace lazyrag::kvstore
