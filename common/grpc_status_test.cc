#include "common/grpc_status.h"

#include <gtest/gtest.h>

#include "common/grpc_server.h"

namespace lazyrag {
namespace {

TEST(GrpcStatusTest, RoundTripsEveryCanonicalCode) {
  for (int code = 0; code <= 16; ++code) {
    absl::Status s(static_cast<absl::StatusCode>(code), code == 0 ? "" : "msg");
    grpc::Status g = ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), code);
    EXPECT_EQ(FromGrpcStatus(g), s);
  }
  EXPECT_EQ(ToGrpcStatus(absl::Status(static_cast<absl::StatusCode>(99), "x")).error_code(),
            grpc::StatusCode::UNKNOWN);
}

TEST(GrpcServerTest, ParseHostPort) {
  auto a = ParseHostPort("127.0.0.1:50051");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 50051);
  auto b = ParseHostPort("[::1]:0");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "::1");
  auto c = ParseHostPort(":7");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->host, "");
  for (const char* bad : {"", "host", "host:", "host:x", "host:70000", "::1:5", "[::1]5"}) {
    EXPECT_EQ(ParseHostPort(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(GrpcServerTest, PicksPortAndShutsDown) {
  GrpcServerOptions options;
  options.listen = "127.0.0.1:0";
  GrpcServer server(options);
  ASSERT_TRUE(server.Start().ok());
  EXPECT_GT(server.port(), 0);
  EXPECT_EQ(server.address(), "127.0.0.1:" + std::to_string(server.port()));
  options.listen = "nonsense";
  GrpcServer bad(options);
  EXPECT_EQ(bad.Start().code(), absl::StatusCode::kInvalidArgument);
  server.Shutdown(absl::Now() + absl::Seconds(1));
  server.Shutdown(absl::Now());  // idempotent
}

}  // namespace
}  // namespace lazyrag
