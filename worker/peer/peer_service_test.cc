// The PeerDocuments service (peer_service.h) on its own: bad input to GetDocument over gRPC, and
// the fast path's lease table (grant, release, expiry, bad input, a pool that cannot be lent)
// over a fake lender, no engine. Part of peer_test.
#include "worker/peer/peer_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_server.h"
#include "common/metrics.h"
#include "gtest/gtest.h"
#include "worker/peer/peer_test_util.h"

namespace lazyrag::peer_test {
namespace {

grpc::Status CallPeer(const std::string &address, const v1::PeerGetRequest &req,
                      int *messages = nullptr) {
  auto stub =
      v1::PeerDocuments::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto reader = stub->GetDocument(&ctx, req);
  v1::PeerGetResponse m;
  int n = 0;
  while (reader->Read(&m)) ++n;
  if (messages != nullptr) *messages = n;
  return reader->Finish();
}

TEST(PeerServiceTest, BadInputGetsAClearStatus) {
  PeerServiceOptions o;
  o.max_concurrent = 1;
  FakePeer p(o);
  p.Add("d", StoredDocument{"m", "bytes", ""});
  v1::PeerGetRequest good;
  good.set_model_fingerprint(kFingerprint);
  good.set_document_id("d");
  auto expect = [&](const v1::PeerGetRequest &r, grpc::StatusCode code, const std::string &what) {
    int messages = -1;
    grpc::Status st = CallPeer(p.address(), r, &messages);
    EXPECT_EQ(st.error_code(), code) << what << ": " << st.error_message();
    EXPECT_FALSE(st.error_message().empty()) << what;
    EXPECT_EQ(messages, 0) << what;
  };
  int messages = 0;
  ASSERT_TRUE(CallPeer(p.address(), good, &messages).ok());
  EXPECT_EQ(messages, 2);  // header + one chunk
  v1::PeerGetRequest r = good;
  r.clear_document_id();
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "empty id");
  r = good;
  r.set_document_id(std::string(300, 'a'));
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "long id");
  r = good;
  r.clear_model_fingerprint();
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "empty fingerprint");
  r = good;
  r.set_chunk_size(5 << 20);
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "chunk above 4 MiB");
  r = good;
  r.set_model_fingerprint("another-model");
  expect(r, grpc::StatusCode::FAILED_PRECONDITION, "other model");
  r = good;
  r.set_document_id("absent");
  expect(r, grpc::StatusCode::NOT_FOUND, "not resident");
  // One transfer at a time here: a second one meanwhile is RESOURCE_EXHAUSTED.
  absl::Notification release;
  p.BlockExports(&release);
  const int before = p.calls.load();
  std::thread first([&] { EXPECT_TRUE(CallPeer(p.address(), good).ok()); });
  while (p.calls.load() == before) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  expect(good, grpc::StatusCode::RESOURCE_EXHAUSTED, "busy");
  release.Notify();
  first.join();
}

// --- The fast path's lease table (no engine). ---

// A lender over a set of resident ids that counts pins.
struct FakeLender {
  absl::Mutex mu;
  std::map<std::string, int> pins;
  absl::Status pool_status = absl::OkStatus();
  DocumentLender Lender(const std::vector<std::string> &resident) {
    DocumentLender l;
    l.pool = [this]() -> absl::StatusOr<PeerPoolHandle> {
      if (!pool_status.ok()) return pool_status;
      PeerPoolHandle h;
      h.ipc_handle = "handle";
      h.num_layers = 2;
      h.num_pages = 8;
      h.page_size = 4;
      h.kv_dim = 8;
      h.elem_bytes = 2;
      return h;
    };
    l.pin = [this, resident](const std::string &id) -> absl::StatusOr<LentDocument> {
      if (std::find(resident.begin(), resident.end(), id) == resident.end()) {
        return absl::NotFoundError("not resident");
      }
      absl::MutexLock lock(&mu);
      ++pins[id];
      return LentDocument{{3, 5}, 6, {1, 2, 3, 4, 5, 6}};
    };
    l.unpin = [this](const std::string &id) {
      absl::MutexLock lock(&mu);
      --pins[id];
    };
    return l;
  }
  int Pins(const std::string &id) {
    absl::MutexLock lock(&mu);
    return pins[id];
  }
};

v1::PeerLeaseRequest LeaseRequest(const std::string &id, uint32_t ms = 0) {
  v1::PeerLeaseRequest r;
  r.set_model_fingerprint(kFingerprint);
  r.set_document_id(id);
  r.set_lease_ms(ms);
  return r;
}

TEST(PeerLeaseTest, GrantReleaseAndBadInput) {
  FakeLender fl;
  PeerServiceOptions o;
  o.model_fingerprint = kFingerprint;
  o.max_leases = 2;
  metrics::Registry reg;
  o.registry = &reg;
  PeerDocumentsService svc([](const std::string &) { return absl::NotFoundError("x"); }, o,
                           fl.Lender({"d"}));
  v1::PeerPoolRequest pr;
  pr.set_model_fingerprint(kFingerprint);
  auto pool = svc.Pool(pr);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->ipc_handle(), "handle");
  EXPECT_EQ(pool->page_size(), 4u);
  pr.set_model_fingerprint("other");
  EXPECT_EQ(svc.Pool(pr).status().code(), absl::StatusCode::kFailedPrecondition);
  pr.clear_model_fingerprint();
  EXPECT_EQ(svc.Pool(pr).status().code(), absl::StatusCode::kInvalidArgument);

  auto lease = svc.Lease(LeaseRequest("d"));
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_NE(lease->lease_id(), 0u);
  EXPECT_EQ(lease->expires_in_ms(), 10000u);
  EXPECT_EQ(lease->num_tokens(), 6u);
  EXPECT_EQ(lease->pages_size(), 2);
  EXPECT_EQ(lease->token_ids_size(), 6);
  EXPECT_EQ(lease->pool().ipc_handle(), "handle");
  EXPECT_EQ(fl.Pins("d"), 1);
  EXPECT_EQ(svc.leases(), 1);
  EXPECT_EQ(Metric(reg, "lazyrag_worker_peer_leases_outstanding"), 1);
  // Bad input and refusals pin nothing.
  auto code = [&](const v1::PeerLeaseRequest &r) { return svc.Lease(r).status().code(); };
  EXPECT_EQ(code(LeaseRequest("absent")), absl::StatusCode::kNotFound);
  EXPECT_EQ(code(LeaseRequest("")), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(LeaseRequest(std::string(300, 'a'))), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(LeaseRequest("d", 60001)), absl::StatusCode::kInvalidArgument);
  v1::PeerLeaseRequest other = LeaseRequest("d");
  other.set_model_fingerprint("other");
  EXPECT_EQ(code(other), absl::StatusCode::kFailedPrecondition);
  other.clear_model_fingerprint();
  EXPECT_EQ(code(other), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fl.Pins("d"), 1);
  // max_leases = 2.
  auto second = svc.Lease(LeaseRequest("d"));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(code(LeaseRequest("d")), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(fl.Pins("d"), 2);
  // Release: once each; unknown and 0 are refused.
  EXPECT_TRUE(svc.Release(lease->lease_id()).ok());
  EXPECT_EQ(fl.Pins("d"), 1);
  EXPECT_EQ(svc.Release(lease->lease_id()).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(svc.Release(987654).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(svc.Release(0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fl.Pins("d"), 1);
  // The destructor unpins what is left (here: StopLeases, then new leases are UNAVAILABLE).
  svc.StopLeases();
  EXPECT_EQ(fl.Pins("d"), 0);
  EXPECT_EQ(code(LeaseRequest("d")), absl::StatusCode::kUnavailable);
  EXPECT_EQ(fl.Pins("d"), 0);
}

TEST(PeerLeaseTest, ExpiredLeaseIsUnpinnedAndUnknownAfterwards) {
  FakeLender fl;
  PeerServiceOptions o;
  o.model_fingerprint = kFingerprint;
  metrics::Registry reg;
  o.registry = &reg;
  PeerDocumentsService svc([](const std::string &) { return absl::NotFoundError("x"); }, o,
                           fl.Lender({"d"}));
  auto short_lease = svc.Lease(LeaseRequest("d", 100));
  auto long_lease = svc.Lease(LeaseRequest("d", 30000));
  ASSERT_TRUE(short_lease.ok() && long_lease.ok());
  EXPECT_EQ(short_lease->expires_in_ms(), 100u);
  EXPECT_EQ(fl.Pins("d"), 2);
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (fl.Pins("d") != 1 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(fl.Pins("d"), 1);  // the short one expired; the long one holds
  EXPECT_EQ(svc.leases(), 1);
  EXPECT_EQ(svc.Release(short_lease->lease_id()).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Metric(reg, "lazyrag_worker_peer_leases_total{result=\"expired\"}"), 1);
  EXPECT_TRUE(svc.Release(long_lease->lease_id()).ok());
  EXPECT_EQ(fl.Pins("d"), 0);
}

TEST(PeerLeaseTest, PoolThatCannotBeLentOverGrpc) {
  // No lender at all (a service built for bytes only), and a lender whose pool is refused (the
  // CPU backend: UNIMPLEMENTED; tensor parallelism: FAILED_PRECONDITION).
  for (int variant = 0; variant < 3; ++variant) {
    FakeLender fl;
    fl.pool_status = variant == 1 ? absl::UnimplementedError("cpu backend")
                                  : absl::FailedPreconditionError("tensor parallel");
    PeerServiceOptions o;
    o.model_fingerprint = kFingerprint;
    auto svc = variant == 0 ? std::make_unique<PeerDocumentsService>(
                                  [](const std::string &) { return absl::NotFoundError("x"); }, o)
                            : std::make_unique<PeerDocumentsService>(
                                  [](const std::string &) { return absl::NotFoundError("x"); }, o,
                                  fl.Lender({"d"}));
    GrpcServer server{GrpcServerOptions{}};
    server.AddService(svc.get());
    ASSERT_TRUE(server.Start().ok());
    auto stub = v1::PeerDocuments::NewStub(
        grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
    const grpc::StatusCode want =
        variant == 2 ? grpc::StatusCode::FAILED_PRECONDITION : grpc::StatusCode::UNIMPLEMENTED;
    {
      grpc::ClientContext ctx;
      v1::PeerPoolRequest req;
      req.set_model_fingerprint(kFingerprint);
      v1::PeerPool resp;
      grpc::Status st = stub->GetPool(&ctx, req, &resp);
      EXPECT_EQ(st.error_code(), want) << variant << ": " << st.error_message();
      EXPECT_FALSE(st.error_message().empty());
    }
    {
      grpc::ClientContext ctx;
      v1::PeerLease resp;
      grpc::Status st = stub->LeaseDocument(&ctx, LeaseRequest("d"), &resp);
      EXPECT_EQ(st.error_code(), want) << variant << ": " << st.error_message();
    }
    {
      grpc::ClientContext ctx;
      v1::PeerReleaseRequest req;
      req.set_lease_id(42);
      v1::PeerReleaseResponse resp;
      grpc::Status st = stub->ReleaseLease(&ctx, req, &resp);
      EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message();
    }
    EXPECT_EQ(fl.Pins("d"), 0);
    server.Shutdown(absl::Now());
  }
}

}  // namespace
}  // namespace lazyrag::peer_test
